"""lltm_sequence / LLTMLayer against a loop of the plain-PyTorch cell: forward, every
gradient, the workflows (torch.func, double backward, autocast, torch.compile) and, on a
GPU, streams, CUDA graphs and the per-shape graph replay."""
import contextlib
import ctypes
import math
from pathlib import Path

import pytest
import torch

import pyroundlib
from pyroundlib import _threads, graphs, sequence
from pyroundlib.reference import lltm_cell_reference

from conftest import CUDA, TOLERANCES, capture_after_warm_up, requires_cuda, requires_two_gpus, run_python_ok

func = torch.func
ARGNUMS = (0, 1, 2, 3, 4)


ROUTES = {"steps": "0", "fused": "fused"}  # the route suffix -> PYROUNDLIB_PERSISTENT_SEQUENCE; none: "1"


@pytest.fixture(params=["cpu", "cpu-own", "cpu-steps"] + (["cuda", "cuda-steps", "cuda-fused"] if CUDA else []))
def device(request, monkeypatch):
    """Every route on each device: "cpu" / "cuda" run the recurrence in one library call per
    direction (the CPU loop, its products by torch's BLAS where it exports one; the persistent
    kernels wherever they fit, every size these tests use), "cpu-own" the CPU loop with the
    library's own product, "cpu-steps" / "cuda-steps" step by step from Python (the loops,
    graphs.py), "cuda-fused" the whole sequence, products included, in the fused kernels."""
    name, _, route = request.param.partition("-")
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, ROUTES.get(route, "1"))
    if route == "own":
        with own_product():
            yield torch.device(name)
    else:
        yield torch.device(name)


@contextlib.contextmanager
def own_product():
    """The CPU loop multiplies with the library's own product, not torch's BLAS."""
    lib = pyroundlib._ffi.library()
    _threads.follow_torch()  # looks for the BLAS first, so that it is not handed over inside the block
    lib.prl_set_cpu_gemm(None, None)
    try:
        yield
    finally:
        lib.prl_set_cpu_gemm(*_threads._given["gemm"])


def reference(input, weights, bias, h0, c0):
    """(output, h_n, c_n): the plain-PyTorch cell in a Python loop."""
    h, c, outs = h0, c0, []
    for x in input.unbind(0):
        h, c = lltm_cell_reference(x, weights, bias, h, c)
        outs.append(h)
    return (torch.stack(outs) if outs else input.new_empty(0, *h0.shape)), h, c


def ours(input, weights, bias, h0, c0):
    output, (h, c) = pyroundlib.lltm_sequence(input, weights, bias, (h0, c0))
    return output, h, c


def seq_args(steps, batch, features, state, dtype, device, requires_grad=True):
    """Fresh random (input, weights, bias, h0, c0), drawn in float64.  The weights at the
    layer's scale (1/sqrt(state), as LLTM initialises them): at unit scale the pre-activations
    of a large state saturate, and a recurrence run in bfloat16 then strays from the float64
    reference by more than its tolerance for ~1% of draws, whichever route runs it."""
    shapes = [(steps, batch, features), (3 * state, state + features), (3 * state,), (batch, state), (batch, state)]
    scales = [1.0, 1.0 / max(state, 1) ** 0.5, 1.0, 1.0, 1.0]
    return [(torch.randn(s, dtype=torch.float64) * k).to(dtype=dtype, device=device).requires_grad_(requires_grad)
            for s, k in zip(shapes, scales)]


def weighted_loss(outs):
    """A scalar using every output with different weights, so no gradient is trivially shared."""
    output, h, c = outs
    return (output * torch.linspace(0.5, 1.5, output.shape[-1], device=output.device, dtype=output.dtype)).sum() \
        + 2 * h.sum() + 3 * c.sum()


def assert_near_reference(got, want, plain, tol):
    """Each of ``got`` against the float64 reference ``want``.  Below float64 the tolerance
    scales with each tensor's largest value (a weight gradient sums T*B rounded terms, in
    another order than the reference's) and, in 16-bit types, with the steps past 10: each step
    stores its state rounded to the dtype, and the gradient of the first steps passes through
    every later one.  ``plain`` (16-bit types only; else None) is the same loop in plain PyTorch
    at got's dtype: twice its largest error is allowed on top.  The LLTM's cell has no forget
    gate, so a cell's rounding errors add up over the steps, and some draws feed them back into
    the gates: at test_inference's sizes, about 1 draw in 8000 put one element of ours up to
    2.4x past the scaled tolerance (plain PyTorch in the same dtype: 1 in 2000), though each of
    our steps is within one rounding of the float64 cell.  With plain PyTorch's error added,
    30000 draws stayed under 0.81 of the bound."""
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape
        low = g.dtype != torch.float64 and w.numel()
        atol = tol["atol"] * max(1.0, w.abs().max().item()) if low else tol["atol"]
        if low and plain is not None:
            assert plain[i].dtype == g.dtype
            atol += 2 * (plain[i].to(w.dtype) - w).abs().max().item()
        torch.testing.assert_close(g.to(w.dtype), w, rtol=tol["rtol"], atol=atol)


def plain_results(args, grads=True):
    """What assert_near_reference's ``plain`` is for these arguments: in a 16-bit dtype the
    reference loop's outputs (and, with grads, the gradients of weighted_loss) in that dtype;
    else None."""
    if args[0].dtype not in (torch.float16, torch.bfloat16):
        return None
    plain_args = [a.detach().clone().requires_grad_(grads) for a in args]
    plain = reference(*plain_args)
    return (*plain, *torch.autograd.grad(weighted_loss(plain), plain_args)) if grads else plain


def low_precision_tolerance(tol, dtype, steps):
    """The dtype's tolerance, scaled by the steps past 10 in 16-bit types."""
    if dtype in (torch.float16, torch.bfloat16) and steps > 10:
        return {key: value * steps / 10 for key, value in tol.items()}
    return tol


def check_against_reference(args, tol):
    """Outputs and gradients against the reference loop run in float64 on the same values
    (assert_near_reference)."""
    tol = low_precision_tolerance(tol, args[0].dtype, args[0].shape[0])
    ref_args = [a.detach().to(torch.float64).requires_grad_() for a in args]
    got, want = ours(*args), reference(*ref_args)
    grads = torch.autograd.grad(weighted_loss(got), args)
    ref_grads = torch.autograd.grad(weighted_loss(want), ref_args)
    assert all(g.dtype == args[0].dtype for g in (*got, *grads))
    assert_near_reference((*got, *grads), (*want, *ref_grads), plain_results(args), tol)


def check_repeatable(args):
    """Two calls give the same bits: outputs and every gradient (the fixed-order sums)."""
    first = ours(*args)
    first_grads = torch.autograd.grad(weighted_loss(first), args)
    again = ours(*args)
    again_grads = torch.autograd.grad(weighted_loss(again), args)
    for a, b in zip((*first, *first_grads), (*again, *again_grads)):
        assert torch.equal(a, b)


@pytest.mark.parametrize("steps,batch,features,state", [(1, 3, 4, 5), (7, 4, 3, 8), (5, 1, 16, 32), (3, 0, 2, 4)])
def test_matches_reference_loop(device, dtype, steps, batch, features, state):
    check_against_reference(seq_args(steps, batch, features, state, dtype, device), TOLERANCES[dtype])


@pytest.mark.parametrize("used", ["output", "c_n", "h_n"])
def test_gradient_through_some_outputs(device, used):
    """Outputs the loss does not use reach the backward as None (no zeros are materialised):
    the gradient of the others alone, against the reference."""
    args = seq_args(5, 3, 4, 8, torch.float32, device)
    ref_args = [a.detach().to(torch.float64).requires_grad_() for a in args]
    pick = {"output": lambda o: o[0].sum(), "c_n": lambda o: 3 * o[2].sum(), "h_n": lambda o: o[1].sum()}[used]
    grads = torch.autograd.grad(pick(ours(*args)), args)
    ref_grads = torch.autograd.grad(pick(reference(*ref_args)), ref_args)
    for g, w in zip(grads, ref_grads):
        torch.testing.assert_close(g.double(), w, **TOLERANCES[torch.float32])
        assert g.abs().sum() > 0  # every input gets a nonzero gradient from each output


def test_repeated_calls_same_shape(device):
    """On CUDA the first call runs the loops eagerly, the second captures them into graphs,
    later ones replay them: every call must give fresh, right results."""
    for _ in range(4):
        check_against_reference(seq_args(6, 3, 4, 8, torch.float32, device), TOLERANCES[torch.float32])


def test_zero_steps_and_default_state(device):
    args = seq_args(0, 3, 4, 5, torch.float32, device)
    output, (h, c) = pyroundlib.lltm_sequence(*args[:3], (args[3], args[4]))
    assert output.shape == (0, 3, 5) and h is args[3] and c is args[4]
    args = seq_args(4, 3, 4, 5, torch.float32, device)
    zeros = torch.zeros(3, 5, device=device)
    got = pyroundlib.lltm_sequence(*args[:3])
    want = reference(*args[:3], zeros, zeros)
    torch.testing.assert_close((got[0], *got[1]), want)


def test_layer(device):
    layer = pyroundlib.LLTMLayer(4, 6, device=device)
    cell = pyroundlib.LLTM(4, 6, device=device)
    cell.load_state_dict(layer.state_dict())  # a one-layer layer's parameters are a cell's
    layer.load_state_dict(cell.state_dict())
    assert [n for n, _ in layer.named_parameters()] == ["weights_l0", "bias_l0"]
    x = torch.randn(5, 2, 4, device=device)
    output, (h, c) = layer(x)
    hh, cc = torch.zeros(2, 6, device=device), torch.zeros(2, 6, device=device)
    for t in range(5):
        hh, cc = cell(x[t], (hh, cc))
        torch.testing.assert_close(output[t], hh)
    torch.testing.assert_close((h, c), (hh[None], cc[None]))
    batch_first = pyroundlib.LLTMLayer(4, 6, batch_first=True, device=device)
    batch_first.load_state_dict(layer.state_dict())
    output_bf, (h_bf, c_bf) = batch_first(x.transpose(0, 1).contiguous(), (torch.zeros(1, 2, 6, device=device),) * 2)
    torch.testing.assert_close(output_bf.transpose(0, 1), output)
    torch.testing.assert_close((h_bf, c_bf), (h, c))
    assert "batch_first=True" in repr(batch_first)


