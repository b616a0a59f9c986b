"""round_ste against torch.round: every dtype, shapes, views, special values, gradient."""
import math

import pytest
import torch

import pyroundlib
from pyroundlib import _common


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality (so -0.0 != 0.0), with any NaN equal to any NaN."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    a, b = a.reshape(-1), b.reshape(-1)
    nan_a, nan_b = torch.isnan(a), torch.isnan(b)
    if not torch.equal(nan_a, nan_b):
        return False
    int_type = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a[~nan_a].view(int_type), b[~nan_b].view(int_type))


def special_values(dtype):
    finfo = torch.finfo(dtype)
    vals = [0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 3.5, 0.49999997, 0.50000006, 1.0, -1.0,
            math.inf, -math.inf, math.nan, -math.nan, finfo.max, -finfo.max, finfo.tiny, -finfo.tiny,
            finfo.eps, 2.0 ** 23 + 0.5, 2.0 ** 52 + 1, 1e30, -1e30, 123456.5, -7.5, 0.25, 0.75]
    vals += [finfo.tiny / 4, -finfo.tiny / 4]  # subnormals (flushed to zero where the dtype has none)
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


SHAPES = [(), (0,), (1,), (7,), (3, 5), (2, 3, 4), (1, 1, 1, 1), (257, 3), (4097,), (2, 0, 3), (65537 * 3,)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_torch_round(device, dtype, shape):
    x = (torch.randn(shape, dtype=torch.float64) * 10).to(dtype=dtype, device=device)
    # ties at every representable half-integer the dtype holds
    if x.numel():
        x.view(-1)[::3] = (torch.randint(-20, 20, x.view(-1)[::3].shape, dtype=torch.float64) + 0.5).to(dtype)
    before = x.clone()
    y = pyroundlib.round_ste(x)
    assert bits_equal(y, torch.round(x))
    assert torch.equal(x, before)  # input untouched
    assert y.shape == x.shape and y.dtype == x.dtype and y.device == x.device


def test_special_values(device, dtype):
    x = special_values(dtype).to(device)
    assert bits_equal(pyroundlib.round_ste(x), torch.round(x))


@pytest.mark.parametrize("dtype16", [torch.float16, torch.bfloat16], ids=str)
def test_every_16_bit_value(device, dtype16):
    """All 65536 bit patterns of each 16-bit type, and a run of them long enough to be split
    among threads: the same bits as torch.round (NaNs as NaNs)."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dtype16).to(device)
    assert bits_equal(pyroundlib.round_ste(x), torch.round(x))
    many = x.repeat(9)[5:]  # 589,819 elements: chunks of 32768, the last one short
    assert bits_equal(pyroundlib.round_ste(many), torch.round(many))


def test_sigmoid_outputs_binarise(device, dtype):
    p = torch.sigmoid(torch.randn(1000, dtype=torch.float64) * 4).to(dtype=dtype, device=device)
    y = pyroundlib.round_ste(p)
    assert bits_equal(y, torch.round(p))
    assert set(y.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(y, (p > 0.5).to(dtype))  # the original round_cuda's x > 0.5 ? 1 : 0


@pytest.mark.parametrize("view", ["transposed", "sliced", "offset", "expanded", "channels_last"])
def test_non_contiguous_views(device, dtype, view):
    base = (torch.randn(6, 8, 10, dtype=torch.float64) * 5).to(dtype=dtype, device=device)
    x = {
        "transposed": lambda: base.transpose(0, 2),
        "sliced": lambda: base[:, ::3, 1::2],
        "offset": lambda: base.view(-1)[17:17 + 50],
        "expanded": lambda: base[0, 0, :1].expand(9, 4),
        "channels_last": lambda: base.reshape(1, 6, 8, 10).contiguous(memory_format=torch.channels_last),
    }[view]()
    before = base.clone()
    assert bits_equal(pyroundlib.round_ste(x), torch.round(x))
    assert torch.equal(base, before)


def test_every_element_written(device, dtype):
    """Call the kernel into a NaN-poisoned buffer: every output element must be overwritten."""
    x = (torch.randn(1237, dtype=torch.float64) * 3).to(dtype=dtype, device=device)
    y = torch.full_like(x, math.nan)
    _common.Kernel("round")(x, x.data_ptr(), y.data_ptr(), x.numel(), _common.DTYPE_CODES[dtype])
    assert bits_equal(y, torch.round(x))


def test_straight_through_gradient(device, dtype):
    x = torch.randn(5, 7, dtype=dtype, device=device, requires_grad=True)
    y = pyroundlib.round_ste(x)
    grad = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, grad)
    assert gx is grad or torch.equal(gx, grad)  # the identity: the same gradient, unchanged


def test_round_ste_matches_reference_idiom(device):
    from pyroundlib.reference import round_ste_reference
    x1 = torch.randn(100, device=device, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_()
    w = torch.randn(100, device=device, dtype=torch.float64)
    (pyroundlib.round_ste(x1) * w).sum().backward()
    (round_ste_reference(x2) * w).sum().backward()
    assert torch.equal(x1.grad, x2.grad)


def test_module_after_sigmoid(device):
    layer = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Sigmoid(), pyroundlib.RoundSTE()).to(device)
    out = layer(torch.randn(3, 4, device=device))
    assert set(out.unique().tolist()) <= {0.0, 1.0}
    out.sum().backward()
    assert layer[0].weight.grad is not None and layer[0].weight.grad.abs().sum() > 0


def test_round_op_gradcheck_float64(device):
    # The bare op is torch.round, whose derivative is zero away from ties.
    x = (torch.randn(20, dtype=torch.float64, device=device) * 3).requires_grad_()
    x.data = torch.where((x.data - x.data.round()).abs() > 0.45, x.data + 0.1, x.data)  # away from ties
    assert torch.autograd.gradcheck(torch.ops.pyroundlib.round, (x,))


@pytest.mark.parametrize("op", ["round", "round_ste", "round_ste_no_autograd"])
def test_opcheck_round(device, dtype, op):
    x = torch.randn(4, 5, device=device, dtype=dtype)
    torch.library.opcheck(getattr(torch.ops.pyroundlib, op).default, (x,))
    if not op.endswith("no_autograd"):  # the eager twin has no autograd formula (the Function is the node)
        torch.library.opcheck(getattr(torch.ops.pyroundlib, op).default, (x.t().requires_grad_(),))
    else:
        torch.library.opcheck(getattr(torch.ops.pyroundlib, op).default, (x.t(),))


def test_round_ste_op_is_straight_through(device):
    """The op TorchScript calls: round forward, identity gradient (second derivative zero)."""
    x = (torch.randn(50, dtype=torch.float64, device=device) * 4).requires_grad_()
    y = torch.ops.pyroundlib.round_ste(x)
    assert torch.equal(y, torch.round(x.detach()))
    g = torch.randn_like(x)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], g)
    assert torch.autograd.gradgradcheck(torch.ops.pyroundlib.round_ste, (x,))
