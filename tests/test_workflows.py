"""The ops in every everyday PyTorch workflow: autocast, torch.func, double backward,
deployment (torch.export, TorchScript) — each against the plain-PyTorch reference."""
import pytest
import torch

import pyroundlib
from pyroundlib.reference import lltm_cell_reference, round_ste_reference

from conftest import make_args, run_python_ok

func = torch.func
ARGNUMS = (0, 1, 2, 3, 4)  # input, weights, bias, old_h, old_cell


def lltm_args(device, dtype=torch.float64, batch=3, features=5, state=4):
    return make_args(batch, features, state, dtype, device, requires_grad=False)


def rounding_input(device, n=24):
    """float64 values well away from the ties of round (x.5), where its derivative is zero."""
    x = torch.randn(n, dtype=torch.float64, device=device) * 4
    return torch.where((x - x.round()).abs() > 0.45, x + 0.1, x)


def both_outputs(cell):
    """A scalar that depends on both outputs of a cell function."""
    def loss(*args):
        h, c = cell(*args)
        return (h * torch.arange(1.0, h.shape[1] + 1, dtype=h.dtype, device=h.device)).sum() + 0.5 * c.square().sum()
    return loss


# ---- autocast -----------------------------------------------------------------------------

AUTOCAST = {"cpu": torch.bfloat16, "cuda": torch.float16}
AUTOCAST_TOL = {torch.bfloat16: dict(rtol=3e-2, atol=3e-2), torch.float16: dict(rtol=5e-3, atol=5e-3)}


def test_lltm_under_autocast(device):
    """As nn.LSTMCell under CUDA autocast: the cell runs in the autocast dtype and the float32
    parameters get float32 gradients; values as the reference's under the same autocast."""
    low = AUTOCAST[device.type]
    linear = torch.nn.Linear(6, 5).to(device)
    cell = pyroundlib.LLTM(5, 8).to(device)
    x = torch.randn(4, 6, device=device)
    state = (torch.randn(4, 8, device=device), torch.randn(4, 8, device=device))
    params = list(linear.parameters()) + list(cell.parameters())

    def run(cell_fn):
        with torch.autocast(device.type, dtype=low):
            h, c = cell_fn(linear(x), cell.weights, cell.bias, *state)
        loss = h.float().square().sum() + c.float().sum()
        return h, c, torch.autograd.grad(loss, params)

    h, c, grads = run(pyroundlib.lltm_cell)
    rh, rc, ref_grads = run(lltm_cell_reference)
    assert h.dtype == c.dtype == low
    assert all(p.dtype == g.dtype == torch.float32 for p, g in zip(params, grads))
    torch.testing.assert_close((h.float(), c.float()), (rh.float(), rc.float()), **AUTOCAST_TOL[low])
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, **AUTOCAST_TOL[low])
    with torch.autocast(device.type, dtype=low):  # the module takes the same route
        assert cell(linear(x))[0].dtype == low


def test_round_ste_under_autocast(device):
    """round_ste keeps its input's dtype, whatever autocast would choose."""
    low = AUTOCAST[device.type]
    linear = torch.nn.Linear(6, 5).to(device)
    x = torch.randn(4, 6, device=device)
    with torch.autocast(device.type, dtype=low):
        z = linear(x)  # already low precision
        y, y32 = pyroundlib.round_ste(z), pyroundlib.round_ste(x * 3)
        ry = round_ste_reference(z)
    assert y.dtype == low and y32.dtype == torch.float32
    assert torch.equal(y, ry) and torch.equal(y32, torch.round(x * 3))
    (g,) = torch.autograd.grad(y.float().sum(), linear.weight, retain_graph=True)
    (rg,) = torch.autograd.grad(ry.float().sum(), linear.weight)
    assert g.dtype == torch.float32
    torch.testing.assert_close(g, rg)


