"""LLTM (native pointwise steps) against the tutorial's plain-PyTorch cell."""
import math

import pytest
import torch

import pyroundlib
from pyroundlib import _common
from pyroundlib.reference import lltm_cell_reference

from conftest import TOLERANCES, make_args

NAMES = ["input", "weights", "bias", "old_h", "old_cell"]


def clone_args(args):
    return [a.detach().clone().requires_grad_(a.requires_grad) for a in args]


def assert_matches(name, got, ref, truth):
    """float64: close to the reference.  Other dtypes: both we and the reference are off
    by rounding (and sums of hundreds of rounded terms in the GEMMs), so our error against
    the float64 truth must be no worse than twice the reference's, plus a tolerance
    relative to the values' magnitude."""
    assert got.shape == ref.shape and got.dtype == ref.dtype
    if got.numel() == 0:
        return
    scale = max(1.0, truth.abs().max().item())
    if got.dtype == torch.float64:
        torch.testing.assert_close(got, ref, rtol=1e-10, atol=1e-12 * scale, msg=lambda m: f"{name}: {m}")
        return
    ours = (got.double() - truth).abs().max().item()
    theirs = (ref.double() - truth).abs().max().item()
    limit = 2 * theirs + TOLERANCES[got.dtype]["atol"] * scale
    assert ours <= limit, f"{name}: error {ours} vs the reference's {theirs} (limit {limit}, scale {scale})"


def check_against_reference(args, cell=pyroundlib.lltm_cell):
    ref_args = clone_args(args)
    truth_args = [a.detach().double().requires_grad_() for a in args]
    h, c = cell(*args)
    rh, rc = lltm_cell_reference(*ref_args)
    th, tc = lltm_cell_reference(*truth_args)
    assert_matches("new_h", h, rh, th.detach())
    assert_matches("new_cell", c, rc, tc.detach())
    gh, gc = torch.randn_like(h), torch.randn_like(c)
    grads = torch.autograd.grad((h, c), args, (gh, gc))
    ref_grads = torch.autograd.grad((rh, rc), ref_args, (gh, gc))
    truth_grads = torch.autograd.grad((th, tc), truth_args, (gh.double(), gc.double()))
    for name, g, rg, tg in zip(NAMES, grads, ref_grads, truth_grads):
        assert_matches(f"gradient of {name}", g, rg, tg)


@pytest.mark.parametrize("batch,features,state", [(1, 1, 1), (3, 5, 4), (16, 32, 128), (7, 13, 33), (64, 3, 257)])
def test_matches_reference(device, dtype, batch, features, state):
    check_against_reference(make_args(batch, features, state, dtype, device))


@pytest.mark.parametrize("batch,features,state", [(3, 5, 4), (7, 13, 33)])
def test_lltm_function_of_0_2_0(device, dtype, batch, features, state):
    """LLTMFunction, the tutorial-shaped Function public in 0.2.0, is back: the cell's
    outputs and first derivatives in every input; gradcheck in float64."""
    check_against_reference(make_args(batch, features, state, dtype, device), pyroundlib.LLTMFunction.apply)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(pyroundlib.LLTMFunction.apply, make_args(batch, features, state, dtype, device))


def test_large_gate_values(device, dtype):
    # saturated sigmoids/tanh, ELU deep in its negative branch
    check_against_reference(make_args(8, 6, 10, dtype, device, scale=8.0))


def test_empty_batch(device, dtype):
    args = make_args(0, 4, 3, dtype, device)
    h, c = pyroundlib.lltm_cell(*args)
    assert h.shape == (0, 3) and c.shape == (0, 3)
    (h.sum() + c.sum()).backward()
    assert args[1].grad.shape == args[1].shape and torch.all(args[1].grad == 0)


def test_non_contiguous_inputs(device, dtype):
    batch, features, state = 5, 6, 7
    args = make_args(batch, features, state, dtype, device, requires_grad=False)
    views = [
        torch.randn(features, batch, dtype=torch.float64).to(dtype=dtype, device=device).t(),     # transposed
        args[1].t().contiguous().t(),                                                              # column-major
        torch.randn(6 * state, dtype=torch.float64).to(dtype=dtype, device=device)[::2],          # strided
        torch.randn(batch * state + 3, dtype=torch.float64).to(dtype=dtype, device=device)[3:].view(batch, state),
        torch.randn(batch, 2 * state, dtype=torch.float64).to(dtype=dtype, device=device)[:, ::2],
    ]
    before = [v.clone() for v in views]
    check_against_reference([v.requires_grad_() for v in views])
    for v, b in zip(views, before):
        assert torch.equal(v.detach(), b)  # inputs untouched


