"""Property-based tests (hypothesis): whatever both ops are handed — any dtype, shape,
strides, device mix or values — they either match the plain-PyTorch reference (round:
bit for bit; LLTM: within a tolerance) or raise TypeError/ValueError.  Never a crash.

Quick tier by default (CI); `make fuzz` (PYROUNDLIB_FUZZ_EXAMPLES=10000) is the long tier.
"""
import math
import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pyroundlib
from pyroundlib.reference import lltm_cell_reference

from conftest import DEVICES
from test_round import bits_equal

EXAMPLES = int(os.environ.get("PYROUNDLIB_FUZZ_EXAMPLES", "60"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

SUPPORTED = {torch.float32, torch.float64, torch.float16, torch.bfloat16}


def _creatable(dtype):
    try:
        torch.tensor([0.0, 1.5, -2.0]).to(dtype)
        return True
    except (RuntimeError, TypeError):
        return False


# every dtype torch can hold these values in: floating, float8, complex, integer, bool
ALL_DTYPES = sorted((d for d in {v for v in vars(torch).values() if isinstance(v, torch.dtype)} if _creatable(d)),
                    key=str)

SPECIAL = [math.nan, -math.nan, math.inf, -math.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1e-45, -1e-45,
           5e-324, 1e-310, 6e-8, 3e4, 65504.0, 1e30, -1e30, 3.4e38, 1.7e308, 2.0**23 + 0.5, 2.0**52 + 1]

values = st.one_of(st.sampled_from(SPECIAL), st.floats(allow_nan=True, allow_infinity=True, width=64),
                   st.integers(-40, 40).map(lambda k: k + 0.5))


@st.composite
def tensors(draw, shape, dtype, device, scale=None):
    """A tensor of `shape` with random bulk values, some drawn specials, and a random view kind."""
    view = draw(st.sampled_from(["contiguous", "transposed", "sliced", "offset", "expanded"]))
    scale = draw(st.sampled_from([1e-3, 1.0, 3.0, 100.0, 1e6])) if scale is None else scale
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    numel = math.prod(shape)
    base_shape = list(shape)
    if view == "sliced" and shape:
        base_shape[-1] = 2 * shape[-1]
    bulk = torch.randn(max(math.prod(base_shape), 1) + 7, generator=gen, dtype=torch.float64) * scale
    specials = draw(st.lists(values, max_size=6))
    for v in specials:
        if numel:
            bulk[int(torch.randint(0, bulk.numel(), (1,), generator=gen))] = v
    with torch.no_grad():
        bulk = bulk.to(dtype)
    if view == "offset":
        t = bulk[7:7 + math.prod(shape)].view(shape) if numel else bulk[:0].view(shape)
    elif view == "transposed" and len(shape) >= 2:
        t = bulk[:numel].view(list(reversed(shape))).permute(*reversed(range(len(shape))))
    elif view == "sliced" and shape:
        t = bulk[:math.prod(base_shape)].view(base_shape)[..., ::2]
    elif view == "expanded" and shape and shape[0] > 1:
        t = bulk[:math.prod(shape[1:])].view([1, *shape[1:]]).expand(shape)
    else:
        t = bulk[:numel].view(shape)
    assert tuple(t.shape) == tuple(shape)
    return t.to(device)


shapes = st.lists(st.integers(0, 5), min_size=0, max_size=5).filter(lambda s: math.prod(s) <= 2048)


@FUZZ
@given(data=st.data())
def test_round_fuzz(data):
    dtype = data.draw(st.sampled_from(ALL_DTYPES), label="dtype")
    device = data.draw(st.sampled_from(DEVICES), label="device")
    shape = data.draw(shapes, label="shape")
    x = data.draw(tensors(shape, dtype, device), label="x")
    grad = dtype in SUPPORTED and data.draw(st.booleans(), label="requires_grad")
    if grad:
        x.requires_grad_()
    before = x.detach().clone()
    try:
        y = pyroundlib.round_ste(x)
    except (TypeError, ValueError) as e:
        assert dtype not in SUPPORTED, f"valid input rejected: {e}"
        assert "x" in str(e)
        return
    assert dtype in SUPPORTED, f"{dtype} should have been rejected"
    assert bits_equal(y.detach(), torch.round(before))
    assert bits_equal(x.detach(), before)  # untouched
    if grad:
        g = torch.randn_like(y)
        (gx,) = torch.autograd.grad(y, x, g)
        assert torch.equal(gx, g)


def lltm_compare(name, got, ref, dtype):
    """Within a tolerance of the reference in the same dtype, scaled by the tensor's
    magnitude; only where both are finite (overflow edges move by an ulp of rounding)."""
    assert got.shape == ref.shape and got.dtype == ref.dtype, name
    both = torch.isfinite(got) & torch.isfinite(ref)
    if not both.any():
        return
    g, r = got[both].double(), ref[both].double()
    scale = 1.0 + r.abs().max().item()
    tol = {torch.float64: 1e-7, torch.float32: 2e-3, torch.float16: 6e-2, torch.bfloat16: 2.5e-1}[dtype]
    worst = (g - r).abs().max().item()
    assert worst <= tol * scale, f"{name}: max difference {worst} > {tol} * {scale}"


NAMES = ["input", "weights", "bias", "old_h", "old_cell"]


@FUZZ
@given(data=st.data())
def test_lltm_fuzz(data):
    dtype = data.draw(st.sampled_from(ALL_DTYPES + [torch.float32, torch.float64] * 4), label="dtype")
    batch, features, state = (data.draw(st.integers(lo, 6), label=n)
                              for n, lo in (("batch", 0), ("features", 0), ("state", 1)))
    shapes = {"input": [batch, features], "weights": [3 * state, state + features], "bias": [3 * state],
              "old_h": [batch, state], "old_cell": [batch, state]}
    broken = data.draw(st.sampled_from([None] * 6 + NAMES), label="wrong shape of")
    if broken:
        shapes[broken] = data.draw(st.lists(st.integers(0, 7), min_size=1, max_size=3), label="its shape")
    mix = len(DEVICES) > 1 and data.draw(st.integers(0, 7), label="mix devices") == 0
    devices = {n: data.draw(st.sampled_from(DEVICES), label=f"{n} device") if mix else DEVICES[-1] for n in NAMES}
    special = data.draw(st.booleans(), label="special values")
    args = {n: data.draw(tensors(shapes[n], dtype, devices[n], scale=None if special else 1.0), label=n)
            for n in NAMES}
    if not special:  # keep the comparison meaningful: no drawn specials in the bulk
        args = {n: torch.nan_to_num(t, nan=0.5, posinf=2.0, neginf=-2.0).clamp(-4, 4)
                if t.dtype in SUPPORTED else t for n, t in args.items()}
    wants_grad = {n: dtype in SUPPORTED and data.draw(st.booleans(), label=f"{n} grad") for n in NAMES}
    inputs = [args[n].detach().clone().requires_grad_(wants_grad[n]) for n in NAMES]
    valid = (dtype in SUPPORTED and broken is None and len(set(devices.values())) == 1)
    try:
        h, c = pyroundlib.lltm_cell(*inputs)
    except (TypeError, ValueError) as e:
        if valid:
            raise AssertionError(f"valid input rejected: {e}")
        return
    if not valid:
        # a "broken" shape may by chance be the right one
        assert dtype in SUPPORTED and len(set(devices.values())) == 1
        assert [list(t.shape) for t in inputs] == [[batch, features], [3 * state, state + features], [3 * state],
                                                   [batch, state], [batch, state]]
    ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    rh, rc = lltm_cell_reference(*ref_inputs)
    lltm_compare("new_h", h, rh, dtype)
    lltm_compare("new_cell", c, rc, dtype)
    needs = [t for t in inputs if t.requires_grad]
    if needs:
        gh, gc = torch.randn_like(h), torch.randn_like(c)
        grads = torch.autograd.grad((h, c), needs, (gh, gc), allow_unused=True)
        ref_grads = torch.autograd.grad((rh, rc), [t for t in ref_inputs if t.requires_grad], (gh, gc),
                                        allow_unused=True)
        for i, (g, rg) in enumerate(zip(grads, ref_grads)):
            if special:  # gradients through inf/NaN differ by algebra (0 * inf): shapes and no crash only
                assert g.shape == rg.shape
            else:
                lltm_compare(f"gradient {i}", g, rg, dtype)


@pytest.mark.parametrize("dtype", [d for d in ALL_DTYPES if d not in SUPPORTED], ids=str)
def test_every_unsupported_dtype_is_a_type_error(dtype):
    x = torch.tensor([0.0, 1.0, 2.0]).to(dtype)
    with pytest.raises(TypeError, match="x must have dtype"):
        pyroundlib.round_ste(x)
