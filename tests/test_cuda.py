"""CUDA-only behaviour: streams, CUDA graphs, several GPUs, more than 2^31 elements.
Skipped cleanly where there is no GPU (or no CUDA build of the library)."""
import pytest
import torch

import pyroundlib
from pyroundlib.reference import lltm_cell_reference

from conftest import requires_cuda, requires_two_gpus

pytestmark = requires_cuda


def lltm_inputs(batch, features, state, device="cuda", dtype=torch.float32):
    shapes = [(batch, features), (3 * state, state + features), (3 * state,), (batch, state), (batch, state)]
    return [torch.randn(s, device=device, dtype=dtype) for s in shapes]


def test_runs_on_the_current_stream():
    """The producer of x is held back on a side stream; if the kernel ran on any other
    stream it would read x before it was written.  Only that stream is synchronised."""
    side = torch.cuda.Stream()
    data = torch.randn(1 << 20, device="cuda") * 4
    args = lltm_inputs(64, 32, 128)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x = torch.zeros_like(data)
        lltm_args = [torch.zeros_like(a) for a in args]
        torch.cuda._sleep(100_000_000)  # ~50 ms of GPU time on this stream
        x.copy_(data)
        for dst, src in zip(lltm_args, args):
            dst.copy_(src)
        y = pyroundlib.round_ste(x)
        h, c = pyroundlib.lltm_cell(*lltm_args)
    side.synchronize()  # this stream only, no device-wide sync
    assert torch.equal(y, torch.round(data))
    rh, rc = lltm_cell_reference(*args)
    torch.testing.assert_close(h, rh)
    torch.testing.assert_close(c, rc)