@pytest.mark.parametrize("used", ["h", "cell"])
def test_one_output_used(device, used):
    # The other output's gradient reaches the native backward as NULL (zero).
    args = make_args(4, 3, 5, torch.float64, device)
    ref_args = clone_args(args)
    out = pyroundlib.lltm_cell(*args)[0 if used == "h" else 1]
    ref = lltm_cell_reference(*ref_args)[0 if used == "h" else 1]
    (out * 2).sum().backward()
    (ref * 2).sum().backward()
    for name, a, r in zip(NAMES, args, ref_args):
        assert_matches(name, a.grad, r.grad, r.grad)


def test_partial_requires_grad(device):
    args = make_args(4, 3, 5, torch.float64, device, requires_grad=False)
    args[1].requires_grad_()
    h, c = pyroundlib.lltm_cell(*args)
    (gw,) = torch.autograd.grad(h.sum() + c.sum(), args[1])
    ref_args = clone_args(args)
    rh, rc = lltm_cell_reference(*ref_args)
    (rgw,) = torch.autograd.grad(rh.sum() + rc.sum(), ref_args[1])
    torch.testing.assert_close(gw, rgw)


def test_gradcheck_float64(device):
    args = make_args(3, 4, 5, torch.float64, device)
    assert torch.autograd.gradcheck(pyroundlib.lltm_cell, args)
    assert torch.autograd.gradcheck(lambda *a: pyroundlib.lltm_cell(*a)[0], args)


def test_gradcheck_pointwise_op_float64(device):
    gates = torch.randn(3, 12, dtype=torch.float64, device=device, requires_grad=True)
    old_cell = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(torch.ops.pyroundlib.lltm_forward, (gates, old_cell))


def test_every_element_written(device, dtype):
    batch, state = 37, 29
    gates = torch.randn(batch, 3 * state, device=device).to(dtype)
    old_cell = torch.randn(batch, state, device=device).to(dtype)
    grad_h, grad_cell = torch.randn_like(old_cell), torch.randn_like(old_cell)
    code = _common.DTYPE_CODES[dtype]
    new_h, new_cell = torch.full_like(old_cell, math.nan), torch.full_like(old_cell, math.nan)
    _common.Kernel("lltm_forward")(gates, gates.data_ptr(), old_cell.data_ptr(), new_h.data_ptr(),
                   new_cell.data_ptr(), batch, state, code)
    d_gates, d_cell = torch.full_like(gates, math.nan), torch.full_like(old_cell, math.nan)
    _common.Kernel("lltm_backward")(gates, grad_h.data_ptr(), grad_cell.data_ptr(), gates.data_ptr(),
                   old_cell.data_ptr(), d_gates.data_ptr(), d_cell.data_ptr(), None, batch, state, code)
    eh, ec = torch.ops.pyroundlib.lltm_forward(gates, old_cell)
    eg, edc, _ = torch.ops.pyroundlib.lltm_backward(grad_h, grad_cell, gates, old_cell)
    for got, want in ((new_h, eh), (new_cell, ec), (d_gates, eg), (d_cell, edc)):
        assert not torch.isnan(got).any()
        assert torch.equal(got, want)


@pytest.mark.parametrize("parts", [0, 1, 3, 4])
@pytest.mark.parametrize("batch,state", [(37, 29), (4, 8), (0, 5)])
@pytest.mark.parametrize("with_grad_h,with_grad_cell", [(True, True), (False, True), (True, False)])
def test_backward_parts(device, dtype, parts, batch, state, with_grad_h, with_grad_cell):
    """prl_lltm_backward_parts_*: the backward whose gradient of new_h is grad_h plus `parts`
    terms, summed in the arithmetic type in order.  Every element written; in float32 and
    float64 the same bits as prl_lltm_backward_* given that sum; in 16-bit types within one
    ulp of the float32 backward of the same values (the sum is not rounded to 16 bits)."""
    gates = (torch.randn(batch, 3 * state, device=device) * 3).to(dtype)
    old_cell = torch.randn(batch, state, device=device).to(dtype)
    grad_h = torch.randn_like(old_cell) if with_grad_h else None
    grad_cell = torch.randn_like(old_cell) if with_grad_cell else None
    terms = torch.randn(parts, batch, state, device=device).to(dtype)
    d_gates, d_cell = torch.full_like(gates, math.nan), torch.full_like(old_cell, math.nan)
    _common.Kernel("lltm_backward_parts")(gates, _common.ptr(grad_h), terms.data_ptr() if parts else None, parts,
                                          _common.ptr(grad_cell), gates.data_ptr(), old_cell.data_ptr(),
                                          d_gates.data_ptr(), d_cell.data_ptr(), batch, state,
                                          _common.DTYPE_CODES[dtype])
    assert not torch.isnan(d_gates).any() and not torch.isnan(d_cell).any()
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    total = torch.zeros_like(old_cell, dtype=wide) if grad_h is None else grad_h.to(wide)
    for term in terms:
        total = total + term.to(wide)
    if parts == 0 and grad_h is None:
        total = None
    want_gates, want_cell, _ = pyroundlib.lltm._lltm_backward(
        total, None if grad_cell is None else grad_cell.to(wide), gates.to(wide), old_cell.to(wide))
    if dtype in (torch.float32, torch.float64):
        assert torch.equal(d_gates, want_gates) and torch.equal(d_cell, want_cell)
    else:
        close = dict(rtol=1e-2, atol=1e-3)  # one 16-bit ulp, and 16-bit arithmetic's approximations on CUDA
        torch.testing.assert_close(d_gates, want_gates.to(dtype), **close)
        torch.testing.assert_close(d_cell, want_cell.to(dtype), **close)


