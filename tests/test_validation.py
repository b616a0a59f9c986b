"""Bad input gets a clean Python exception that names the argument."""
import pytest
import torch

import pyroundlib

from conftest import CUDA


def lltm_args(batch=3, features=4, state=5, dtype=torch.float32, device="cpu"):
    return dict(input=torch.randn(batch, features, dtype=dtype, device=device),
                weights=torch.randn(3 * state, state + features, dtype=dtype, device=device),
                bias=torch.randn(3 * state, dtype=dtype, device=device),
                old_h=torch.randn(batch, state, dtype=dtype, device=device),
                old_cell=torch.randn(batch, state, dtype=dtype, device=device))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.uint8, torch.complex64])
def test_round_rejects_non_floating(dtype):
    x = torch.zeros(3, dtype=dtype)
    with pytest.raises(TypeError, match=r"\bx\b.*dtype"):
        pyroundlib.round_ste(x)
    with pytest.raises(TypeError, match=r"\bx\b"):
        torch.ops.pyroundlib.round(x)


def test_round_rejects_non_tensor():
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        pyroundlib.round_ste([1.5, 2.5])


@pytest.mark.parametrize("name", ["input", "weights", "bias", "old_h", "old_cell"])
def test_lltm_rejects_wrong_dtype(name):
    args = lltm_args()
    args[name] = args[name].to(torch.int64)
    with pytest.raises(TypeError, match=name):
        pyroundlib.lltm_cell(**args)


@pytest.mark.parametrize("name", ["weights", "bias", "old_h", "old_cell"])
def test_lltm_rejects_mixed_dtypes(name):
    args = lltm_args()
    args[name] = args[name].double()
    with pytest.raises(TypeError, match=f"{name} has dtype torch.float64 but input has dtype torch.float32"):
        pyroundlib.lltm_cell(**args)


@pytest.mark.parametrize("name,shape", [
    ("input", (3, 4, 1)), ("input", (2, 4)), ("weights", (15, 8)), ("weights", (14, 9)), ("bias", (14,)),
    ("bias", (3, 5)), ("old_h", (3, 6)), ("old_h", (5,)), ("old_cell", (3, 4)), ("old_cell", (2, 5)),
])
def test_lltm_rejects_wrong_shapes(name, shape):
    args = lltm_args()
    args[name] = torch.randn(shape)
    with pytest.raises(ValueError, match=name):
        pyroundlib.lltm_cell(**args)


def test_lltm_rejects_non_tensor():
    args = lltm_args()
    args["bias"] = 0.5
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        pyroundlib.lltm_cell(**args)


def test_pointwise_ops_check_shapes():
    with pytest.raises(ValueError, match="gates"):
        torch.ops.pyroundlib.lltm_forward(torch.randn(3, 14), torch.randn(3, 5))
    with pytest.raises(ValueError, match="old_cell"):
        torch.ops.pyroundlib.lltm_forward(torch.randn(3, 15), torch.randn(15))
    with pytest.raises(ValueError, match="grad_h"):
        torch.ops.pyroundlib.lltm_backward(torch.randn(3, 4), None, torch.randn(3, 15), torch.randn(3, 5))


def test_unsupported_device():
    x = torch.randn(3, device="meta")
    with pytest.raises(Exception):
        pyroundlib.round_ste(x).cpu()


def test_module_rejects_bad_state():
    cell = pyroundlib.LLTM(4, 5)
    with pytest.raises(ValueError, match="old_cell"):
        cell(torch.randn(3, 4), (torch.randn(3, 5), torch.randn(3, 6)))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["weights", "bias", "old_h", "old_cell"])
def test_lltm_rejects_mixed_devices(name):
    args = lltm_args(device="cuda")
    args[name] = args[name].cpu()
    with pytest.raises(ValueError, match=f"{name} is on cpu but input is on cuda"):
        pyroundlib.lltm_cell(**args)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
def test_pointwise_op_rejects_mixed_devices():
    with pytest.raises(ValueError, match="gates is on"):
        torch.ops.pyroundlib.lltm_forward(torch.randn(2, 6), torch.randn(2, 2, device="cuda"))