def test_backward_on_a_side_stream():
    side = torch.cuda.Stream()
    args = [a.requires_grad_() for a in lltm_inputs(16, 8, 32)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(50_000_000)
        h, c = pyroundlib.lltm_cell(*args)
        grads = torch.autograd.grad(h.sum() + 2 * c.sum(), args)
    side.synchronize()
    rh, rc = lltm_cell_reference(*ref_args)
    ref_grads = torch.autograd.grad(rh.sum() + 2 * rc.sum(), ref_args)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_cuda_graph_capture_and_replay():
    x = torch.randn(4096, device="cuda") * 3
    args = lltm_inputs(8, 16, 32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up outside the capture, as torch.cuda.graphs advises
        pyroundlib.round_ste(x)
        pyroundlib.lltm_cell(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = pyroundlib.round_ste(x)
        h, c = pyroundlib.lltm_cell(*args)
    for _ in range(3):
        x.copy_(torch.randn_like(x) * 3)
        for a in args:
            a.copy_(torch.randn_like(a))
        graph.replay()
        torch.cuda.current_stream().synchronize()
        assert torch.equal(y, torch.round(x))
        rh, rc = lltm_cell_reference(*args)
        torch.testing.assert_close(h, rh)
        torch.testing.assert_close(c, rc)


def test_cuda_graph_of_a_training_step():
    cell = pyroundlib.LLTM(16, 32).cuda()
    x, h, c = (torch.randn(8, n, device="cuda") for n in (16, 32, 32))
    loss_fn = lambda: (pyroundlib.round_ste(torch.sigmoid(cell(x, (h, c))[0])).sum())  # noqa: E731
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        loss_fn().backward()
    torch.cuda.current_stream().wait_stream(side)
    cell.zero_grad(set_to_none=False)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = loss_fn()
        loss.backward()
    cell.zero_grad(set_to_none=False)
    graph.replay()
    torch.cuda.synchronize()
    w_grad = cell.weights.grad.clone()
    ref = cell.weights.detach().clone().requires_grad_()
    rh, _ = lltm_cell_reference(x, ref, cell.bias.detach(), h, c)
    (torch.round(torch.sigmoid(rh)) - torch.sigmoid(rh)).detach().add(torch.sigmoid(rh)).sum().backward()
    torch.testing.assert_close(w_grad, ref.grad)


@requires_two_gpus
def test_second_device_while_first_is_current():
    torch.cuda.set_device(0)
    x = torch.randn(10000, device="cuda:1") * 5
    args = lltm_inputs(8, 16, 32, device="cuda:1")
    with torch.cuda.stream(torch.cuda.Stream("cuda:1")):  # a current stream on cuda:1 that is not its default
        y = pyroundlib.round_ste(x)
        h, c = pyroundlib.lltm_cell(*args)
    torch.cuda.synchronize(1)
    assert torch.cuda.current_device() == 0  # the library restored the caller's device
    assert y.device == torch.device("cuda:1")
    assert torch.equal(y, torch.round(x))
    rh, rc = lltm_cell_reference(*args)
    torch.testing.assert_close(h, rh)
    torch.testing.assert_close(c, rc)


def test_more_than_2_31_elements():
    n = 2**31 + 4099
    free, _ = torch.cuda.mem_get_info()
    if free < 3 * 2 * n + (1 << 30):
        pytest.skip("needs ~13 GiB of free GPU memory")
    x = torch.empty(n, device="cuda", dtype=torch.float16)
    x.uniform_(-100, 100)
    x[-4096:] = torch.arange(4096, device="cuda", dtype=torch.float16) / 4 - 512  # ties near the end
    y = pyroundlib.round_ste(x)
    assert torch.equal(y, torch.round(x))  # all elements, including those past 2^31
    del x, y
    torch.cuda.empty_cache()


def test_lltm_64_bit_indexing():
    """batch * 3 * state past 2^32: the kernels switch to 64-bit indices."""
    batch, state = 1_450_000, 1024  # 1.48e9 cell elements, 4.45e9 gate elements
    free, _ = torch.cuda.mem_get_info()
    if free < 2 * batch * state * 12 + (2 << 30):
        pytest.skip("needs ~40 GiB of free GPU memory")
    gates = torch.empty(batch, 3 * state, device="cuda", dtype=torch.float16).uniform_(-3, 3)
    old_cell = torch.empty(batch, state, device="cuda", dtype=torch.float16).uniform_(-1, 1)
    h, c = torch.ops.pyroundlib.lltm_forward(gates, old_cell)
    tail = slice(batch - 3, batch)  # rows whose indices overflow 32 bits
    eh, ec = torch.ops.pyroundlib.lltm_forward(gates[tail].clone(), old_cell[tail].clone())
    assert torch.equal(h[tail], eh) and torch.equal(c[tail], ec)
    del h, c
    dg, dc, _ = torch.ops.pyroundlib.lltm_backward(None, old_cell, gates, old_cell)
    edg, edc, _ = torch.ops.pyroundlib.lltm_backward(None, old_cell[tail].clone(), gates[tail].clone(),
                                                  old_cell[tail].clone())
    assert torch.equal(dg[tail], edg) and torch.equal(dc[tail], edc)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("batch", [3, 64, 256, 512, 1024])
def test_pointwise_kernels_at_every_vector_width(dtype, batch):
    """The pointwise kernels take 1 to 16 / sizeof(dtype) columns a thread, fewer where a
    launch would have few threads: with state 1024, batch 3 and 64 run one column a thread,
    256, 512 and 1024 two, four and eight (as far as 16 bytes allow).  Every width: every
    element written and equal to the float64 math on the same (rounded) inputs."""
    from pyroundlib import _common
    state, code = 1024, _common.DTYPE_CODES[dtype]
    gates = (torch.randn(batch, 3 * state, device="cuda") * 2).to(dtype)
    old_cell, grad_h, grad_cell = (torch.randn(batch, state, device="cuda").to(dtype) for _ in range(3))
    new_h, new_cell, d_cell = (torch.full_like(old_cell, float("nan")) for _ in range(3))
    d_gates = torch.full_like(gates, float("nan"))
    _common.Kernel("lltm_forward")(gates, gates.data_ptr(), old_cell.data_ptr(), new_h.data_ptr(),
                                   new_cell.data_ptr(), batch, state, code)
    _common.Kernel("lltm_backward")(gates, grad_h.data_ptr(), grad_cell.data_ptr(), gates.data_ptr(),
                                    old_cell.data_ptr(), d_gates.data_ptr(), d_cell.data_ptr(), None, batch, state,
                                    code)
    g64, c64 = gates.double().requires_grad_(), old_cell.double().requires_grad_()
    i, o, z = g64.chunk(3, dim=1)
    rc = c64 + torch.nn.functional.elu(z) * torch.sigmoid(i)
    rh = torch.tanh(rc) * torch.sigmoid(o)
    rdg, rdc = torch.autograd.grad((rh, rc), (g64, c64), (grad_h.double(), grad_cell.double()))
    # 16-bit: one rounding of the float result (half an ulp) and float's own error
    eps = torch.finfo(dtype).eps
    close = {torch.float64: dict(rtol=1e-12, atol=1e-12), torch.float32: dict(rtol=1e-5, atol=1e-5)}.get(
        dtype, dict(rtol=eps, atol=eps))
    for name, got, want in (("new_h", new_h, rh), ("new_cell", new_cell, rc), ("d_gates", d_gates, rdg),
                            ("d_old_cell", d_cell, rdc)):
        assert not torch.isnan(got).any(), f"{name}: elements not written"
        torch.testing.assert_close(got.double(), want.detach(), **close, msg=lambda m: f"{name}: {m}")


def test_upload_in_stream_order_and_into_a_graph():
    """prl_upload_cuda (a pack's sizes reach the GPU so): more values than one launch carries,
    on a busy stream; and captured into a CUDA graph, whose replay writes the values as they
    were at capture, whatever the host array holds by then."""
    from pyroundlib._packed import _upload_kernel
    host = torch.randint(-2**62, 2**62, (1500,), dtype=torch.int64)
    dst = torch.zeros(1500, dtype=torch.int64, device="cuda")
    torch.cuda._sleep(10_000_000)  # the copy must wait for the stream, not race ahead of it
    dst.fill_(7)
    _upload_kernel(dst, dst.data_ptr(), host.data_ptr(), len(host))
    assert torch.equal(dst.cpu(), host)
    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph, stream=stream):
        _upload_kernel(dst, dst.data_ptr(), host.data_ptr(), 1000)
    want = host.clone()
    host.fill_(0)
    dst.fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(dst[:1000].cpu(), want[:1000]) and (dst[1000:] == -1).all()


def test_packed_step_loop_refuses_bad_arguments():
    """prl_lltm_packed_steps_forward_cuda / _backward_cuda (a pack's step loop over torch's
    cuBLAS): a pack's sizes that grow, start past the batch or are zero, a missing cuBLAS or
    handle, a third direction and the backward's parts that do not fit are refused with an error naming the argument, before
    anything is launched."""
    import ctypes

    from pyroundlib import _cublas
    from pyroundlib._packed import _steps_backward_kernel, _steps_forward_kernel
    t = torch.zeros(1024, device="cuda")
    gemm, handle, tf32 = _cublas.for_tensor(t)
    p = t.data_ptr()
    for sizes, match in (((2, 3, 1), "batch_sizes\\[1\\] = 3"), ((4, 1), "batch_sizes\\[0\\] = 4"),
                         ((3, 0), "batch_sizes\\[1\\] = 0")):
        array = (ctypes.c_int64 * len(sizes))(*sizes)
        with pytest.raises(ValueError, match=match):
            _steps_forward_kernel(t, gemm, handle, tf32, p, p, 4, 0, p, p, p, p, array, len(sizes), 3, 4, 1, 0)
        with pytest.raises(ValueError, match=match):
            _steps_backward_kernel(t, gemm, handle, tf32, p, p, p, 4, 0, p, p, p, p, p, p, p, array, len(sizes), 3, 4,
                                   1, 1, 0)
    array = (ctypes.c_int64 * 2)(3, 2)
    for args, match in (((None, handle), "'gemm' is NULL"), ((gemm, None), "'handle' is NULL")):
        with pytest.raises(ValueError, match=match):
            _steps_forward_kernel(t, *args, tf32, p, p, 4, 0, p, p, p, p, array, 2, 3, 4, 1, 0)
    with pytest.raises(ValueError, match="'directions' must be 1 or 2, got 3"):
        _steps_forward_kernel(t, gemm, handle, tf32, p, p, 4, 48, p, p, p, p, array, 2, 3, 4, 3, 0)
    with pytest.raises(ValueError, match="'w_stride'"):
        _steps_forward_kernel(t, gemm, handle, tf32, p, p, 4, 4, p, p, p, p, array, 2, 3, 4, 2, 0)
    # the backward's parts: 1 to 64 dividing 3 * state; with two directions their W_h back to back
    for directions, w_stride, parts, match in ((1, 0, 0, "'parts' \\(0\\)"), (1, 0, 5, "'parts' \\(5\\)"),
                                               (1, 0, 96, "'parts' \\(96\\)"), (2, 60, 2, "'w_stride' \\(60\\)")):
        with pytest.raises(ValueError, match=match):
            _steps_backward_kernel(t, gemm, handle, tf32, p, p, p, 4, w_stride, p, p, p, p, p, p, p, array, 2, 3, 4,
                                   directions, parts, 0)
    assert torch.equal(t, torch.zeros_like(t))