def test_backward_parts_checks_its_arguments(device):
    gates, old_cell = torch.randn(2, 6, device=device), torch.randn(2, 2, device=device)
    out_gates, out_cell, terms = torch.empty_like(gates), torch.empty_like(old_cell), torch.zeros(65, 2, 2, device=device)
    kernel = _common.Kernel("lltm_backward_parts")

    def call(terms_ptr, parts):
        kernel(gates, old_cell.data_ptr(), terms_ptr, parts, None, gates.data_ptr(), old_cell.data_ptr(),
               out_gates.data_ptr(), out_cell.data_ptr(), 2, 2, _common.DTYPE_CODES[torch.float32])

    with pytest.raises(pyroundlib.InvalidArgumentError, match="argument 'parts' must be >= 0"):
        call(terms.data_ptr(), -1)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="argument 'parts' must be <= 64"):
        call(terms.data_ptr(), 65)
    with pytest.raises(pyroundlib.InvalidArgumentError, match="argument 'grad_h_parts' is NULL"):
        call(None, 2)
    call(terms.data_ptr(), 64)
    call(None, 0)


BIAS_SUM_TOLERANCES = {  # d_bias against the float64 sum of the stored d_gates: accumulation + final rounding
    torch.float64: dict(rtol=1e-12, atol=1e-12),
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}