def test_non_contiguous_inputs(device):
    args = seq_args(4, 3, 4, 5, torch.float64, device, requires_grad=False)
    args[0] = torch.randn(3, 4, 4, dtype=torch.float64, device=device).transpose(0, 1)  # [T=4, B=3, I=4], strided
    args[1] = torch.randn(9, 15, dtype=torch.float64, device=device).t()  # [15, 9]
    torch.testing.assert_close(ours(*args), reference(*args))


@pytest.mark.parametrize("bad,match", [
    (lambda a: a.__setitem__(0, a[0][0]), "input must be 3-D"),
    (lambda a: a.__setitem__(1, a[1][:, 1:]), "weights must have shape"),
    (lambda a: a.__setitem__(1, a[1][1:]), "weights must be 2-D"),
    (lambda a: a.__setitem__(2, a[2][1:]), "bias must have shape"),
    (lambda a: a.__setitem__(3, a[3][1:]), "h0 must have shape"),
    (lambda a: a.__setitem__(4, a[4].float()), "c0 has dtype"),
    (lambda a: a.__setitem__(0, a[0].long()), "input must have dtype"),
    (lambda a: a.__setitem__(2, "bias"), "bias must be a torch.Tensor"),
])
def test_bad_arguments_name_the_argument(bad, match):
    args = seq_args(3, 2, 4, 5, torch.float64, "cpu", requires_grad=False)
    bad(args)
    with pytest.raises((TypeError, ValueError), match=match):
        ours(*args)
    with pytest.raises(TypeError, match="state must be a tuple"):
        pyroundlib.lltm_sequence(*seq_args(3, 2, 4, 5, torch.float64, "cpu")[:3], state=torch.zeros(2, 5))


def test_gradcheck_and_gradgradcheck(device):
    args = seq_args(3, 2, 3, 4, torch.float64, device)
    assert torch.autograd.gradcheck(ours, args)
    assert torch.autograd.gradgradcheck(ours, args)


def test_forward_mode(device):
    args = seq_args(3, 2, 3, 4, torch.float64, device, requires_grad=False)
    tangents = tuple(torch.randn_like(a) for a in args)
    torch.testing.assert_close(func.jvp(ours, tuple(args), tangents), func.jvp(reference, tuple(args), tangents))
    torch.testing.assert_close(func.jacfwd(ours, argnums=ARGNUMS)(*args), func.jacfwd(reference, argnums=ARGNUMS)(*args))


def nested_jvp(fn, args, outer, inner):
    """The second-order forward-mode derivative of fn along (inner, outer): jvp of a jvp."""
    return func.jvp(lambda *a: func.jvp(fn, a, inner)[1], tuple(args), outer)[1]


def test_forward_over_forward(device):
    """Second order in forward mode (jvp of jvp, jacfwd of jacfwd) as the reference's: torch
    gives zero second-order tangents through an autograd Function's jvp (pytorch#197867),
    so under forward mode lltm_sequence computes in torch ops."""
    args = seq_args(3, 2, 3, 4, torch.float64, device, requires_grad=False)
    outer, inner = (tuple(torch.randn_like(a) for a in args) for _ in range(2))
    want = nested_jvp(reference, args, outer, inner)
    assert all(w.abs().sum() > 0 for w in want)
    torch.testing.assert_close(nested_jvp(ours, args, outer, inner), want)
    loss = lambda fn: lambda x: weighted_loss(fn(x, *args[1:]))  # noqa: E731
    torch.testing.assert_close(func.jacfwd(func.jacfwd(loss(ours)))(args[0]),
                               func.jacrev(func.jacrev(loss(reference)))(args[0]))


def test_function_jvp_first_order(device):
    """LLTMSequenceFunction's own jvp (the entry point computes forward mode in torch ops)."""
    args = seq_args(3, 2, 3, 4, torch.float64, device, requires_grad=False)
    tangents = tuple(torch.randn_like(a) for a in args)
    got = func.jvp(lambda *a: sequence.LLTMSequenceFunction.apply(*a)[:2], tuple(args), tangents)
    want = func.jvp(lambda *a: reference(*a)[::2], tuple(args), tangents)
    torch.testing.assert_close(got, want)


def test_func_grad_and_jacrev(device):
    args = seq_args(3, 2, 3, 4, torch.float64, device, requires_grad=False)
    loss = lambda fn: lambda *a: weighted_loss(fn(*a))  # noqa: E731
    torch.testing.assert_close(func.grad(loss(ours), argnums=ARGNUMS)(*args),
                               func.grad(loss(reference), argnums=ARGNUMS)(*args))
    torch.testing.assert_close(func.jacrev(ours, argnums=ARGNUMS)(*args), func.jacrev(reference, argnums=ARGNUMS)(*args))


@pytest.fixture(params=[True, False], ids=["direct-without-grad", "function-always"])
def sequence_route(request, monkeypatch):
    """lltm_sequence where no gradient is wanted: the eager twin op called directly (its own
    vmap rule), or, as on a torch without torch.library.register_vmap, LLTMSequenceFunction."""
    if request.param and not sequence.DIRECT_WITHOUT_GRAD:
        pytest.skip("this torch has no torch.library.register_vmap")
    monkeypatch.setattr(sequence, "DIRECT_WITHOUT_GRAD", request.param)
    return request.param


def test_sequence_skips_the_function_only_where_no_gradient_is_wanted(device, sequence_route, monkeypatch):
    """No gradient wanted (grad mode off, inference mode, no input requiring grad): the same
    bits with or without the Function, right against the reference, and results that need no
    graph; wanted (any one input requiring grad): the Function, with its gradients."""
    calls = []
    apply = sequence.LLTMSequenceFunction.apply
    monkeypatch.setattr(sequence.LLTMSequenceFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    args = seq_args(5, 3, 4, 6, torch.float32, device)
    want = reference(*args)
    with_function = [t.detach() for t in ours(*args)]
    plain = [a.detach() for a in args]
    with torch.no_grad():
        got = ours(*args)
    with torch.inference_mode():
        inferred = ours(*plain)
    detached = ours(*plain)
    assert len(calls) == (1 if sequence_route else 4)
    for result in (got, inferred, detached):
        assert all(torch.equal(g, w) for g, w in zip(result, with_function))
        assert not any(t.requires_grad for t in result)
        torch.testing.assert_close(result, [w.detach() for w in want])
    only_bias = plain[:2] + [plain[2].clone().requires_grad_()] + plain[3:]
    out = ours(*only_bias)
    assert len(calls) == (2 if sequence_route else 5) and out[0].requires_grad
    torch.testing.assert_close(torch.autograd.grad(weighted_loss(out), only_bias[2]),
                               torch.autograd.grad(weighted_loss(want), args[2]))


@pytest.mark.parametrize("in_dims", [(0, None, None, 0, 0), (2, None, None, None, 0), (0, 0, 0, 0, 0)],
                         ids=["batched-data", "mixed-dims", "ensemble"])
def test_vmap(device, in_dims, sequence_route):
    args = seq_args(3, 2, 3, 4, torch.float64, device, requires_grad=False)
    batched = [a if d is None else torch.stack([a, 0.5 * a], dim=d) for a, d in zip(args, in_dims)]
    torch.testing.assert_close(func.vmap(ours, in_dims=in_dims)(*batched),
                               func.vmap(reference, in_dims=in_dims)(*batched))
    per_sample = (0, None, None, None, None)
    inputs = torch.stack([args[0], 2 * args[0]])
    loss = lambda fn: lambda *a: weighted_loss(fn(*a))  # noqa: E731
    torch.testing.assert_close(func.vmap(func.grad(loss(ours), argnums=1), in_dims=per_sample)(inputs, *args[1:]),
                               func.vmap(func.grad(loss(reference), argnums=1), in_dims=per_sample)(inputs, *args[1:]))


AUTOCAST = {"cpu": torch.bfloat16, "cuda": torch.float16}


def test_autocast(device):
    low = AUTOCAST[device.type]
    layer = pyroundlib.LLTMLayer(4, 6, device=device)
    x = torch.randn(5, 3, 4, device=device)
    with torch.autocast(device.type, dtype=low):
        output, (h, c) = layer(x)
        want = reference(x, layer.weights_l0, layer.bias_l0, torch.zeros(3, 6, device=device),
                         torch.zeros(3, 6, device=device))
    h, c = h[0], c[0]
    assert output.dtype == h.dtype == c.dtype == low
    grads = torch.autograd.grad(weighted_loss((output.float(), h.float(), c.float())), list(layer.parameters()))
    ref_grads = torch.autograd.grad(weighted_loss(tuple(w.float() for w in want)), list(layer.parameters()))
    assert all(g.dtype == torch.float32 for g in grads)
    # two low-precision computations, rounded in different places: a tolerance scaled by each
    # tensor's largest value (a weight gradient sums T*B terms)
    for g, r in zip((output, h, c, *grads), (*want, *ref_grads)):
        g, r = g.float(), r.float()
        torch.testing.assert_close(g, r, rtol=5e-2, atol=5e-2 * max(1.0, r.abs().max().item()))


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_fullgraph(device, dynamic):
    torch._dynamo.reset()
    layer = pyroundlib.LLTMLayer(4, 6, device=device)
    compiled = torch.compile(layer, fullgraph=True, dynamic=dynamic)
    for steps in (3, 5):
        x = torch.randn(steps, 2, 4, device=device, requires_grad=True)
        got, want = compiled(x), layer(x)
        torch.testing.assert_close(got, want)
        params = [x] + list(layer.parameters())
        torch.testing.assert_close(torch.autograd.grad(weighted_loss((got[0], *got[1])), params),
                                   torch.autograd.grad(weighted_loss((want[0], *want[1])), params))


def test_opcheck(device, dtype):
    args = [a.detach() for a in seq_args(3, 2, 4, 5, dtype, device)]
    torch.library.opcheck(torch.ops.pyroundlib.lltm_sequence_forward.default, args)
    torch.library.opcheck(torch.ops.pyroundlib.lltm_sequence_forward.default,
                          [a.clone().requires_grad_() for a in args])
    torch.library.opcheck(torch.ops.pyroundlib.lltm_sequence_forward_no_autograd.default, args)
    torch.library.opcheck(torch.ops.pyroundlib.lltm_sequence_inference.default, args)
    output, c_n, cells, gates = torch.ops.pyroundlib.lltm_sequence_forward(*args)
    grads = (torch.randn_like(output), torch.randn_like(c_n))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_sequence_backward.default,
                          (*grads, args[0], args[1], args[3], args[4], output, cells, gates))


