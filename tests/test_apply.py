"""The ops' autograd Functions are applied through the C++ ``apply`` in plain eager mode
(``_common.c_apply``) and through ``Function.apply`` otherwise: both routes must agree."""
import pytest
import torch

import pyroundlib
from pyroundlib import _common, lltm, round as round_module
from pyroundlib.reference import lltm_cell_reference, round_ste_reference

from conftest import make_args


def lltm_args(device, requires_grad=True):
    return make_args(3, 5, 4, torch.float64, device, requires_grad=requires_grad)


class Spy:
    """Wraps an apply function and counts its calls."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, *args):
        self.calls += 1
        return self.fn(*args)


@pytest.fixture
def spies(monkeypatch):
    """The direct apply functions of both ops, wrapped in call counters."""
    spy_round, spy_lltm = Spy(round_module._apply_round_ste), Spy(lltm._apply_lltm)
    monkeypatch.setattr(round_module, "_apply_round_ste", spy_round)
    monkeypatch.setattr(lltm, "_apply_lltm", spy_lltm)
    return spy_round, spy_lltm


def test_c_apply_is_the_cpp_apply():
    apply = _common.c_apply(lltm.LLTMFunction)
    assert apply is not lltm.LLTMFunction.apply  # not the Python fallback on this torch
    assert apply.__self__ is lltm.LLTMFunction


def test_eager_calls_take_the_direct_route(device, spies):
    spy_round, spy_lltm = spies
    x = (torch.randn(64, dtype=torch.float64, device=device) * 4).requires_grad_()
    y = pyroundlib.round_ste(x)
    assert spy_round.calls == 1 and type(y.grad_fn).__name__ == "RoundSTEFunctionBackward"
    assert torch.equal(y, torch.round(x.detach()))
    g = torch.randn_like(y)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], g)

    args = lltm_args(device)
    h, c = pyroundlib.lltm_cell(*args)
    assert spy_lltm.calls == 1 and type(h.grad_fn).__name__ == "LLTMFunctionBackward"
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    rh, rc = lltm_cell_reference(*ref_args)
    torch.testing.assert_close((h, c), (rh, rc))
    gh, gc = torch.randn_like(h), torch.randn_like(c)
    torch.testing.assert_close(torch.autograd.grad((h, c), args, (gh, gc)),
                               torch.autograd.grad((rh, rc), ref_args, (gh, gc)))


def test_no_grad_calls_build_no_node(device, spies):
    x = torch.randn(8, device=device, requires_grad=True)
    with torch.no_grad():
        assert pyroundlib.round_ste(x).grad_fn is None
        assert pyroundlib.lltm_cell(*lltm_args(device))[0].grad_fn is None
    assert [s.calls for s in spies] == [0, 0]


def test_functorch_transforms_take_function_apply(spies):
    """Under a functorch transform the ops behave exactly as Function.apply makes them:
    their Functions have no setup_context, so torch refuses them with its own message."""
    x = torch.randn(8, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: pyroundlib.round_ste(t).sum())(x)
    args = lltm_args("cpu", requires_grad=False)
    with pytest.raises(RuntimeError, match="setup_context"):
        torch.func.grad(lambda t: pyroundlib.lltm_cell(t, *args[1:])[0].sum())(args[0])
    assert [s.calls for s in spies] == [0, 0]


def test_leaked_functorch_wrappers_are_unwrapped(spies):
    """A tensor that escaped a torch.func transform is a dead wrapper: Function.apply
    unwraps it, so the ops must route it there rather than to the C++ apply."""
    leaked = []

    def keep(t):
        leaked.append(t)
        return (t * t).sum()

    x = torch.randn(16, dtype=torch.float64) * 4
    torch.func.grad(keep)(x)
    wrapper = leaked[0]
    assert torch._C._functorch.is_functorch_wrapped_tensor(wrapper)
    assert torch.equal(pyroundlib.round_ste(wrapper), round_ste_reference(x))
    assert spies[0].calls == 0

    args = lltm_args("cpu")
    leaked.clear()
    torch.func.grad(keep)(args[0].detach())
    h, c = pyroundlib.lltm_cell(leaked[0], *args[1:])
    torch.testing.assert_close((h, c), lltm_cell_reference(args[0].detach(), *args[1:]))
    assert spies[1].calls == 0


def test_parameters_take_the_direct_route(device, spies):
    x = torch.nn.Parameter(torch.randn(32, dtype=torch.float64, device=device) * 4)
    assert torch.equal(pyroundlib.round_ste(x), torch.round(x.detach()))
    cell = pyroundlib.LLTM(5, 4, device=device, dtype=torch.float64)  # weights and bias are Parameters
    h, c = cell(torch.randn(3, 5, dtype=torch.float64, device=device))
    torch.autograd.grad(h.sum() + c.sum(), list(cell.parameters()))
    assert [s.calls for s in spies] == [1, 1]


class Tagged(torch.Tensor):
    """A tensor subclass: not what the fast path takes."""


def test_tensor_subclasses_take_function_apply(spies):
    x = (torch.randn(16, dtype=torch.float64) * 4).requires_grad_()
    y = pyroundlib.round_ste(x.as_subclass(Tagged))
    assert torch.equal(y, torch.round(x.detach()))
    g = torch.randn_like(x)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], g)

    args = lltm_args("cpu")
    h, c = pyroundlib.lltm_cell(args[0].as_subclass(Tagged), *args[1:])
    torch.testing.assert_close((h, c), lltm_cell_reference(*args))
    assert [s.calls for s in spies] == [0, 0]


def test_functions_applied_directly_check_through_the_ops():
    """Outside round_ste / lltm_cell the Functions' forwards run the custom ops, which check."""
    with pytest.raises(TypeError, match="x must have dtype"):
        round_module.RoundSTEFunction.apply(torch.arange(4))
    args = lltm_args("cpu")
    args[4] = torch.randn(3, 5, dtype=torch.float64)  # old_cell [3, 5]; the gates are [3, 12]
    with pytest.raises(ValueError, match="gates must have shape"):
        lltm.LLTMFunction.apply(*args)


def test_meta_tensors_run_the_fake_implementations(spies):
    x = torch.randn(2, 3, device="meta", requires_grad=True)
    y = pyroundlib.round_ste(x)
    assert y.device.type == "meta" and y.shape == x.shape
    assert torch.autograd.grad(y.sum(), x)[0].shape == x.shape
    args = make_args(3, 5, 4, torch.float32, "meta", requires_grad=True)
    h, c = pyroundlib.lltm_cell(*args)
    assert h.device.type == "meta" and h.shape == c.shape == (3, 4)
    grads = torch.autograd.grad(h.sum() + c.sum(), args)
    assert [g.shape for g in grads] == [a.shape for a in args]
    assert [s.calls for s in spies] == [0, 0]