@pytest.mark.parametrize("batch,state", [(0, 5), (1, 1), (37, 29), (300, 64), (17, 40)])
def test_fused_bias_gradient(device, dtype, batch, state):
    """d_bias from the backward kernel: every element written, the column sums of d_gates
    as stored, deterministic; d_gates and d_old_cell as without it."""
    gates = (torch.randn(batch, 3 * state, device=device) * 3).to(dtype)
    old_cell = torch.randn(batch, state, device=device).to(dtype)
    grad_h, grad_cell = torch.randn_like(old_cell), torch.randn_like(old_cell)
    d_gates, d_cell, d_bias = torch.full_like(gates, math.nan), torch.full_like(old_cell, math.nan), \
        torch.full((3 * state,), math.nan, device=device, dtype=dtype)
    _common.Kernel("lltm_backward")(gates, grad_h.data_ptr(), grad_cell.data_ptr(), gates.data_ptr(),
                                    old_cell.data_ptr(), d_gates.data_ptr(), d_cell.data_ptr(), d_bias.data_ptr(),
                                    batch, state, _common.DTYPE_CODES[dtype])
    assert not torch.isnan(d_bias).any() and not torch.isnan(d_gates).any() and not torch.isnan(d_cell).any()
    torch.testing.assert_close(d_bias.double(), d_gates.double().sum(0), **BIAS_SUM_TOLERANCES[dtype])
    plain_gates, plain_cell, none = pyroundlib.lltm._lltm_backward(grad_h, grad_cell, gates, old_cell)
    assert none is None
    close = dict(rtol=0, atol=0) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-6)
    if dtype in (torch.float16, torch.bfloat16):  # a last-bit difference in float becomes one 16-bit ulp at most
        close = dict(rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(d_gates, plain_gates, **close)
    torch.testing.assert_close(d_cell, plain_cell, **close)
    again = pyroundlib.lltm._lltm_backward(grad_h, grad_cell, gates, old_cell, with_bias=True)
    assert torch.equal(again[2], d_bias)  # deterministic: the same bits every time


@pytest.mark.parametrize("fused_up_to", [0, 10**9])
def test_bias_gradient_fused_or_not(device, monkeypatch, fused_up_to):
    """The LLTM gradients are right whichever way the bias gradient is computed on CUDA
    (the CPU always fuses it)."""
    monkeypatch.setattr(pyroundlib.lltm, "FUSED_BIAS_MAX_CUDA_BATCH", fused_up_to)
    check_against_reference(make_args(40, 7, 19, torch.float32, device))


def test_pointwise_ops_against_reference(device, dtype):
    """The two custom ops alone, against autograd through the reference pointwise math in float64."""
    batch, state = 6, 9
    gates = torch.randn(batch, 3 * state, dtype=torch.float64, device=device) * 2
    old_cell = torch.randn(batch, state, dtype=torch.float64, device=device)
    g64, c64 = gates.clone().requires_grad_(), old_cell.clone().requires_grad_()
    i, o, z = g64.chunk(3, dim=1)
    rc = c64 + torch.nn.functional.elu(z) * torch.sigmoid(i)
    rh = torch.tanh(rc) * torch.sigmoid(o)
    gh, gc = torch.randn_like(rh), torch.randn_like(rc)
    rdg, rdc = torch.autograd.grad((rh, rc), (g64, c64), (gh, gc))
    h, c = torch.ops.pyroundlib.lltm_forward(gates.to(dtype), old_cell.to(dtype))
    dg, dc, db = torch.ops.pyroundlib.lltm_backward(gh.to(dtype), gc.to(dtype), gates.to(dtype), old_cell.to(dtype))
    tol = dict(TOLERANCES[dtype])
    if dtype in (torch.float16, torch.bfloat16):  # inputs rounded to 16 bits before the math
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.float16 else dict(rtol=8e-2, atol=8e-2)
    for got, want in ((h, rh), (c, rc), (dg, rdg), (dc, rdc), (db, rdg.sum(0))):
        torch.testing.assert_close(got.double(), want.detach(), **tol)


def test_module(device, dtype):
    torch.manual_seed(0)
    cell = pyroundlib.LLTM(input_features=6, state_size=4).to(device=device, dtype=dtype)
    assert cell.weights.shape == (12, 10) and cell.bias.shape == (12,)
    bound = 1 / math.sqrt(4)
    for p in cell.parameters():
        assert p.abs().max() <= bound and p.abs().max() > bound / 4
    x = torch.randn(3, 6, device=device, dtype=dtype)
    h = torch.zeros(3, 4, device=device, dtype=dtype)
    c = torch.zeros(3, 4, device=device, dtype=dtype)
    for _ in range(3):
        h, c = cell(x, (h, c))
    (h.float().sum() + c.float().sum()).backward()
    assert cell.weights.grad is not None and cell.bias.grad is not None
    assert "input_features=6, state_size=4" in repr(cell)


def test_module_factory_kwargs():
    cell = pyroundlib.LLTM(3, 2, dtype=torch.float64)
    assert cell.weights.dtype == torch.float64


def test_opcheck_lltm_ops(device, dtype):
    gates = torch.randn(3, 12, device=device, dtype=dtype)
    old_cell = torch.randn(3, 4, device=device, dtype=dtype)
    grad = torch.randn(3, 4, device=device, dtype=dtype)
    torch.library.opcheck(torch.ops.pyroundlib.lltm_forward.default, (gates, old_cell))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_forward.default,
                          (gates.clone().requires_grad_(), old_cell.clone().requires_grad_()))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_forward_no_autograd.default, (gates, old_cell))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_backward.default, (grad, grad, gates, old_cell))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_backward.default, (None, grad, gates, old_cell))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_backward.default, (grad, None, gates, old_cell))
    torch.library.opcheck(torch.ops.pyroundlib.lltm_backward.default, (grad, grad, gates, old_cell, False))
    d_gates, _, no_bias = torch.ops.pyroundlib.lltm_backward(grad, grad, gates, old_cell, False)
    assert no_bias.numel() == 0
    torch.testing.assert_close(d_gates, torch.ops.pyroundlib.lltm_backward(grad, grad, gates, old_cell)[0])
    args = make_args(3, 5, 4, dtype, device)
    torch.library.opcheck(torch.ops.pyroundlib.lltm_cell.default, args)


def test_module_default_state_is_zeros(device):
    cell = pyroundlib.LLTM(5, 3).to(device)
    x = torch.randn(4, 5, device=device)
    h0, c0 = cell(x)
    zeros = torch.zeros(4, 3, device=device)
    h1, c1 = cell(x, (zeros, zeros))
    assert torch.equal(h0, h1) and torch.equal(c0, c1)