def test_forward_op_is_differentiable_on_its_own():
    args = seq_args(3, 2, 3, 4, torch.float64, "cpu")
    assert torch.autograd.gradcheck(lambda *a: torch.ops.pyroundlib.lltm_sequence_forward(*a)[:2], args)
    assert torch.autograd.gradgradcheck(lambda *a: torch.ops.pyroundlib.lltm_sequence_forward(*a)[:2], args)


def test_eager_calls_run_the_forward_op_without_its_autograd_formula(device):
    """In eager mode the autograd Function is the node: its forward calls the op that has no
    autograd formula of its own (the differentiable one would wrap every call in torch's
    autograd shim for nothing), and the gradients still match the reference."""
    args = seq_args(3, 2, 3, 4, torch.float32, device)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        got = ours(*args)
    names = {event.name for event in profile.events()}
    assert "pyroundlib::lltm_sequence_forward_no_autograd" in names
    assert "pyroundlib::lltm_sequence_forward" not in names
    want = reference(*args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(weighted_loss(got), args),
                               torch.autograd.grad(weighted_loss(want), args))


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
@pytest.mark.parametrize("grad_mode", [True, False], ids=["grad", "no-grad"])
def test_export_records_the_differentiable_op(strict, grad_mode):
    """An exported program calls the forward op that carries its autograd formula, so it can be
    trained: its gradients match the eager layer's (strict export too; exported under no_grad
    too, where an eager call would run the inference op)."""
    layer = pyroundlib.LLTMLayer(4, 6, batch_first=True)
    x = torch.randn(3, 5, 4)
    with torch.set_grad_enabled(grad_mode):
        program = torch.export.export(layer, (x,), strict=strict)
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.pyroundlib.lltm_sequence_forward.default in targets
    assert torch.ops.pyroundlib.lltm_sequence_forward_no_autograd.default not in targets
    assert torch.ops.pyroundlib.lltm_sequence_inference.default not in targets
    exported = program.module()
    x = torch.randn(3, 5, 4, requires_grad=True)
    got, want = exported(x), layer(x)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(weighted_loss((got[0], *got[1])), [x, *exported.parameters()])
    torch.testing.assert_close(grads, torch.autograd.grad(weighted_loss((want[0], *want[1])), [x, *layer.parameters()]))


def test_jit_trace_records_the_differentiable_op():
    """torch.jit.trace records the forward op (an autograd Function would be a PythonOp):
    the trace runs a sequence of another length and batch with the eager layer's outputs and
    gradients."""
    layer = pyroundlib.LLTMLayer(4, 6)
    traced = torch.jit.trace(layer, (torch.randn(5, 3, 4),))
    assert "pyroundlib::lltm_sequence_forward" in str(traced.inlined_graph)
    x = torch.randn(7, 2, 4, requires_grad=True)
    got, want = traced(x), layer(x)
    torch.testing.assert_close(got, want)
    params = [x, *layer.parameters()]
    torch.testing.assert_close(torch.autograd.grad(weighted_loss((got[0], *got[1])), params),
                               torch.autograd.grad(weighted_loss((want[0], *want[1])), params))


def test_export_save_load_in_a_fresh_process(tmp_path):
    layer = pyroundlib.LLTMLayer(4, 6, batch_first=True)
    x = torch.randn(3, 5, 4)
    program = torch.export.export(layer, (x,))
    assert any(n.target == torch.ops.pyroundlib.lltm_sequence_forward.default
               for n in program.graph.nodes if n.op == "call_function")
    path, data = str(tmp_path / "layer.pt2"), str(tmp_path / "data.pt")
    torch.export.save(program, path)
    x = torch.randn(3, 5, 4)
    output, (h, c) = layer(x)
    torch.save({"x": x, "want": (output, h, c)}, data)
    code = ("import torch, pyroundlib\n"
            f"program = torch.export.load({path!r})\n"
            f"data = torch.load({data!r})\n"
            "output, (h, c) = program.module()(data['x'])\n"
            "torch.testing.assert_close((output, h, c), data['want'])\n"
            "print('OK')\n")
    run_python_ok(code)


def test_meta_tensors():
    args = seq_args(4, 3, 2, 5, torch.float32, "meta")
    output, (h, c) = pyroundlib.lltm_sequence(*args[:3], (args[3], args[4]))
    assert output.shape == (4, 3, 5) and h.shape == c.shape == (3, 5) and output.device.type == "meta"
    grads = torch.autograd.grad(output.sum() + c.sum(), args)
    assert [g.shape for g in grads] == [a.shape for a in args]


# ---- CUDA: streams, graphs, devices ---------------------------------------------------------

@requires_cuda
@pytest.mark.parametrize("graphs_on", ["1", "0"])
def test_side_stream(monkeypatch, graphs_on):
    monkeypatch.setenv(graphs.ENV_VAR, graphs_on)
    args = seq_args(6, 4, 8, 16, torch.float32, "cuda", requires_grad=False)
    want = reference(*args)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # eager, capture, replay: all on the side stream
            torch.cuda._sleep(1_000_000)  # a busy stream: a launch on another stream would race
            got = ours(*args)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(got, want)


@requires_cuda
def test_inside_a_users_cuda_graph():
    """Under the caller's capture the loops are captured into that graph (no graph of ours)."""
    layer = pyroundlib.LLTMLayer(8, 16, device="cuda")
    static_x = torch.randn(5, 4, 8, device="cuda")
    graph, (static_out, (static_h, static_c)) = capture_after_warm_up(lambda: layer(static_x))
    for _ in range(3):
        static_x.copy_(torch.randn(5, 4, 8, device="cuda"))
        graph.replay()
        zeros = torch.zeros(4, 16, device="cuda")
        want = reference(static_x, layer.weights_l0.detach(), layer.bias_l0.detach(), zeros, zeros)
        torch.testing.assert_close((static_out, static_h[0], static_c[0]), want)


@requires_cuda
def test_training_step_in_a_users_cuda_graph(monkeypatch):
    """A whole training step over a sequence, step by step (forward and backward loops,
    the products of all steps), captured into the caller's CUDA graph and replayed."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    layer = pyroundlib.LLTMLayer(8, 16, device="cuda")
    static_x = torch.randn(19, 4, 8, device="cuda")

    def step():
        layer.zero_grad(set_to_none=True)  # the captured backward allocates .grad in the graph's pool
        loss = layer(static_x)[0].square().sum()
        loss.backward()
        return loss

    graph, static_loss = capture_after_warm_up(step)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        args = [static_x, layer.weights_l0.detach(), layer.bias_l0.detach(), torch.zeros(4, 16, device="cuda"),
                torch.zeros(4, 16, device="cuda")]
        ref = [a.double().requires_grad_(k in (1, 2)) for k, a in enumerate(args)]
        loss = reference(*ref)[0].square().sum()
        loss.backward()
        torch.testing.assert_close(static_loss.double(), loss.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.weights_l0.grad.double(), ref[1].grad, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(layer.bias_l0.grad.double(), ref[2].grad, rtol=1e-5, atol=1e-5)


@requires_cuda
def test_compile_reduce_overhead():
    torch._dynamo.reset()
    layer = pyroundlib.LLTMLayer(8, 16, device="cuda")
    compiled = torch.compile(layer, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):
        x = torch.randn(5, 4, 8, device="cuda", requires_grad=True)
        got = compiled(x)
        got_grads = torch.autograd.grad(weighted_loss((got[0], *got[1])), [x] + list(layer.parameters()))
        want = layer(x)
        want_grads = torch.autograd.grad(weighted_loss((want[0], *want[1])), [x] + list(layer.parameters()))
        torch.testing.assert_close((got[0], *got[1]), (want[0], *want[1]))
        torch.testing.assert_close(got_grads, want_grads)


def test_buffers_use_a_pool_only_where_graphs_replay(monkeypatch):
    """graphs.buffers: the caching allocator as usual for CPU tensors, with the graphs off
    and (on a GPU) under a capture; the device's pool otherwise, where this torch has one."""
    assert isinstance(graphs.buffers(torch.empty(1)), contextlib.nullcontext)
    if not torch.cuda.is_available():
        return
    x = torch.empty(1, device="cuda")
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    assert isinstance(graphs.buffers(x), contextlib.nullcontext)
    monkeypatch.setenv(graphs.ENV_VAR, "1")
    if graphs._MemPool is not None and graphs._use_mem_pool is not None:
        assert not isinstance(graphs.buffers(x), contextlib.nullcontext)
        assert x.get_device() in graphs._pools
    graph, side = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    with torch.cuda.stream(side), torch.cuda.graph(graph):
        assert isinstance(graphs.buffers(x), contextlib.nullcontext)  # a capture allocates from its own pool
    monkeypatch.setattr(torch.cuda, "get_allocator_backend", lambda: "cudaMallocAsync")
    assert isinstance(graphs.buffers(x), contextlib.nullcontext)  # no pools there


@requires_cuda
def test_step_by_step_route_under_the_cuda_malloc_async_allocator():
    """With torch's other CUDA allocator (no memory pools) the step-by-step route allocates as
    usual, and its graphs still replay what the plain loops give."""
    code = f"""
import os, sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from pyroundlib import _threads, graphs, sequence
from test_sequence import seq_args, ours, weighted_loss
assert torch.cuda.get_allocator_backend() == "cudaMallocAsync"
args = seq_args(9, 5, 6, 32, torch.bfloat16, "cuda")  # 16-bit: the step loop is replayed
os.environ[sequence.PERSISTENT_ENV_VAR] = "0"
results = []
for graphs_on in ("0", "1", "1", "1", "1"):
    os.environ[graphs.ENV_VAR] = graphs_on
    outs = ours(*args)
    results.append([t.clone() for t in (*outs, *torch.autograd.grad(weighted_loss(outs), args))])
for got in results[1:]:
    assert all(torch.equal(g, w) for g, w in zip(got, results[0]))
assert not graphs._pools and graphs._graphs
print("OK")
"""
    run_python_ok(code, PYTORCH_CUDA_ALLOC_CONF="backend:cudaMallocAsync")


