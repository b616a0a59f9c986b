"""The ops' autograd Functions and their entry points: one route (the custom ops) in every
mode, eager included, and only public torch API in the package."""
import ast
from pathlib import Path

import pytest
import torch

import pyroundlib
from pyroundlib import _common, lltm, round as round_module
from pyroundlib.reference import lltm_cell_reference, round_ste_reference

from conftest import make_args, requires_cuda, run_python_ok

PACKAGE = Path(pyroundlib.__file__).resolve().parent


def lltm_args(device, requires_grad=True):
    return make_args(3, 5, 4, torch.float64, device, requires_grad=requires_grad)


def private_torch_names(source: str) -> list[str]:
    """Dotted names reached through ``torch`` with a part that starts with "_" (``torch._C``,
    ``torch.cuda._sleep``, ...), and ``from torch._x import ...`` statements."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute):
            parts, inner = [node.attr], node.value
            while isinstance(inner, ast.Attribute):
                parts.append(inner.attr)
                inner = inner.value
            if isinstance(inner, ast.Name) and inner.id == "torch":
                dotted = ".".join(["torch", *reversed(parts)])
                if any(p.startswith("_") and not p.startswith("__") for p in reversed(parts)):
                    found.append(dotted)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            found += [n for n in names if n.startswith("torch.") and "._" in n]
    return found


def test_private_name_finder_finds_them():
    source = ("import torch\nimport torch._dynamo\nfrom torch._C import _functorch\n"
              "s = torch._C._cuda_getCurrentRawStream(0)\nt = torch.cuda.current_stream(0).cuda_stream\n")
    assert set(private_torch_names(source)) == {"torch._dynamo", "torch._C", "torch._C._cuda_getCurrentRawStream"}


# The one private torch name the package may use, and where: behind pick_stream_query's
# feature test, with a public fallback that the tests below force (docs/design.md: Private torch API).
ALLOWED_PRIVATE = {"_common.py": {"torch._C", "torch._C._cuda_getCurrentRawStream"}}


@pytest.mark.parametrize("module", sorted(p.name for p in PACKAGE.glob("*.py")))
def test_package_uses_only_public_torch_api(module):
    """The library's promise is every supported torch: no torch._* name, whose meaning a
    release may change without notice, in any module of the package, but the allowed one."""
    assert set(private_torch_names((PACKAGE / module).read_text())) <= ALLOWED_PRIVATE.get(module, set())


class FakeC:
    """torch._C as a torch without (or with) the raw stream query would have it."""

    def __init__(self, **names):
        self.__dict__.update(names)


def test_stream_query_feature_test(monkeypatch):
    raw = lambda index: 1234  # noqa: E731
    monkeypatch.setattr(torch, "_C", FakeC(_cuda_getCurrentRawStream=raw))
    monkeypatch.delenv(_common.PUBLIC_ONLY_VAR, raising=False)
    assert _common.pick_stream_query() is raw
    monkeypatch.setenv(_common.PUBLIC_ONLY_VAR, "1")
    assert _common.pick_stream_query() is _common.public_stream_handle
    monkeypatch.delenv(_common.PUBLIC_ONLY_VAR)
    monkeypatch.setattr(torch, "_C", FakeC())  # a torch that lacks it
    assert _common.pick_stream_query() is _common.public_stream_handle


def test_public_stream_handle_is_the_current_streams(monkeypatch):
    """The fallback reads torch.cuda.current_stream(index).cuda_stream (faked where there is no GPU)."""
    class Stream:
        cuda_stream = 0xABCDEF01234

    seen = []
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index: seen.append(index) or Stream())
    assert _common.public_stream_handle(3) == 0xABCDEF01234 and seen == [3]


def test_public_route_in_a_fresh_process():
    """With PYROUNDLIB_PUBLIC_TORCH_ONLY=1 the package takes the public stream query, and
    the ops work (on a GPU too, where there is one)."""
    code = ("import torch, pyroundlib\n"
            "from pyroundlib import _common\n"
            "assert _common.current_stream_handle is _common.public_stream_handle\n"
            "devices = ['cpu'] + (['cuda'] if torch.cuda.is_available() and pyroundlib.library_info()['cuda'] else [])\n"
            "for d in devices:\n"
            "    x = torch.randn(1000, device=d) * 4\n"
            "    assert torch.equal(pyroundlib.round_ste(x), torch.round(x))\n"
            "print('OK', devices)\n")
    run_python_ok(code, **{_common.PUBLIC_ONLY_VAR: "1"})


@requires_cuda
def test_both_stream_routes_agree():
    public = _common.public_stream_handle
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", public)
    side = torch.cuda.Stream()
    for stream in (torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            assert raw(0) == public(0) == stream.cuda_stream


@requires_cuda
def test_public_route_on_a_side_stream(monkeypatch):
    """With the public query the kernels are launched on the current (side) stream."""
    handles = []

    def spy(index):
        handles.append(_common.public_stream_handle(index))
        return handles[-1]

    monkeypatch.setattr(_common, "current_stream_handle", spy)
    side = torch.cuda.Stream()
    x = torch.randn(4096, device="cuda") * 4
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        y = pyroundlib.round_ste(x)
        h, c = pyroundlib.lltm_cell(*make_args(3, 5, 4, torch.float32, "cuda", requires_grad=False))
    side.synchronize()
    assert torch.equal(y, torch.round(x))
    assert handles == [side.cuda_stream] * 2


def test_eager_calls_match_plain_pytorch(device):
    x = (torch.randn(64, dtype=torch.float64, device=device) * 4).requires_grad_()
    y = pyroundlib.round_ste(x)
    assert type(y.grad_fn).__name__ == "RoundSTEFunctionBackward"
    assert torch.equal(y, torch.round(x.detach()))
    g = torch.randn_like(y)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], g)

    args = lltm_args(device)
    h, c = pyroundlib.lltm_cell(*args)
    assert type(h.grad_fn).__name__ == "LLTMPointwiseFunctionBackward"
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    rh, rc = lltm_cell_reference(*ref_args)
    torch.testing.assert_close((h, c), (rh, rc))
    gh, gc = torch.randn_like(h), torch.randn_like(c)
    torch.testing.assert_close(torch.autograd.grad((h, c), args, (gh, gc)),
                               torch.autograd.grad((rh, rc), ref_args, (gh, gc)))


@pytest.mark.parametrize("needs", ["input", "weights", "bias", "old_h", "old_cell"])
def test_only_the_gradients_asked_for(needs):
    """The backward computes what autograd asks for; the others stay None."""
    names = ["input", "weights", "bias", "old_h", "old_cell"]
    args = lltm_args("cpu", requires_grad=False)
    args[names.index(needs)].requires_grad_()
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
    h, c = pyroundlib.lltm_cell(*args)
    rh, rc = lltm_cell_reference(*ref_args)
    (got,) = torch.autograd.grad(h.sum() + 3 * c.sum(), args[names.index(needs)])
    (want,) = torch.autograd.grad(rh.sum() + 3 * rc.sum(), ref_args[names.index(needs)])
    torch.testing.assert_close(got, want)


def test_no_grad_calls_build_no_node(device):
    x = torch.randn(8, device=device, requires_grad=True)
    with torch.no_grad():
        assert pyroundlib.round_ste(x).grad_fn is None
        assert pyroundlib.lltm_cell(*lltm_args(device))[0].grad_fn is None


def test_leaked_functorch_wrappers_are_unwrapped():
    """A tensor that escaped a torch.func transform is a dead wrapper; the ops still work on it."""
    leaked = []

    def keep(t):
        leaked.append(t)
        return (t * t).sum()

    x = torch.randn(16, dtype=torch.float64) * 4
    torch.func.grad(keep)(x)
    assert torch.equal(pyroundlib.round_ste(leaked[0]), round_ste_reference(x))

    args = lltm_args("cpu")
    leaked.clear()
    torch.func.grad(keep)(args[0].detach())
    h, c = pyroundlib.lltm_cell(leaked[0], *args[1:])
    torch.testing.assert_close((h, c), lltm_cell_reference(args[0].detach(), *args[1:]))


def test_parameters(device):
    x = torch.nn.Parameter(torch.randn(32, dtype=torch.float64, device=device) * 4)
    assert torch.equal(pyroundlib.round_ste(x), torch.round(x.detach()))
    cell = pyroundlib.LLTM(5, 4, device=device, dtype=torch.float64)  # weights and bias are Parameters
    inp = torch.randn(3, 5, dtype=torch.float64, device=device)
    h, c = cell(inp)
    zeros = torch.zeros(3, 4, dtype=torch.float64, device=device)
    torch.testing.assert_close((h, c), lltm_cell_reference(inp, cell.weights, cell.bias, zeros, zeros))
    grads = torch.autograd.grad(h.sum() + c.sum(), list(cell.parameters()))
    assert all(g.abs().sum() > 0 for g in grads)


class Tagged(torch.Tensor):
    """A tensor subclass."""


def test_tensor_subclasses():
    x = (torch.randn(16, dtype=torch.float64) * 4).requires_grad_()
    y = pyroundlib.round_ste(x.as_subclass(Tagged))
    assert torch.equal(y, torch.round(x.detach()))
    g = torch.randn_like(x)
    assert torch.equal(torch.autograd.grad(y, x, g)[0], g)

    args = lltm_args("cpu")
    h, c = pyroundlib.lltm_cell(args[0].as_subclass(Tagged), *args[1:])
    torch.testing.assert_close((h, c), lltm_cell_reference(*args))


def test_forward_signatures_bind_as_inspect_does():
    """signature_once's signature binds an all-positional call in one step; what it binds,
    and every other call (keywords, too few or too many arguments), is inspect's own."""
    import inspect

    from pyroundlib import sequence

    for function in (round_module.RoundSTEFunction, lltm.LLTMPointwiseFunction, sequence.LLTMSequenceFunction):
        fast = inspect.signature(function.forward)
        assert isinstance(fast, _common._PositionalSignature)
        plain = inspect.Signature(list(fast.parameters.values()))
        names = list(fast.parameters)
        args = tuple(torch.randn(2) for _ in names)
        bound = fast.bind(*args)
        bound.apply_defaults()
        want = plain.bind(*args)
        assert bound.args == want.args and bound.kwargs == want.kwargs == {}
        assert list(bound.arguments) == names and bound.signature is fast
        if len(names) > 1:  # keywords: inspect's binding
            kw = fast.bind(*args[:-1], **{names[-1]: args[-1]})
            assert kw.args == want.args and type(kw) is inspect.BoundArguments
        for wrong in (args[:-1], args + (args[0],)):
            with pytest.raises(TypeError) as got:
                fast.bind(*wrong)
            with pytest.raises(TypeError) as expected:
                plain.bind(*wrong)
            assert str(got.value) == str(expected.value)