def test_autocast_leaves_float64_alone():
    args = lltm_args("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, c = pyroundlib.lltm_cell(*args)
    assert h.dtype == torch.float64
    torch.testing.assert_close((h, c), lltm_cell_reference(*args))


# ---- torch.func ------------------------------------------------------------------------------

def test_func_grad_and_jacrev_round_ste(device):
    x = rounding_input(device)
    assert torch.equal(func.grad(lambda t: pyroundlib.round_ste(t).sum())(x), torch.ones_like(x))
    eye = torch.eye(x.numel(), dtype=x.dtype, device=device)
    assert torch.equal(func.jacrev(pyroundlib.round_ste)(x), eye)
    assert torch.equal(func.jacrev(round_ste_reference)(x), eye)


def test_func_forward_mode_round_ste(device):
    """Forward mode gives the straight-through derivative too (the identity)."""
    x, t = rounding_input(device), torch.randn(24, dtype=torch.float64, device=device)
    y, ty = func.jvp(pyroundlib.round_ste, (x,), (t,))
    assert torch.equal(y, torch.round(x)) and torch.equal(ty, t)
    assert torch.equal(func.jacfwd(pyroundlib.round_ste)(x), torch.eye(24, dtype=x.dtype, device=device))


@pytest.fixture(params=[True, False], ids=["direct-without-grad", "function-always"])
def round_route(request, monkeypatch):
    """round_ste where no gradient is wanted: the op called directly (its own vmap rule), or,
    as on a torch without torch.library.register_vmap, through RoundSTEFunction."""
    if request.param and not pyroundlib.round.DIRECT_WITHOUT_GRAD:
        pytest.skip("this torch has no torch.library.register_vmap")
    monkeypatch.setattr(pyroundlib.round, "DIRECT_WITHOUT_GRAD", request.param)
    return request.param


def test_round_ste_skips_the_function_only_where_no_gradient_is_wanted(device, round_route, monkeypatch):
    """No gradient wanted (grad mode off, inference mode, an input that does not require
    grad): the same bits with or without the Function; wanted: the Function, straight through."""
    calls = []
    apply = pyroundlib.RoundSTEFunction.apply
    monkeypatch.setattr(pyroundlib.RoundSTEFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    x = rounding_input(device)
    with torch.no_grad():
        assert torch.equal(pyroundlib.round_ste(x.requires_grad_()), torch.round(x))
    with torch.inference_mode():
        assert torch.equal(pyroundlib.round_ste(x.detach()), torch.round(x))
    assert torch.equal(pyroundlib.round_ste(x.detach()), torch.round(x))
    assert len(calls) == (0 if round_route else 3)
    y = pyroundlib.round_ste(x)
    assert len(calls) == (1 if round_route else 4) and y.requires_grad
    assert torch.equal(torch.autograd.grad(y.sum(), x)[0], torch.ones_like(x))


def test_func_vmap_round_ste(device, round_route):
    x = rounding_input(device).view(4, 6)
    assert torch.equal(func.vmap(pyroundlib.round_ste)(x), torch.round(x))
    assert torch.equal(func.vmap(pyroundlib.round_ste, in_dims=1)(x), torch.round(x).t())
    per_sample = func.vmap(func.grad(lambda t: (pyroundlib.round_ste(t) * t).sum()))(x)
    assert torch.equal(per_sample, torch.round(x) + x)  # d/dt [round(t) t] = 1 * t + round(t), straight through


@pytest.mark.parametrize("transform", ["grad", "jacrev", "jacfwd"])
def test_func_transforms_lltm(device, transform):
    args = lltm_args(device)
    if transform == "grad":
        got = func.grad(both_outputs(pyroundlib.lltm_cell), argnums=ARGNUMS)(*args)
        want = func.grad(both_outputs(lltm_cell_reference), argnums=ARGNUMS)(*args)
    else:
        jac = getattr(func, transform)
        got = jac(pyroundlib.lltm_cell, argnums=ARGNUMS)(*args)
        want = jac(lltm_cell_reference, argnums=ARGNUMS)(*args)
    torch.testing.assert_close(got, want)


def test_func_jvp_lltm(device):
    args = lltm_args(device)
    tangents = tuple(torch.randn_like(a) for a in args)
    got = func.jvp(pyroundlib.lltm_cell, tuple(args), tangents)
    want = func.jvp(lltm_cell_reference, tuple(args), tangents)
    torch.testing.assert_close(got, want)


def test_forward_over_forward_lltm(device):
    """Second order in forward mode (jvp of jvp, jacfwd of jacfwd) as the reference's: torch
    gives zero second-order tangents through an autograd Function's jvp (pytorch#197867),
    so under forward mode lltm_cell computes its pointwise step in torch ops."""
    args = lltm_args(device)
    outer, inner = (tuple(torch.randn_like(a) for a in args) for _ in range(2))

    def nested(cell):
        return func.jvp(lambda *a: func.jvp(cell, a, inner)[1], tuple(args), outer)[1]

    want = nested(lltm_cell_reference)
    assert all(w.abs().sum() > 0 for w in want)
    torch.testing.assert_close(nested(pyroundlib.lltm_cell), want)
    loss = lambda cell: lambda x: both_outputs(cell)(x, *args[1:])  # noqa: E731
    torch.testing.assert_close(func.jacfwd(func.jacfwd(loss(pyroundlib.lltm_cell)))(args[0]),
                               func.jacrev(func.jacrev(loss(lltm_cell_reference)))(args[0]))


def test_functions_jvp_first_order(device):
    """The Functions' own jvp (the entry points compute forward mode in torch ops)."""
    x, t = rounding_input(device), torch.randn(24, dtype=torch.float64, device=device)
    assert torch.equal(func.jvp(pyroundlib.RoundSTEFunction.apply, (x,), (t,))[1], t)
    gates, old_cell = (torch.randn(3, 12, dtype=torch.float64, device=device), torch.randn(3, 4, dtype=torch.float64,
                                                                                             device=device))
    tangents = (torch.randn_like(gates), torch.randn_like(old_cell))

    def pointwise_reference(g, c):
        i, o, cand = torch.sigmoid(g[:, :4]), torch.sigmoid(g[:, 4:8]), torch.nn.functional.elu(g[:, 8:])
        new_cell = c + cand * i
        return torch.tanh(new_cell) * o, new_cell

    torch.testing.assert_close(func.jvp(pyroundlib.LLTMPointwiseFunction.apply, (gates, old_cell), tangents),
                               func.jvp(pointwise_reference, (gates, old_cell), tangents))


@pytest.fixture(params=[True, False], ids=["direct-without-grad", "function-always"])
def cell_route(request, monkeypatch):
    """lltm_cell where no gradient is wanted: the pointwise op called directly (its own vmap
    rule), or, as on a torch without torch.library.register_vmap, LLTMPointwiseFunction."""
    if request.param and not pyroundlib.lltm.DIRECT_WITHOUT_GRAD:
        pytest.skip("this torch has no torch.library.register_vmap")
    monkeypatch.setattr(pyroundlib.lltm, "DIRECT_WITHOUT_GRAD", request.param)
    return request.param


def test_lltm_cell_skips_the_function_only_where_no_gradient_is_wanted(device, cell_route, monkeypatch):
    """No gradient wanted (grad mode off, inference mode, no input requiring grad): the same
    bits with or without the Function, results that need no graph; wanted: the Function, and
    the gradients of the reference."""
    calls = []
    apply = pyroundlib.LLTMPointwiseFunction.apply
    monkeypatch.setattr(pyroundlib.LLTMPointwiseFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    args = [a.requires_grad_() for a in lltm_args(device)]
    want = [t.detach() for t in pyroundlib.lltm_cell(*args)]
    plain = [a.detach() for a in args]
    results = []
    with torch.no_grad():
        results.append(pyroundlib.lltm_cell(*args))
    with torch.inference_mode():
        results.append(pyroundlib.lltm_cell(*plain))
    results.append(pyroundlib.lltm_cell(*plain))
    assert len(calls) == (1 if cell_route else 4)
    for result in results:
        assert all(torch.equal(g, w) and not g.requires_grad for g, w in zip(result, want))
    only_h = plain[:3] + [plain[3].clone().requires_grad_(), plain[4]]
    got = pyroundlib.lltm_cell(*only_h)
    assert len(calls) == (2 if cell_route else 5)
    ref = lltm_cell_reference(*only_h)
    torch.testing.assert_close(torch.autograd.grad(got[0].sum() + 2 * got[1].sum(), only_h[3]),
                               torch.autograd.grad(ref[0].sum() + 2 * ref[1].sum(), only_h[3]))


@pytest.mark.parametrize("in_dims", [(0, None, None, 0, 0), (1, None, None, None, 0), (0, 0, 0, 0, 0)],
                         ids=["batched-data", "mixed-dims", "batched-weights"])
def test_func_vmap_lltm(device, in_dims, cell_route):
    n = 3
    args = lltm_args(device)
    batched = [a if d is None else torch.stack([a * (k + 1) for k in range(n)], dim=d) for a, d in zip(args, in_dims)]
    got = func.vmap(pyroundlib.lltm_cell, in_dims=in_dims)(*batched)
    want = func.vmap(lltm_cell_reference, in_dims=in_dims)(*batched)
    torch.testing.assert_close(got, want)


def test_func_per_sample_gradients_lltm(device):
    """vmap(grad): one weight gradient per sample, as the reference gives."""
    args = lltm_args(device)
    inputs = torch.randn(4, *args[0].shape, dtype=torch.float64, device=device)
    in_dims = (0, None, None, None, None)
    got = func.vmap(func.grad(both_outputs(pyroundlib.lltm_cell), argnums=1), in_dims=in_dims)(inputs, *args[1:])
    want = func.vmap(func.grad(both_outputs(lltm_cell_reference), argnums=1), in_dims=in_dims)(inputs, *args[1:])
    assert got.shape == (4, *args[1].shape)
    torch.testing.assert_close(got, want)


def test_func_functional_call(device):
    """grad through functional_call of both modules, and an ensemble of cells through vmap."""
    cell, bits = pyroundlib.LLTM(5, 4, device=device, dtype=torch.float64), pyroundlib.RoundSTE()
    x = torch.randn(3, 5, dtype=torch.float64, device=device)
    zeros = x.new_zeros(3, 4)

    def loss(params, ours):
        if ours:
            h, c = func.functional_call(cell, params, (x,))
            return (func.functional_call(bits, {}, (torch.sigmoid(h),)) * h).sum() + c.sum()
        h, c = lltm_cell_reference(x, params["weights"], params["bias"], zeros, zeros)
        return (round_ste_reference(torch.sigmoid(h)) * h).sum() + c.sum()

    params = {k: v.detach() for k, v in cell.named_parameters()}
    torch.testing.assert_close(func.grad(loss)(params, True), func.grad(loss)(params, False))

    stacked = {k: torch.stack([v, 2 * v]) for k, v in params.items()}
    got = func.vmap(lambda p: func.functional_call(cell, p, (x,)))(stacked)
    for k in range(2):
        want = lltm_cell_reference(x, stacked["weights"][k], stacked["bias"][k], zeros, zeros)
        torch.testing.assert_close((got[0][k], got[1][k]), want)


# ---- double backward -------------------------------------------------------------------------

def test_gradgradcheck_lltm_cell(device):
    args = [a.requires_grad_() for a in lltm_args(device)]
    assert torch.autograd.gradgradcheck(pyroundlib.lltm_cell, args)
    assert torch.autograd.gradgradcheck(torch.ops.pyroundlib.lltm_forward, (args[3].repeat(1, 3), args[4]))


def test_gradgradcheck_lltm_module(device):
    cell = pyroundlib.LLTM(5, 4, device=device, dtype=torch.float64)
    x, h, c = (torch.randn(3, n, dtype=torch.float64, device=device, requires_grad=True) for n in (5, 4, 4))
    assert torch.autograd.gradgradcheck(lambda x, h, c, w, b: pyroundlib.lltm_cell(x, w, b, h, c),
                                        (x, h, c, cell.weights, cell.bias))
    # a gradient penalty: d/dw of |dL/dx|^2, against the reference's
    def penalty(cell_fn):
        out = cell_fn(x, cell.weights, cell.bias, h, c)
        (gx,) = torch.autograd.grad(out[0].sum() + out[1].sum(), x, create_graph=True)
        return torch.autograd.grad(gx.square().sum(), [cell.weights, cell.bias, h, c])

    torch.testing.assert_close(penalty(pyroundlib.lltm_cell), penalty(lltm_cell_reference))


def test_round_ste_second_derivative_is_zero(device):
    x = rounding_input(device).requires_grad_()
    assert torch.autograd.gradgradcheck(pyroundlib.round_ste, (x,))
    (g,) = torch.autograd.grad((pyroundlib.round_ste(x) * x).sum(), x, create_graph=True)
    (gg,) = torch.autograd.grad(g.sum(), x)  # g = round(x) + x straight through: derivative 2
    assert torch.equal(gg, torch.full_like(x, 2.0))


def test_fast_backward_when_no_graph_is_built(device):
    """Without create_graph the backward runs the native kernel (one op), not the twin."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Recorder(TorchDispatchMode):
        ops = []

        def __torch_dispatch__(self, op, types, args=(), kwargs=None):
            self.ops.append(str(op))
            return op(*args, **(kwargs or {}))

    args = [a.requires_grad_() for a in lltm_args(device)]
    h, c = pyroundlib.lltm_cell(*args)
    with Recorder() as rec:
        torch.autograd.grad(h.sum() + c.sum(), args)
    assert "pyroundlib.lltm_backward.default" in rec.ops and "aten.sigmoid.default" not in rec.ops
    h, c = pyroundlib.lltm_cell(*args)
    rec.ops.clear()
    with Recorder() as rec:
        torch.autograd.grad(h.sum() + c.sum(), args, create_graph=True)
    assert "pyroundlib.lltm_backward.default" not in rec.ops and "aten.sigmoid.default" in rec.ops


# ---- deployment ------------------------------------------------------------------------------

class Model(torch.nn.Module):
    """Both ops in one model: an LLTM step, then a sigmoid -> RoundSTE bottleneck."""

    def __init__(self):
        super().__init__()
        self.cell = pyroundlib.LLTM(5, 4)
        self.bits = pyroundlib.RoundSTE()

    def forward(self, x, h, c):
        h, c = self.cell(x, (h, c))
        return self.bits(torch.sigmoid(h * 3)), c


def model_inputs(device, batch=3):
    return tuple(torch.randn(batch, n, device=device) for n in (5, 4, 4))


def run_saved_in_fresh_process(model, device, data_path: str, load: str):
    """Fresh inputs and the eager model's outputs saved to ``data_path``; a new Python that
    imports pyroundlib evaluates ``load`` (an expression giving the saved model as a
    callable), runs it on those inputs and compares."""
    inputs = model_inputs(device)
    torch.save({"inputs": inputs, "want": model(*inputs)}, data_path)
    code = ("import torch, pyroundlib\n"
            f"module = {load}\n"
            f"data = torch.load({data_path!r})\n"
            "for g, w in zip(module(*data['inputs']), data['want']):\n"
            "    torch.testing.assert_close(g, w)\n"
            "print('OK')\n")
    run_python_ok(code)


def test_export_save_load_in_a_fresh_process(device, tmp_path):
    model = Model().to(device)
    inputs = model_inputs(device)
    program = torch.export.export(model, inputs)
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert any("pyroundlib" in op for op in ops), ops
    path = str(tmp_path / "model.pt2")
    torch.export.save(program, path)
    run_saved_in_fresh_process(model, device, str(tmp_path / "data.pt"), f"torch.export.load({path!r}).module()")


@pytest.mark.parametrize("strict", [False, True], ids=["non-strict", "strict"])
def test_exported_program_trains_as_eager(device, strict):
    """An exported program records the ops that carry their autograd formulas (the straight-
    through round, the differentiable pointwise step), never their eager twins without one:
    its gradients match the eager model's (a zero-gradient round would give zeros here).
    Strict export too, which traces an autograd Function's forward with grad mode off."""
    model = Model().to(device)
    program = torch.export.export(model, model_inputs(device), strict=strict)
    ops = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {"pyroundlib.round_ste.default", "pyroundlib.lltm_forward.default"} <= ops, ops
    assert not any("no_autograd" in op for op in ops), ops
    exported = program.module()
    inputs = [t.requires_grad_() for t in model_inputs(device)]
    got, want = exported(*inputs), model(*inputs)
    torch.testing.assert_close(got, want)
    grads = torch.autograd.grad(got[0].sum() + got[1].sum(), inputs + list(exported.parameters()))
    want_grads = torch.autograd.grad(want[0].sum() + want[1].sum(), inputs + list(model.parameters()))
    assert any(g.abs().sum() > 0 for g in want_grads[:1])
    torch.testing.assert_close(grads, want_grads)


def test_torchscript_script(device, tmp_path):
    """torch.jit.script compiles both modules to the registered ops; gradients as eager;
    the saved module loads and runs in a fresh process that imports pyroundlib."""
    model = Model().to(device)
    scripted = torch.jit.script(model)
    code = str(scripted.code) + str(scripted.cell.code) + str(scripted.bits.code)
    assert "pyroundlib.lltm_cell" in code and "pyroundlib.round_ste" in code
    inputs = [t.requires_grad_() for t in model_inputs(device)]
    got, want = scripted(*inputs), model(*inputs)
    torch.testing.assert_close(got, want)
    params = inputs + list(model.parameters())
    torch.testing.assert_close(torch.autograd.grad(got[0].sum() + got[1].sum(), params),
                               torch.autograd.grad(want[0].sum() + want[1].sum(), params))
    with torch.autocast(device.type, dtype=AUTOCAST[device.type]):  # the op applies autocast too
        assert torch.jit.script(pyroundlib.LLTM(5, 4).to(device))(inputs[0])[0].dtype == AUTOCAST[device.type]
    path = str(tmp_path / "model.ts")
    scripted.save(path)
    run_saved_in_fresh_process(model, device, str(tmp_path / "data.pt"), f"torch.jit.load({path!r})")


def test_torchscript_trace(device):
    model = Model().to(device)
    inputs = model_inputs(device)
    traced = torch.jit.trace(model, inputs)  # trace's own check reruns it on the same inputs
    assert "pyroundlib::lltm_cell" in str(traced.graph) or "pyroundlib::lltm_cell" in str(traced.inlined_graph)
    new_inputs = [t.requires_grad_() for t in model_inputs(device, batch=3)]
    got, want = traced(*new_inputs), model(*new_inputs)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got[0].sum() + got[1].sum(), new_inputs),
                               torch.autograd.grad(want[0].sum() + want[1].sum(), new_inputs))


def test_scripted_functions_call_the_ops():
    @torch.jit.script
    def step(x, w, b, h, c):
        h, c = torch.ops.pyroundlib.lltm_cell(x, w, b, h, c)
        return torch.ops.pyroundlib.round_ste(torch.sigmoid(h)), c

    args = lltm_args("cpu")
    rh, rc = lltm_cell_reference(*args)
    got = step(*args)
    torch.testing.assert_close(got, (torch.round(torch.sigmoid(rh)), rc))


# ---- torch.compile, with what is new ---------------------------------------------------------

def test_compile_dynamic_and_autocast(device):
    torch._dynamo.reset()
    model = Model().to(device)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch in (3, 5, 7):  # new sizes, one dynamic graph
        inputs = model_inputs(device, batch)
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    low = AUTOCAST[device.type]

    def step(*inputs):
        with torch.autocast(device.type, dtype=low):
            return model(*inputs)

    inputs = model_inputs(device)
    got = torch.compile(step, fullgraph=True)(*inputs)
    want = step(*inputs)
    assert got[1].dtype == want[1].dtype == low
    torch.testing.assert_close(got, want, **AUTOCAST_TOL[low])