@requires_cuda
@pytest.mark.skipif(graphs._MemPool is None or graphs._use_mem_pool is None, reason="torch without MemPool")
def test_graph_replay_of_repeated_calls_survives_other_allocations():
    """Between two calls other work allocates and frees (here buffers of random sizes, kept
    or not): the calls' tensors, allocated in the pool of their own (graphs.buffers), still
    get the same blocks, so the calls are replayed over their own tensors, not over copies,
    and give exactly what the plain loops give."""
    code = f"""
import os, random, sys, torch
sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})
from pyroundlib import _threads, graphs, sequence
from test_sequence import seq_args, ours, weighted_loss
args = seq_args(17, 5, 6, 32, torch.bfloat16, "cuda")
os.environ[sequence.PERSISTENT_ENV_VAR] = "0"
os.environ[graphs.ENV_VAR] = "0"
outs = ours(*args)
want = [t.clone() for t in (*outs, *torch.autograd.grad(weighted_loss(outs), args))]
del outs
os.environ[graphs.ENV_VAR] = "1"
rng, junk = random.Random(0), []
for call in range(8):
    outs = ours(*args)
    got = (*outs, *torch.autograd.grad(weighted_loss(outs), args))
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    del outs, got
    for _ in range(3):
        junk.append(torch.empty(rng.randrange(1, 1 << 20), device="cuda"))
    del junk[:rng.randrange(len(junk))]
    if call >= 4:  # the last two graphs used: this call's forward and backward, over its own tensors
        assert all(isinstance(g, torch.cuda.CUDAGraph) for g in list(graphs._graphs.values())[-2:]), graphs._graphs
assert graphs._pools
graphs.clear()
assert not graphs._pools and not graphs._graphs
print("OK")
"""
    run_python_ok(code)


# A fresh process runs a sequence call on ``route``: for each dtype, the same call with
# the graphs off, then eight times with them on (the first runs the loop as it is, the second
# captures over the call's own tensors or, with the results kept alive, later ones capture over
# copies; the rest replay; eight, because a training loop's allocator can hand out two or three
# sets of addresses in turn before they settle, each captured once it repeats).  Every call
# must give the bits of the graphs-off call, and that call must match the float64 reference.
# ``devices``: where the calls run, in turn, while cuda:0 is current.
REPLAY_CODE = """
import os, sys, torch
sys.path.insert(0, {tests!r})
from pyroundlib import _threads, graphs, sequence
from test_sequence import seq_args, ours, weighted_loss, check_against_reference
from conftest import TOLERANCES
os.environ[sequence.PERSISTENT_ENV_VAR] = {route!r}
torch.cuda.set_device(0)
for device in {devices!r}:
    for dtype in {dtypes}:
        args = seq_args(17, 5, 6, 32, dtype, device)  # 17 steps: long enough for a replay over copies
        torch.backends.cuda.matmul.allow_tf32 = False
        check_against_reference(args, TOLERANCES[dtype])
        torch.backends.cuda.matmul.allow_tf32 = True  # float32 products on tensor cores: replayed too
        replayed = sequence._route(args[0], 17, 5, 6, 32) == sequence.REPLAYED
        assert replayed == ({route!r} == "0" and dtype != torch.float64)
        os.environ[graphs.ENV_VAR] = "0"
        outs = ours(*args)
        want = [t.clone() for t in (*outs, *torch.autograd.grad(weighted_loss(outs), args))]
        del outs
        os.environ[graphs.ENV_VAR] = "1"
        kept, before = [], {{id(g) for g in graphs._graphs.values()}}
        for call in range(8):
            outs = ours(*args)
            got = (*outs, *torch.autograd.grad(weighted_loss(outs), args))
            for g, w in zip(got, want):
                assert g.device == torch.device(device) and torch.equal(g, w), (device, dtype, call)
            if {keep_results}:
                kept.append(got)
            del outs, got
            assert torch.cuda.current_device() == 0
        if replayed:  # the forward and the backward replayed from graphs of their own
            kind = graphs._OverCopies if {keep_results} else torch.cuda.CUDAGraph
            new = [g for g in graphs._graphs.values() if id(g) not in before]
            assert sum(isinstance(g, kind) for g in new) >= 2, graphs._graphs
        else:
            assert {{id(g) for g in graphs._graphs.values()}} <= before
print("OK")
"""


def run_replays(route="0", devices=("cuda:0",), keep_results=False,
                dtypes="(torch.float32, torch.float64, torch.float16, torch.bfloat16)"):
    run_python_ok(REPLAY_CODE.format(tests=str(Path(__file__).resolve().parent), route=route,
                                     devices=list(devices), keep_results=keep_results, dtypes=dtypes))


@requires_cuda
@pytest.mark.parametrize("keep_results", [False, True], ids=["training-loop", "new-tensors-each-call"])
def test_graph_replay_matches_plain_loops(keep_results):
    """Repeated calls are replayed from CUDA graphs, in every dtype, and give exactly what the
    plain loops give, bit for bit, on the first, second and later calls: over the call's own
    tensors when a call repeats (a training loop drops its results, so the allocator hands out
    the same blocks), over copies when only the shapes repeat (new tensors each call).  In a
    fresh process, whose allocator is a training process's: blocks that the tests before leave
    cached can keep a short loop's addresses from repeating for a while."""
    run_replays(keep_results=keep_results)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_graph_made_under_inference_mode_serves_training(monkeypatch, dtype):
    """A graph over copies captured while inference_mode is on (validation, whose results are
    kept) serves a later call of the same shape with gradients on (training): its copies are
    normal tensors, and the results are the plain loop's bits."""
    args = seq_args(19, 3, 5, 24, dtype, "cuda")
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    torch.backends.cuda.matmul.allow_tf32 = True  # float32 on tensor cores: replayed
    assert sequence._route(args[0], 19, 3, 5, 24, inference=True) == sequence.REPLAYED
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    outs = ours(*args)
    want = [t.clone() for t in (*outs, *torch.autograd.grad(weighted_loss(outs), args))]
    monkeypatch.setenv(graphs.ENV_VAR, "1")
    graphs.clear()
    with torch.inference_mode():
        kept = [ours(*args) for _ in range(2 + graphs.SIGHTINGS_BEFORE_COPIES)]  # new tensors each call
    assert any(isinstance(g, graphs._OverCopies) for g in graphs._graphs.values()), graphs._graphs
    for call in range(3):
        outs = ours(*args)
        got = (*outs, *torch.autograd.grad(weighted_loss(outs), args))
        for g, w in zip(got, want):
            assert torch.equal(g, w), call
    for got in kept:
        for g, w in zip(got, want):
            assert torch.equal(g, w)


def _doubled(x, y):  # a loop for graphs.run: reads x, writes y
    torch.mul(x, 2, out=y)


@requires_cuda
def test_a_call_replayed_over_copies_that_repeats_gets_its_own_graph(monkeypatch):
    """Once a call's shape is replayed over copies, a call that then repeats its tensors (a
    training loop whose addresses settle after its first iterations) is captured over its
    own tensors and replayed without copies; the results stay the loop's."""
    monkeypatch.setenv(graphs.ENV_VAR, "1")
    graphs.clear()
    x = torch.randn(1000, device="cuda")
    outputs = [torch.full_like(x, float("nan")) for _ in range(1 + graphs.SIGHTINGS_BEFORE_COPIES)]
    for y in outputs:  # new tensors each call: run as they are, then over copies
        graphs.run(_doubled, (x, y), inputs=1, copies_pay=True)
    assert any(isinstance(g, graphs._OverCopies) for g in graphs._graphs.values()), graphs._graphs
    assert all(torch.equal(y, x * 2) for y in outputs)  # every element written, plain and over copies
    settled = outputs[-1]
    for call in range(3):  # the last call's tensors again
        x.normal_()
        settled.fill_(float("nan"))
        graphs.run(_doubled, (x, settled), inputs=1, copies_pay=True)
        assert torch.equal(settled, x * 2), call
    own = [key for key, g in graphs._graphs.items() if isinstance(g, torch.cuda.CUDAGraph)]
    assert len(own) == 1 and own[0][-2:] == (x.data_ptr(), settled.data_ptr()), graphs._graphs
    graphs.clear()


@requires_cuda
def test_graphs_follow_the_matmul_precision(monkeypatch):
    """A graph captured with TF32 off is not replayed for a call with TF32 on."""
    args = [a.detach() for a in seq_args(20, 64, 128, 128, torch.float32, "cuda")]
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    results = {}
    for graphs_on in ("0", "1"):
        monkeypatch.setenv(graphs.ENV_VAR, graphs_on)
        graphs.clear()
        for tf32 in (False, False, False, True, True, True):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            results.setdefault((graphs_on, tf32), []).append(ours(*args)[0])
    for tf32 in (False, True):
        for got in results[("1", tf32)]:
            assert torch.equal(got, results[("0", tf32)][0])
    assert not torch.equal(results[("0", True)][0], results[("0", False)][0])  # TF32 did change the GEMMs