def test_functions_applied_directly_check_through_the_ops():
    """Outside round_ste / lltm_cell the Functions' forwards run the custom ops, which check."""
    for function in (round_module.RoundSTEFunction, round_module._RoundSTENoJvp):
        with pytest.raises(TypeError, match="x must have dtype"):
            function.apply(torch.arange(4))
    args = lltm_args("cpu")
    args[4] = torch.randn(3, 5, dtype=torch.float64)  # old_cell [3, 5]; the gates are [3, 12]
    gates = torch.randn(3, 12, dtype=torch.float64)
    for function in (lltm.LLTMPointwiseFunction, lltm._LLTMPointwiseNoJvp):
        with pytest.raises(ValueError, match="gates must have shape"):
            function.apply(gates, args[4])


def test_meta_tensors_run_the_fake_implementations():
    x = torch.randn(2, 3, device="meta", requires_grad=True)
    y = pyroundlib.round_ste(x)
    assert y.device.type == "meta" and y.shape == x.shape
    assert torch.autograd.grad(y.sum(), x)[0].shape == x.shape
    args = make_args(3, 5, 4, torch.float32, "meta", requires_grad=True)
    h, c = pyroundlib.lltm_cell(*args)
    assert h.device.type == "meta" and h.shape == c.shape == (3, 4)
    grads = torch.autograd.grad(h.sum() + c.sum(), args)
    assert [g.shape for g in grads] == [a.shape for a in args]