@requires_cuda
@pytest.mark.parametrize("steps,batch,features,state", [
    (8, 32, 8, 64),      # the benchmark's small size: one column tile, one row per block
    (6, 64, 32, 512),    # the middle size's state: 16-column tiles, several rows per block
    (5, 6, 4, 128),      # 4 column tiles: one cluster per row tile where the GPU has clusters
    (4, 9, 5, 256),      # 16 column tiles: a cluster of 16 (non-portable) where it fits
    (5, 7, 3, 33),       # tiles that do not divide the batch or the state
    (3, 5, 2, 300),      # the reduction length not a multiple of a thread's chunk
    (3, 50, 40, 24),     # the input half's tiles: 150 rows, 72 gates, 40 features, none whole
    (4, 3, 0, 8),        # no input features: the gates start from the bias alone
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_persistent_kernels(monkeypatch, steps, batch, features, state, dtype):
    """The persistent kernels at the sizes that exercise their tiling: they are the route
    taken, match the float64 reference and give the same bits on every call."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    args = seq_args(steps, batch, features, state, dtype, "cuda")  # weights at the layer's scale
    # float64 holds half the weights per register file: at S = 512 its tiles do not fit
    route = sequence._route(args[0], steps, batch, features, state)
    assert (route == sequence.ONE_CALL) == (dtype != torch.float64 or state < 512)
    check_against_reference(args, TOLERANCES[dtype])
    check_repeatable(args)


@requires_cuda
@pytest.mark.parametrize("steps,batch,features,state", [
    (8, 32, 8, 64),    # one column tile of 64 (tensor cores): 4 rows a block, the k-tiles in two
    (5, 6, 4, 128),    # one column tile of 128: 2 rows a block, each warp the whole reduction
    (5, 7, 3, 33),     # a state of no whole k-tiles
    (4, 9, 5, 256),    # 4 column tiles of 64: a cluster of 4 where the GPU has clusters
    (3, 5, 2, 300),    # 10 column tiles of 32
    (6, 20, 32, 512),  # 16 column tiles of 32: a cluster of 16 (non-portable) where it fits
    (3, 3, 2, 520),    # 33 column tiles of 16: the grid barrier
])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("tensor_cores", ["1", "0"], ids=["tensor-cores", "cuda-cores"])
def test_persistent_kernels_16_bit(monkeypatch, steps, batch, features, state, dtype, tensor_cores):
    """16-bit sequences on the persistent kernels, their products on tensor cores (sm_80+)
    and, with PYROUNDLIB_TENSOR_CORES=0, on CUDA cores as older GPUs run them: the route
    taken, the float64 reference matched, the same bits on every call."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    monkeypatch.setenv(sequence.TENSOR_CORES_ENV_VAR, tensor_cores)
    monkeypatch.setattr(sequence, "_persistent_fits", {})  # asked again under this setting
    args = seq_args(steps, batch, features, state, dtype, "cuda")
    assert sequence._route(args[0], steps, batch, features, state) == sequence.ONE_CALL
    check_against_reference(args, TOLERANCES[dtype])
    check_repeatable(args)


@pytest.mark.parametrize("fits", [0, 1, 2])
def test_route_where_the_kernels_fit_only_with_two_pairs_a_thread(monkeypatch, fits):
    """The route's rule for the fits query's answers, on any machine (the answer patched; a
    meta tensor stands for a 16-bit CUDA one): 1 takes the persistent kernels; 2 (only in row
    tiles of two pairs a thread) leaves a padded batch on the replayed step loop, but takes them
    where graphs are off or with PYROUNDLIB_PERSISTENT_SEQUENCE=1, and for a pack; 0 never."""
    monkeypatch.setattr(sequence, "_fits", lambda cache, query, t, *sizes: fits)
    for name in (sequence.PERSISTENT_ENV_VAR, graphs.ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    x = torch.empty(1, dtype=torch.bfloat16, device="meta")
    steps, batch, features, state = 200, 64, 128, 768  # T*B*S past the fused kernels' limit
    replayed_or_one_call = {0: sequence.REPLAYED, 1: sequence.ONE_CALL, 2: sequence.REPLAYED}[fits]
    assert sequence._route(x, steps, batch, features, state) == replayed_or_one_call
    assert sequence._packed_route(x, steps, batch, features, state) == (sequence.ONE_CALL if fits else sequence.STEPS)
    monkeypatch.setenv(graphs.ENV_VAR, "0")
    assert sequence._route(x, steps, batch, features, state) == (sequence.ONE_CALL if fits else sequence.STEPS)
    monkeypatch.delenv(graphs.ENV_VAR)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    assert sequence._route(x, steps, batch, features, state) == (sequence.ONE_CALL if fits else sequence.REPLAYED)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    assert sequence._route(x, steps, batch, features, state) == sequence.REPLAYED
    assert sequence._packed_route(x, steps, batch, features, state) == sequence.STEPS


@requires_cuda
@pytest.mark.skipif(CUDA and torch.cuda.get_device_capability()[0] < 8, reason="tensor cores: sm_80 and later")
@pytest.mark.parametrize("batch,state", [(64, 768), (64, 1024)])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_persistent_kernels_two_pairs_a_thread(monkeypatch, dtype, batch, state):
    """A batch too wide for tiles of one (row, column) pair a thread: 16-column tiles of the
    tensor cores, whose grid of one pair a thread needs 48-64 x 4 blocks (192 SMs or more), take
    rows of two pairs a thread (96-128 blocks, the grid's barrier): against the float64
    reference, the same bits on every call (a pack: test_layer.py).  The library says so
    (prl_lltm_sequence_cuda_fits: 2), and by default a padded batch keeps the replayed step
    loop, faster there, while a pack takes them.  Skips on a GPU too small to hold even those
    tiles."""
    monkeypatch.delenv(sequence.PERSISTENT_ENV_VAR, raising=False)
    monkeypatch.delenv(sequence.TENSOR_CORES_ENV_VAR, raising=False)
    monkeypatch.delenv(graphs.ENV_VAR, raising=False)
    monkeypatch.setattr(sequence, "_persistent_fits", {})
    args = seq_args(4, batch, 8, state, dtype, "cuda")
    fits = sequence._fits(sequence._persistent_fits, "prl_lltm_sequence_cuda_fits", args[0], batch, state)
    if not fits:
        pytest.skip(f"({batch}, {state}) does not fit in one co-resident grid on this GPU")
    if torch.cuda.get_device_properties(0).multi_processor_count < 192:
        assert fits == 2
    if fits == 2:
        assert sequence._route(args[0], 200, batch, 8, state) == sequence.REPLAYED
        assert sequence._packed_route(args[0], 200, batch, 8, state) == sequence.ONE_CALL
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    assert sequence._route(args[0], 4, batch, 8, state) == sequence.ONE_CALL
    check_against_reference(args, TOLERANCES[dtype])
    check_repeatable(args)


@requires_cuda
@pytest.mark.skipif(CUDA and torch.cuda.get_device_capability()[0] < 8, reason="tensor cores: sm_80 and later")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_tensor_cores_switch(monkeypatch, dtype):
    """PYROUNDLIB_TENSOR_CORES switches the 16-bit product: the two sum in other orders, so
    some stored bits differ (the test above then ran both kernels).  In bfloat16 few do, as
    the two sums mostly round to the same bfloat16: 35 of 200 K elements at (50, 32, 16, 128),
    thousands at this size (H100)."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    args = seq_args(100, 64, 16, 256, dtype, "cuda", requires_grad=False)
    results = {}
    for setting in ("1", "0"):
        monkeypatch.setenv(sequence.TENSOR_CORES_ENV_VAR, setting)
        output, (_, c_n) = pyroundlib.lltm_sequence(*args[:3], tuple(args[3:]))
        results[setting] = torch.cat([output.flatten(), c_n.flatten()])
    assert not torch.equal(results["1"], results["0"])


@requires_cuda
@pytest.mark.parametrize("dtype,state", [(torch.float32, 64), (torch.float16, 64), (torch.bfloat16, 64),
                                         (torch.float16, 128), (torch.bfloat16, 128)], ids=str)
def test_state_size_kernel_gives_the_general_kernels_bits(monkeypatch, dtype, state):
    """At S = 64 (one block of its 64 columns on CUDA cores) and, in 16 bits, S = 128 (one block
    of 128 columns on tensor cores) the persistent kernels are compiled for that state size;
    PYROUNDLIB_STATE_KERNELS=0 runs the general ones.  The same sums in the same order: the same
    bits, outputs and every gradient, padded and over a pack's sizes; and both match the float64
    reference."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    args = seq_args(40, 16, 8, state, dtype, "cuda")
    lengths = [40, 37, 33, 20, 20, 9, 4, 1] * 2
    pack = torch.nn.utils.rnn.pack_padded_sequence(args[0].detach().clone(), lengths, enforce_sorted=False)
    pack = pack._replace(data=pack.data.requires_grad_())
    layer = pyroundlib.LLTMLayer(8, state, device="cuda", dtype=dtype)
    assert sequence._packed_route(pack.data, 40, 16, 8, state) == sequence.ONE_CALL
    results = {}
    for setting in ("0", "1"):
        monkeypatch.setenv(sequence.STATE_KERNELS_ENV_VAR, setting)
        got = ours(*args)
        padded = [*got, *torch.autograd.grad(weighted_loss(got), args)]
        output, (h, c) = layer(pack)
        packed = [output.data, h, c, *torch.autograd.grad(weighted_loss((output.data, h, c)),
                                                          [pack.data, *layer.parameters()])]
        results[setting] = padded + packed
    for a, b in zip(results["0"], results["1"]):
        assert torch.equal(a, b)
    check_against_reference(args, TOLERANCES[dtype])


# (dtype, (T, B, I, S), TF32 allowed) -> the route a CUDA call takes by default
CUDA_ROUTES = [
    (torch.float32, (8, 32, 8, 64), False, sequence.FUSED),  # short, small: the fused kernels
    (torch.bfloat16, (8, 32, 8, 64), False, sequence.FUSED),
    (torch.float64, (8, 32, 8, 64), False, sequence.FUSED),
    (torch.float16, (200, 32, 8, 64), False, sequence.ONE_CALL),  # 16-bit: persistent wherever they fit
    (torch.bfloat16, (200, 32, 128, 256), False, sequence.ONE_CALL),
    (torch.bfloat16, (1000, 64, 256, 256), False, sequence.ONE_CALL),
    (torch.bfloat16, (500, 32, 512, 512), False, sequence.ONE_CALL),
    (torch.float16, (128, 32, 8, 64), False, sequence.FUSED),  # up to FUSED_MAX_STEPS: the fused kernels
    (torch.float32, (128, 32, 8, 64), False, sequence.FUSED),
    (torch.float32, (129, 32, 8, 64), False, sequence.ONE_CALL),  # past FUSED_MAX_STEPS: the persistent kernels
    (torch.float32, (50, 64, 256, 512), False, sequence.ONE_CALL),  # T*B*S at FUSED_MAX_WORK
    (torch.float32, (50, 64, 256, 512), True, sequence.ONE_CALL),
    (torch.float64, (16, 16, 512, 128), False, sequence.ONE_CALL),
    (torch.float32, (15, 16, 512, 128), False, sequence.ONE_CALL),  # few steps, full precision: not replayed
    (torch.float32, (15, 16, 512, 128), True, sequence.REPLAYED),  # few steps, TF32: replayed
    (torch.bfloat16, (50, 64, 256, 512), False, sequence.ONE_CALL),
    (torch.bfloat16, (100, 256, 512, 1024), False, sequence.REPLAYED),  # too large for registers: replayed
    (torch.float32, (100, 256, 512, 1024), False, sequence.STEPS),  # too large for registers, GPU-bound
    (torch.float32, (100, 256, 512, 1024), True, sequence.REPLAYED),
    (torch.float32, (1, 4, 8, 4096), False, sequence.STEPS),  # too large for shared memory and registers
]


@requires_cuda
@pytest.mark.parametrize("dtype,shape,tf32,want", CUDA_ROUTES, ids=str)
def test_route_by_default(monkeypatch, dtype, shape, tf32, want):
    monkeypatch.delenv(sequence.PERSISTENT_ENV_VAR, raising=False)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    assert sequence._route(torch.empty(1, device="cuda", dtype=dtype), *shape) == want
    if want == sequence.REPLAYED:
        monkeypatch.setenv(graphs.ENV_VAR, "0")
        assert sequence._route(torch.empty(1, device="cuda", dtype=dtype), *shape) == sequence.STEPS


# (dtype, (T, B, I, S)) -> the routes by default of a call that wants no gradient and of one that does
CUDA_INFERENCE_ROUTES = [
    (torch.float32, (32, 4, 64, 64), sequence.ONE_CALL, sequence.FUSED),  # inference: persistent from 32 steps
    (torch.bfloat16, (64, 16, 32, 32), sequence.ONE_CALL, sequence.FUSED),
    (torch.float64, (32, 32, 8, 64), sequence.ONE_CALL, sequence.FUSED),
    (torch.float32, (31, 32, 8, 64), sequence.FUSED, sequence.FUSED),  # fewer steps: the fused forward
    (torch.float16, (4, 1, 8, 64), sequence.FUSED, sequence.FUSED),  # also at a batch of one
    (torch.bfloat16, (24, 32, 128, 64), sequence.FUSED, sequence.FUSED),  # and with a wide input
    (torch.float32, (100, 4, 16, 64), sequence.ONE_CALL, sequence.FUSED),  # training: fused up to 128 steps
]


@requires_cuda
@pytest.mark.parametrize("dtype,shape,inference,training", CUDA_INFERENCE_ROUTES, ids=str)
def test_inference_route_by_default(monkeypatch, dtype, shape, inference, training):
    """Where the fused kernels run, a call that wants no gradient takes the persistent kernels
    from PERSISTENT_INFERENCE_FROM_STEPS steps; a forced route applies to both."""
    monkeypatch.delenv(sequence.PERSISTENT_ENV_VAR, raising=False)
    t = torch.empty(1, device="cuda", dtype=dtype)
    assert (sequence._route(t, *shape, inference=True), sequence._route(t, *shape)) == (inference, training)
    for choice, route in (("fused", sequence.FUSED), ("1", sequence.ONE_CALL)):
        monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, choice)
        assert sequence._route(t, *shape, inference=True) == sequence._route(t, *shape) == route


@pytest.mark.parametrize("steps,batch,features,state", [(32, 6, 8, 64), (40, 1, 3, 33), (32, 7, 5, 90),
                                                        (33, 3, 250, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_inference(device, dtype, steps, batch, features, state):
    """A call that wants no gradient (on CUDA at these sizes the persistent kernels, where a
    training call takes the fused ones) against the float64 reference, the same bits in
    inference mode, under no_grad and with inputs that require no grad."""
    args = [a.detach() for a in seq_args(steps, batch, features, state, dtype, device)]
    if device == "cuda":
        assert sequence._route(args[0], steps, batch, features, state, inference=True) == sequence.ONE_CALL
    with torch.inference_mode():
        got = ours(*args)
    with torch.no_grad():
        assert all(torch.equal(g, w) for g, w in zip(ours(*[a.clone().requires_grad_() for a in args]), got))
    assert all(torch.equal(g, w) for g, w in zip(ours(*args), got))
    want = reference(*[a.to(torch.float64) for a in args])
    assert all(g.dtype == dtype for g in got)
    assert_near_reference(got, want, plain_results(args, grads=False),
                          low_precision_tolerance(TOLERANCES[dtype], dtype, steps))


@requires_cuda
@pytest.mark.parametrize("steps,batch,features,state", [
    (8, 32, 8, 64),      # the benchmark's small size: 4 lanes an output, one row of 64 columns a block
    (5, 7, 3, 33),       # an odd state: 4 lanes, a last warp part empty
    (3, 5, 2, 90),       # 2 lanes an output, a last warp part empty
    (40, 9, 2, 16),      # 4 rows a block, a last block with one; T*B = 360 rows: the products take several chunks
    (4, 3, 0, 8),        # no input features: d_input empty, the weight gradient is W_h's alone
    (3, 2, 3, 130),      # one lane an output (130 columns, 160 threads); float64 does not fit
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64], ids=str)
def test_fused_kernels(monkeypatch, steps, batch, features, state, dtype):
    """The fused kernels at the sizes that exercise their layout: they are the route taken,
    match the float64 reference and give the same bits on every call.  Where the weights do
    not fit in shared memory (float64 at 130 columns), another route runs, as right."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "fused")
    args = seq_args(steps, batch, features, state, dtype, "cuda")
    fits = not (dtype == torch.float64 and state == 130)
    assert (sequence._route(args[0], steps, batch, features, state) == sequence.FUSED) == fits
    check_against_reference(args, TOLERANCES[dtype])
    check_repeatable(args)


@requires_cuda
@pytest.mark.parametrize("steps,batch", [(6, 5), (3, 0), (0, 5)])
def test_fused_kernels_write_every_element(steps, batch):
    """Every element of every output of the C entry points is written, over buffers filled
    with NaN: also the weight and bias gradients of a sequence without rows (zeros), and with
    no step c_n = c0, d_h0 = 0 and d_c0 = grad_c_n."""
    features, state = 4, 24
    x, w, b, h0, c0 = [a.detach() for a in seq_args(steps, batch, features, state, torch.float32, "cuda")]
    code = pyroundlib._common.DTYPE_CODES[torch.float32]
    nan = lambda *shape: torch.full(shape, float("nan"), device="cuda")  # noqa: E731
    output, cells, gates, c_n = nan(steps, batch, state), nan(steps, batch, state), nan(steps, batch, 3 * state), \
        nan(batch, state)
    sequence._fused_forward_kernel(x, x.data_ptr(), w.data_ptr(), b.data_ptr(), h0.data_ptr(), c0.data_ptr(),
                                   output.data_ptr(), cells.data_ptr(), gates.data_ptr(), c_n.data_ptr(), steps, batch,
                                   features, state, code)
    grad_output, grad_c_n = torch.randn(steps, batch, state, device="cuda"), torch.randn(batch, state, device="cuda")
    grads = d_gates, d_x, d_w, d_b, d_h0, d_c0 = (nan(steps, batch, 3 * state), nan(*x.shape), nan(*w.shape),
                                                  nan(*b.shape), nan(batch, state), nan(batch, state))
    sequence._fused_backward_kernel(x, grad_output.data_ptr(), grad_c_n.data_ptr(), x.data_ptr(), w.data_ptr(),
                                    h0.data_ptr(), c0.data_ptr(), output.data_ptr(), cells.data_ptr(),
                                    gates.data_ptr(), *(g.data_ptr() for g in grads), steps, batch, features, state,
                                    code)
    for t in (output, cells, gates, c_n, *grads):
        assert torch.isfinite(t).all()
    if steps * batch == 0:
        assert not d_w.any() and not d_b.any()
    if steps == 0:
        assert torch.equal(c_n, c0) and not d_h0.any() and torch.equal(d_c0, grad_c_n)
    else:
        assert torch.equal(c_n, cells[-1])


@requires_cuda
def test_fused_kernels_refuse_what_does_not_fit(monkeypatch):
    """Where the weights do not fit in shared memory, the route is another one, and the C entry
    points refuse to launch, naming the sizes."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "fused")
    x = torch.empty(1, device="cuda")
    assert sequence._route(x, 1, 4, 8, 4096) != sequence.FUSED
    lib = pyroundlib._ffi.library()
    fits = ctypes.c_int(7)
    lib.prl_lltm_sequence_fused_cuda_fits(4, 8, 4096, 0, 0, ctypes.byref(fits))
    assert fits.value == 0
    with pytest.raises(pyroundlib.InvalidArgumentError, match="does not fit"):
        lib.prl_lltm_sequence_fused_forward_cuda(1, 1, 1, 1, 1, 1, 1, 1, None, 1, 4, 8, 4096, 0, 0, None)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="'features'"):
        lib.prl_lltm_sequence_fused_forward_cuda(1, 1, 1, 1, 1, 1, 1, 1, None, 1, 4, -1, 8, 0, 0, None)


@pytest.mark.parametrize("product", ["own", "torch's BLAS"])
@pytest.mark.parametrize("steps,batch,features,state", [(5, 1, 16, 256), (12, 1, 5, 400), (8, 2, 7, 300),
                                                       (6, 4, 0, 256), (16, 4, 8, 256)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_cpu_loop_small_batch_wide_state(monkeypatch, product, steps, batch, features, state, dtype):
    """The CPU loop where the batch is too small for the threads: with the library's own
    product, at 3 threads, the grid of rows and state columns at the last four sizes (states of
    400 and 300 not in whole 32-column panels: the parts' boundary panels computed twice), and
    one-row tiles of 2-4 panels for a batch of one, the panels left over one by one; with
    torch's BLAS (batches of at most 4 rows; handed over here whatever the CPU) one BLAS call a
    step, but the grid at (16, 4, 8, 256), 64 rows a sequence.  Against the float64 reference,
    every gradient, at one and at several threads."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    lib = pyroundlib._ffi.library()
    gemm = (None, None) if product == "own" else _threads.blas_gemm(any_cpu=True)
    if product != "own" and not gemm[0]:
        pytest.skip("torch exports no BLAS")
    _threads.follow_torch()
    before = torch.get_num_threads()
    lib.prl_set_cpu_gemm(*gemm)
    try:
        for threads in (1, 3):
            torch.set_num_threads(threads)
            check_against_reference(seq_args(steps, batch, features, state, dtype, "cpu"), TOLERANCES[dtype])
    finally:
        torch.set_num_threads(before)
        lib.prl_set_cpu_gemm(*_threads._given["gemm"])


def test_cpu_route_by_default(monkeypatch):
    """Unset, the CPU loop in the library runs at every size, in every dtype; =1 forces it,
    =0 the step loop."""
    monkeypatch.delenv(sequence.PERSISTENT_ENV_VAR, raising=False)
    for dtype, shape, want in [(torch.float32, (8, 32, 8, 64), sequence.ONE_CALL),
                               (torch.bfloat16, (8, 32, 8, 64), sequence.ONE_CALL),
                               (torch.float64, (100, 64, 8, 100), sequence.ONE_CALL),
                               (torch.float32, (50, 64, 256, 512), sequence.ONE_CALL),
                               (torch.float32, (1, 2**20, 8, 1024), sequence.STEPS)]:  # B*3S >= 2^31
        assert sequence._route(torch.empty(1, dtype=dtype), *shape) == want, (dtype, shape)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    assert sequence._route(torch.empty(1), 50, 64, 256, 512) == sequence.ONE_CALL
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    assert sequence._route(torch.empty(1), 8, 32, 8, 64) == sequence.STEPS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cpu_input_half(monkeypatch, dtype):
    """The CPU loops' input half x @ W_x^T + b: the library's product below
    INPUT_HALF_IN_LIBRARY_BELOW multiply-adds (prl_lltm_input_half_cpu, every element written:
    the buffer starts as NaN), a torch GEMM from there on; both against float64 sums of the
    same stored inputs, with a bias and with none (the C function's NULL).  Torch's GEMMs
    first (PYROUNDLIB_CPU_BLAS=1), as on Intel CPUs: test_cpu_large_input_half has the rest."""
    monkeypatch.setenv(_threads.BLAS_ENV_VAR, "1")
    calls = []
    kernel = sequence._input_half_kernel
    monkeypatch.setattr(sequence, "_input_half_kernel", lambda t, *args: (calls.append(args), kernel(t, *args)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *shape: torch.full(shape, float("nan"), dtype=t.dtype))
    gen = torch.Generator().manual_seed(5)
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    for shape, state, in_library in [((190, 8), 64, True), ((3, 7, 5), 4, True), ((1, 1), 1, True), ((6, 0), 5, True),
                                     ((48, 64), 64, False)]:  # 48 * 64 * 192 >= 2^19
        x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
        w = torch.randn(3 * state, state + shape[-1], generator=gen, dtype=torch.float64).to(dtype)
        b = torch.randn(3 * state, generator=gen, dtype=torch.float64).to(dtype)
        calls.clear()
        got = sequence.input_half(x, w, b, state)
        want = x.double() @ w.double()[:, state:].t() + b.double()
        assert (len(calls) == 1) == in_library, shape
        assert got.dtype == dtype and got.shape == want.shape and not got.isnan().any()
        assert torch.allclose(got.double(), want, rtol=tol, atol=tol), (shape, (got.double() - want).abs().max())
    lib = pyroundlib._ffi.library()
    gates = torch.full((190, 192), float("nan"), dtype=dtype)
    x, w = torch.randn(190, 8, dtype=dtype), torch.randn(192, 72, dtype=dtype)
    lib.prl_lltm_input_half_cpu(x.data_ptr(), w.data_ptr(), None, gates.data_ptr(), 190, 8, 64,
                                pyroundlib._common.DTYPE_CODES[dtype])
    assert torch.allclose(gates.double(), x.double() @ w.double()[:, 64:].t(), rtol=tol, atol=tol)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="'rows'"):
        lib.prl_lltm_input_half_cpu(x.data_ptr(), w.data_ptr(), None, gates.data_ptr(), -1, 8, 64, 0)


@pytest.mark.parametrize("blas", ["", "0", "1"])
def test_cpu_large_input_half(monkeypatch, blas):
    """From INPUT_HALF_IN_LIBRARY_BELOW multiply-adds on: torch's GEMM where torch's GEMMs come
    first (Intel CPUs; any CPU with PYROUNDLIB_CPU_BLAS=1), else (=0; CPUs other than Intel's)
    the library's product from INPUT_HALF_IN_LIBRARY_FROM_FEATURES features on, torch's GEMM
    below; every element written (the buffer starts as NaN), against float64 sums."""
    monkeypatch.setenv(_threads.BLAS_ENV_VAR, blas)
    first = {"": _threads._intel_cpu() or "avx512f" not in _threads._cpu_flags(), "0": False, "1": True}[blas]
    assert _threads.torch_gemms_first() == first
    calls = []
    kernel = sequence._input_half_kernel
    monkeypatch.setattr(sequence, "_input_half_kernel", lambda t, *args: (calls.append(args), kernel(t, *args)))
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda t, *shape: torch.full(shape, float("nan"), dtype=t.dtype))
    gen = torch.Generator().manual_seed(6)
    for shape, state in [((7, 50, 40), 64), ((600, 16), 64)]:  # 2.7M and 1.8M multiply-adds
        assert math.prod(shape) * 3 * state >= sequence.INPUT_HALF_IN_LIBRARY_BELOW
        x = torch.randn(shape, generator=gen)
        w, b = torch.randn(3 * state, state + shape[-1], generator=gen) * 0.2, torch.randn(3 * state, generator=gen)
        calls.clear()
        got = sequence.input_half(x, w, b, state)
        want = x.double() @ w.double()[:, state:].t() + b.double()
        assert (len(calls) == 1) == (not first and shape[-1] >= sequence.INPUT_HALF_IN_LIBRARY_FROM_FEATURES), shape
        assert got.shape == want.shape and not got.isnan().any()
        assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5), (shape, (got.double() - want).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_cpu_matmul(dtype):
    """prl_matmul_cpu: c = a @ b and a^T @ b against float64 products of the same stored values,
    with row strides longer than the rows (only each row's first elements read or written: the
    rest of c stays as it was), every element of c written (NaN-filled), k = 0 (zeros), m = 0,
    and errors that name the argument."""
    lib, code = pyroundlib._ffi.library(), pyroundlib._common.DTYPE_CODES[dtype]
    tol = {torch.float32: 1e-5, torch.float64: 1e-12, torch.bfloat16: 1e-2, torch.float16: 2e-3}[dtype]
    gen = torch.Generator().manual_seed(7)
    m, n, k = 53, 37, 29
    for transposed in (0, 1):
        a_full = torch.randn((k, m + 3) if transposed else (m, k + 3), generator=gen, dtype=torch.float64).to(dtype)
        a = a_full[:, :m] if transposed else a_full[:, :k]
        b_full = torch.randn(k, n + 5, generator=gen, dtype=torch.float64).to(dtype)
        b = b_full[:, :n]
        c_full = torch.full((m, n + 2), float("nan"), dtype=dtype)
        lib.prl_matmul_cpu(a.data_ptr(), a.stride(0), transposed, b.data_ptr(), b.stride(0), c_full.data_ptr(),
                           c_full.stride(0), m, n, k, code)
        want = (a.double().t() if transposed else a.double()) @ b.double()
        c = c_full[:, :n]
        assert not c.isnan().any() and c_full[:, n:].isnan().all()
        assert torch.allclose(c.double(), want, rtol=tol, atol=tol), (transposed, (c.double() - want).abs().max())
    zeros = torch.full((4, 3), float("nan"), dtype=dtype)
    lib.prl_matmul_cpu(None, 1, 0, None, 3, zeros.data_ptr(), 3, 4, 3, 0, code)
    assert (zeros == 0).all()
    lib.prl_matmul_cpu(None, 5, 0, None, 3, None, 3, 0, 3, 5, code)
    x = torch.ones(8, 8, dtype=dtype)
    for args, name in [((x.data_ptr(), 8, 2, x.data_ptr(), 8, x.data_ptr(), 8, 8, 8, 8, code), "'transpose_a'"),
                       ((x.data_ptr(), 8, 0, x.data_ptr(), 8, x.data_ptr(), 8, -1, 8, 8, code), "'m'"),
                       ((x.data_ptr(), 8, 0, x.data_ptr(), 8, x.data_ptr(), 8, 8, 8, -2, code), "'k'"),
                       ((x.data_ptr(), 4, 0, x.data_ptr(), 8, x.data_ptr(), 8, 8, 8, 8, code), "lda=4"),
                       ((None, 8, 0, x.data_ptr(), 8, x.data_ptr(), 8, 8, 8, 8, code), "'a'"),
                       ((x.data_ptr(), 8, 0, x.data_ptr(), 8, None, 8, 8, 8, 8, code), "'c'")]:
        with pytest.raises(pyroundlib.InvalidArgumentError, match=name):
            lib.prl_matmul_cpu(*args)
    with pytest.raises(pyroundlib.UnsupportedDtypeError):
        lib.prl_matmul_cpu(x.data_ptr(), 8, 0, x.data_ptr(), 8, x.data_ptr(), 8, 8, 8, 8, 17)


@pytest.mark.parametrize("blas", ["0", "1"])
def test_cpu_gradient_products(monkeypatch, blas):
    """A CPU sequence's input and weight gradients of all steps: the library's products where
    torch's GEMMs do not come first (=0; CPUs other than Intel's) and the product has 32 columns
    or more (the input gradient's I, the weight gradient's S + I), torch's GEMMs otherwise and
    with =1; all against the float64 reference's gradients, on the library loop and the step
    loop."""
    monkeypatch.setenv(_threads.BLAS_ENV_VAR, blas)
    calls = []
    kernel = sequence._matmul_kernel
    monkeypatch.setattr(sequence, "_matmul_kernel", lambda t, *args: (calls.append(args[2]), kernel(t, *args)))
    # (steps, batch, features, state), which products the library runs (transpose_a: 0 the input
    # gradient's, 1 the weight gradient's); k = T*B = 512, a power of two, in the first
    for size, library in [((16, 32, 96, 64), [0, 1]), ((6, 5, 16, 24), [1]), ((7, 3, 4, 16), [])]:
        steps, batch, features, state = size
        for route in ("1", "0"):
            monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
            args = seq_args(steps, batch, features, state, torch.float32, "cpu")
            calls.clear()
            output, (h, c) = pyroundlib.lltm_sequence(args[0], args[1], args[2], (args[3], args[4]))
            grad = torch.randn_like(output)
            got = torch.autograd.grad(output, args, grad)
            assert calls == (library if blas == "0" else []), (size, route, calls)
            ref = [t.detach().double().requires_grad_() for t in args]
            want_out, _, _ = reference(*ref)
            want = torch.autograd.grad(want_out, ref, grad.double())
            for name, g, w in zip(["input", "weights", "bias", "h0", "c0"], got, want):
                assert torch.allclose(g.double(), w, rtol=1e-4, atol=1e-4), (size, route, name,
                                                                             (g.double() - w).abs().max())


def test_cpu_gradient_products_of_a_pack(monkeypatch):
    """A packed batch's input and weight gradients on the CPU (LLTMLayer over a PackedSequence):
    the library's products where torch's GEMMs do not come first (=0), torch's with =1; the
    two agree, and the library ran both products (a [rows, 3S] x [3S, I] and a transposed
    [3S, rows] x [rows, S + I])."""
    calls = []
    kernel = sequence._matmul_kernel
    monkeypatch.setattr(sequence, "_matmul_kernel", lambda t, *args: (calls.append(args[2]), kernel(t, *args)))
    torch.manual_seed(3)
    layer = pyroundlib.LLTMLayer(40, 32).double()
    lengths = [9, 4, 7, 2, 9]
    x = torch.randn(9, 5, 40, dtype=torch.float64)
    results = {}
    for blas in ("0", "1"):
        monkeypatch.setenv(_threads.BLAS_ENV_VAR, blas)
        calls.clear()
        xs = x.clone().requires_grad_()
        pack = torch.nn.utils.rnn.pack_padded_sequence(xs, lengths, enforce_sorted=False)
        out, (h, c) = layer(pack)
        loss = (out.data * torch.linspace(0.5, 1.5, 32, dtype=torch.float64)).sum() + 2 * h.sum() + 3 * c.sum()
        results[blas] = torch.autograd.grad(loss, [xs, *layer.parameters()])
        assert sorted(calls) == ([0, 1] if blas == "0" else []), (blas, calls)
    for a, b in zip(results["0"], results["1"]):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-10), (a - b).abs().max()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_cuda_input_half_by_torch(monkeypatch, dtype):
    """The persistent route's input half: the library's own product below its dtype's threshold,
    one torch GEMM before the library call from there on (float32 and 16 bits; float64 never).
    Thresholds lowered to 0, so a small sequence takes the GEMM: outputs and gradients against
    the float64 reference either way, and the GEMM's route is the one taken."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    torch.backends.cuda.matmul.allow_tf32 = False
    args = seq_args(19, 3, 8, 32, dtype, "cuda")
    assert sequence._route(args[0], 19, 3, 8, 32) == sequence.ONE_CALL
    calls = []
    for name in ("_persistent_forward_kernel", "_sequence_forward_kernel"):
        kernel = getattr(sequence, name)
        monkeypatch.setattr(sequence, name, lambda t, *a, name=name, kernel=kernel: (calls.append(name), kernel(t, *a)))
    for lowered in (False, True):
        if lowered:
            monkeypatch.setattr(sequence, "INPUT_HALF_BY_TORCH_FROM", 0)
            monkeypatch.setattr(sequence, "INPUT_HALF_BY_TORCH_FROM_FLOAT32", 0)
        calls.clear()
        check_against_reference(args, TOLERANCES[dtype])
        by_torch = lowered and dtype != torch.float64
        assert calls == ["_sequence_forward_kernel" if by_torch else "_persistent_forward_kernel"], calls


@requires_cuda
def test_persistent_kernels_do_not_fit_large_states(monkeypatch):
    """Where the weights do not fit on chip the route is the step-by-step one, and the C
    entry point refuses to launch rather than run a grid that cannot be co-resident."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    x = torch.empty(1, device="cuda")
    assert sequence._route(x, 1, 4096, 8, 8192) != sequence.ONE_CALL
    lib = pyroundlib._ffi.library()
    with pytest.raises(pyroundlib.InvalidArgumentError, match="does not fit"):
        lib.prl_lltm_sequence_forward_cuda(1, 1, 8192, 1, 1, 1, 1, 1, 1, 4096, 8192, 0, 0, None)
    # the whole forward plans the grid before it launches anything (these pointers are not
    # memory: its input half must not run)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="does not fit"):
        lib.prl_lltm_sequence_persistent_forward_cuda(1, 1, 1, 1, 1, 1, 1, 1, None, 1, 4096, 8, 8192, 0, 0, None)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="'features'"):
        lib.prl_lltm_sequence_persistent_forward_cuda(1, 1, 1, 1, 1, 1, 1, 1, None, 1, 4, -1, 8, 0, 0, None)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="argument 'weights' is NULL"):
        lib.prl_lltm_sequence_persistent_forward_cuda(1, None, 1, 1, 1, 1, 1, 1, None, 1, 4, 8, 8, 0, 0, None)
    torch.cuda.synchronize()  # nothing was launched over those pointers


@requires_cuda
@pytest.mark.parametrize("steps,batch", [(6, 5), (3, 0), (0, 5)])
def test_persistent_forward_writes_every_element(steps, batch):
    """The persistent route's whole forward writes every element of its outputs (buffers
    filled with NaN), its gates are the pre-activations x_t W_x^T + b + h_{t-1} W_h^T (the
    input half it forms first, checked in float64), and with no step c_n = c0."""
    features, state = 20, 40
    x, w, b, h0, c0 = [a.detach() for a in seq_args(steps, batch, features, state, torch.float32, "cuda")]
    nan = lambda *shape: torch.full(shape, float("nan"), device="cuda")  # noqa: E731
    output, cells, gates, c_n = nan(steps, batch, state), nan(steps, batch, state), nan(steps, batch, 3 * state), \
        nan(batch, state)
    sequence._persistent_forward_kernel(x, x.data_ptr(), w.data_ptr(), b.data_ptr(), h0.data_ptr(), c0.data_ptr(),
                                        output.data_ptr(), cells.data_ptr(), gates.data_ptr(), c_n.data_ptr(), steps,
                                        batch, features, state, pyroundlib._common.DTYPE_CODES[torch.float32])
    for t in (output, cells, gates, c_n):
        assert torch.isfinite(t).all()
    if steps == 0:
        assert torch.equal(c_n, c0)
        return
    assert torch.equal(c_n, cells[-1])
    h_prev = torch.cat([h0.unsqueeze(0), output[:-1]]).double()
    want = torch.cat([h_prev, x.double()], dim=2) @ w.double().t() + b.double()
    torch.testing.assert_close(gates.double(), want, rtol=1e-5, atol=1e-5)


@requires_two_gpus
@pytest.mark.parametrize("route", ["1", "0", "fused"])
def test_second_device_while_first_is_current(monkeypatch, route):
    """Each CUDA route (persistent, step by step replayed from CUDA graphs, fused) on cuda:1
    while cuda:0 is current, one shape on both devices in turn: the library launches on the
    tensors' device and leaves the caller's current, and what is kept per device (the route,
    whether the kernels fit, the graphs and their memory pool) does not mix the two."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    torch.cuda.set_device(0)
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        args = seq_args(6, 3, 4, 8, torch.float32, device)
        check_against_reference(args, TOLERANCES[torch.float32])
        check_repeatable(args)  # the same tensors again: step by step, a graph replay
        assert torch.cuda.current_device() == 0
    with torch.cuda.device(1):  # cuda:1's tensors from a stream of cuda:1 that is not its default
        stream = torch.cuda.Stream()
        args = seq_args(6, 3, 4, 8, torch.float32, "cuda:1")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            check_against_reference(args, TOLERANCES[torch.float32])
        torch.cuda.current_stream().wait_stream(stream)


@requires_two_gpus
@pytest.mark.parametrize("state", [64, 256], ids=["one-column-tile", "cluster"])
def test_tensor_cores_on_the_second_device(monkeypatch, state):
    """16-bit persistent kernels on tensor cores on cuda:1 while cuda:0 is current: each
    device plans its own grid (and sets its kernels' attributes), and the library launches
    on the tensors' device."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    monkeypatch.setenv(sequence.TENSOR_CORES_ENV_VAR, "1")
    torch.cuda.set_device(0)
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        args = seq_args(6, 5, 4, state, torch.bfloat16, device)
        check_against_reference(args, TOLERANCES[torch.bfloat16])
        check_repeatable(args)
        assert torch.cuda.current_device() == 0


@requires_two_gpus
@pytest.mark.parametrize("order", [("cuda:0", "cuda:1"), ("cuda:1", "cuda:0")], ids=["0-then-1", "1-then-0"])
@pytest.mark.parametrize("keep_results", [False, True], ids=["training-loop", "new-tensors-each-call"])
@pytest.mark.parametrize("route", ["1", "0", "fused"])
def test_second_device_after_the_first_captured(route, keep_results, order):
    """Each CUDA route, every dtype, forward and backward, replays included, on both GPUs one
    after the other in a fresh process while cuda:0 is current: a first capture on one device
    (a second model, a pipeline stage, evaluation on another GPU) must not decide where the
    other device's graphs are captured or replayed."""
    run_replays(route=route, devices=order, keep_results=keep_results)

