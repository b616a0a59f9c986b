"""LLTMLayer as nn.LSTM is used: stacked layers, both directions, dropout between layers,
batch_first, unbatched input, bias=False; against a plain-PyTorch reference (the tutorial's
cell in a loop per layer and direction) in float64, and against nn.LSTM's shapes."""
import copy
import itertools
import warnings

import pytest
import torch
import torch.nn.functional as F

import pyroundlib
from pyroundlib import _cublas, sequence
from pyroundlib.reference import lltm_cell_reference

from conftest import CUDA, TOLERANCES, capture_after_warm_up, requires_cuda, requires_two_gpus

DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
# the inference stack op runs where an op can be called directly without autograd (torch 2.5+:
# torch.library.register_vmap); before, the layer runs layer by layer
STACK_OP = pyroundlib._common.DIRECT_WITHOUT_GRAD
T, B, I, S = 5, 3, 4, 6


def reference(layer, input, state=None):
    """(output, (h_n, c_n)) of `layer`'s configuration, from its parameters, with the tutorial's
    cell stepped through each layer and direction; dropout drawn as the layer draws it."""
    batched = input.dim() == 3
    x = input if batched else input.unsqueeze(1)
    if batched and layer.batch_first:
        x = x.transpose(0, 1)
    directions = 2 if layer.bidirectional else 1
    h_n, c_n = [], []
    for k in range(layer.num_layers):
        outputs = []
        for d in range(directions):
            suffix = f"_l{k}{'_reverse' if d else ''}"
            weights = getattr(layer, f"weights{suffix}")
            bias = getattr(layer, f"bias{suffix}") if layer.has_bias else torch.zeros_like(weights[:, 0])
            index = k * directions + d
            if state is None:
                h = c = x.new_zeros(x.shape[1], layer.state_size)
            else:
                h, c = (t[index] if batched else t[index].unsqueeze(0) for t in state)
            steps = range(x.shape[0] - 1, -1, -1) if d else range(x.shape[0])
            out = [None] * x.shape[0]
            for t in steps:
                h, c = lltm_cell_reference(x[t], weights, bias, h, c)
                out[t] = h
            outputs.append(torch.stack(out))
            h_n.append(h)
            c_n.append(c)
        x = torch.cat(outputs, dim=2)
        if layer.dropout > 0 and layer.training and k < layer.num_layers - 1:
            x = F.dropout(x, layer.dropout, training=True)
    h_n, c_n = torch.stack(h_n), torch.stack(c_n)
    if not batched:
        return x.squeeze(1), (h_n.squeeze(1), c_n.squeeze(1))
    return (x.transpose(0, 1) if layer.batch_first else x), (h_n, c_n)


def packed_reference(layer, x, lengths, state=None):
    """What `layer` gives for a pack of x [T, B, I] at `lengths`: (output padded with zeros,
    (h_n, c_n)), each sequence run alone at its own length by ``reference``."""
    directions = 2 if layer.bidirectional else 1
    output = torch.zeros(*x.shape[:2], directions * layer.state_size, dtype=x.dtype, device=x.device)
    h_n, c_n = [], []
    for i, n in enumerate(lengths):
        o, (h, c) = reference(layer, x[:n, i:i + 1], None if state is None else [t[:, i:i + 1] for t in state])
        output = output.index_put((torch.arange(n, device=x.device), torch.tensor([i], device=x.device)), o[:, 0])
        h_n.append(h)
        c_n.append(c)
    return output, torch.cat(h_n, dim=1), torch.cat(c_n, dim=1)


def flat(result):
    output, (h, c) = result
    return [output, h, c]


CONFIGS = list(itertools.product([1, 3], [False, True], [False, True], [True, False]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,bidirectional,batch_first,bias", CONFIGS)
def test_against_reference(device, num_layers, bidirectional, batch_first, bias):
    """Outputs, final states and the gradients of the input, every parameter and the initial
    state, in float64, with and without a given state; and the shapes nn.LSTM gives."""
    layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bias=bias, batch_first=batch_first,
                                 bidirectional=bidirectional, device=device, dtype=torch.float64)
    lstm = torch.nn.LSTM(I, S, num_layers=num_layers, bias=bias, batch_first=batch_first,
                         bidirectional=bidirectional, device=device, dtype=torch.float64)
    directions = 2 if bidirectional else 1
    shape = (B, T, I) if batch_first else (T, B, I)
    x = torch.randn(*shape, device=device, dtype=torch.float64, requires_grad=True)
    state = [torch.randn(num_layers * directions, B, S, device=device, dtype=torch.float64, requires_grad=True)
             for _ in range(2)]
    for given in (None, state):
        got, want = flat(layer(x, given)), flat(reference(layer, x, given))
        assert [g.shape for g in got] == [w.shape for w in flat(lstm(x, given))]
        torch.testing.assert_close(got, want)
        inputs = [x, *layer.parameters()] + (state if given else [])
        weights = [torch.randn_like(g) for g in got]
        grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), inputs)
        ref_grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights)), inputs)
        torch.testing.assert_close(grads, ref_grads)
    names = [n for n, _ in layer.named_parameters()]
    lstm_names = [n.replace("weight_ih", "weights").replace("bias_ih", "bias") for n, _ in lstm.named_parameters()
                  if "_hh" not in n]
    assert names == lstm_names  # weights_l{k}[_reverse], bias_l{k}[_reverse], in nn.LSTM's order
    for k in range(num_layers):
        width = I if k == 0 else directions * S
        assert layer.get_parameter(f"weights_l{k}").shape == (3 * S, S + width)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bidirectional", [False, True])
def test_unbatched(device, bidirectional):
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=bidirectional, device=device,
                                 dtype=torch.float64)
    x = torch.randn(T, I, device=device, dtype=torch.float64)
    state = [torch.randn(2 * (2 if bidirectional else 1), S, device=device, dtype=torch.float64) for _ in range(2)]
    for given in (None, state):
        got = flat(layer(x, given))
        torch.testing.assert_close(got, flat(reference(layer, x, given)))
        batched = flat(layer(x.unsqueeze(1), None if given is None else [t.unsqueeze(1) for t in given]))
        torch.testing.assert_close(got, [batched[0].squeeze(1), batched[1].squeeze(1), batched[2].squeeze(1)])


@pytest.mark.parametrize("device", DEVICES)
def test_dropout_between_layers_in_training_only(device):
    layer = pyroundlib.LLTMLayer(I, S, num_layers=3, dropout=0.5, bidirectional=True, device=device,
                                 dtype=torch.float64)
    x = torch.randn(T, B, I, device=device, dtype=torch.float64)
    torch.manual_seed(1)
    got = flat(layer(x))
    torch.manual_seed(1)
    want = flat(reference(layer, x))  # the same masks, drawn in the same order
    torch.testing.assert_close(got, want)
    layer.eval()
    evaluated = flat(layer(x))
    assert not torch.equal(evaluated[0], got[0])
    torch.testing.assert_close(evaluated, flat(reference(layer, x)))  # no dropout in eval mode
    last = pyroundlib.LLTMLayer(I, S, num_layers=1, device=device)
    with pytest.warns(UserWarning, match="no effect"):
        pyroundlib.LLTMLayer(I, S, dropout=0.3)
    torch.testing.assert_close(flat(last(x.float())), flat(last(x.float())))  # nothing random with one layer


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (1, True), (3, False), (3, True)])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("route", ["", "0"], ids=["one-call", "step-loop"])
def test_packed_sequences_each_at_its_own_length(monkeypatch, device, num_layers, bidirectional, enforce_sorted,
                                                 route):
    """A PackedSequence against each sequence run alone at its own length by the reference:
    the output (a PackedSequence with the input's sorted_indices), h_n and c_n in the batch's
    own order, and the gradients of the input, every parameter and the initial state; the
    recurrence in one library call per direction, and as the step loop."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    rnn = torch.nn.utils.rnn
    layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bidirectional=bidirectional, device=device,
                                 dtype=torch.float64)
    lengths = [7, 7, 5, 3, 3, 1] if enforce_sorted else [3, 7, 1, 5, 7, 3]
    batch, steps, layers = len(lengths), max(lengths), num_layers * (2 if bidirectional else 1)
    x = torch.randn(steps, batch, I, device=device, dtype=torch.float64, requires_grad=True)
    state = [torch.randn(layers, batch, S, device=device, dtype=torch.float64, requires_grad=True)
             for _ in range(2)]
    packed = rnn.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    output, (h, c) = layer(packed, state)
    assert isinstance(output, rnn.PackedSequence) and torch.equal(output.batch_sizes, packed.batch_sizes)
    if not enforce_sorted:
        assert torch.equal(output.sorted_indices, packed.sorted_indices)
    padded, got_lengths = rnn.pad_packed_sequence(output)
    assert got_lengths.tolist() == lengths
    lstm = torch.nn.LSTM(I, S, num_layers=num_layers, bidirectional=bidirectional, device=device,
                         dtype=torch.float64)
    lstm_out, (lstm_h, _) = lstm(packed, state)
    assert output.data.shape == lstm_out.data.shape and h.shape == c.shape == lstm_h.shape
    want_out, want_h, want_c = packed_reference(layer, x, lengths, state)
    torch.testing.assert_close((padded, h, c), (want_out, want_h, want_c))
    inputs = [x, *layer.parameters(), *state]
    weights = [torch.randn_like(t) for t in (padded, h, c)]
    grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip((padded, h, c), weights)), inputs)
    ref_grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip((want_out, want_h, want_c), weights)), inputs)
    torch.testing.assert_close(grads, ref_grads)
    none = layer(packed)  # zero state
    torch.testing.assert_close(none[1][0][:, 0], reference(layer, x[:lengths[0], :1])[1][0][:, 0])


def test_packed_dropout_in_training_only():
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, dropout=0.5, dtype=torch.float64)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(T, B, I, dtype=torch.float64), [5, 4, 2])
    trained = layer(packed)[0].data
    layer.eval()
    assert not torch.equal(trained, layer(packed)[0].data)
    torch.testing.assert_close(layer(packed)[0].data, layer(packed)[0].data)


def test_gradcheck_two_layers_both_directions():
    layer = pyroundlib.LLTMLayer(3, 4, num_layers=2, bidirectional=True, dtype=torch.float64)
    x = torch.randn(4, 2, 3, dtype=torch.float64, requires_grad=True)
    h0, c0 = (torch.randn(4, 2, 4, dtype=torch.float64, requires_grad=True) for _ in range(2))
    params = list(layer.parameters())

    def fn(x, h0, c0, *ps):
        with torch.nn.utils.stateless._reparametrize_module(layer, dict(zip([n for n, _ in layer.named_parameters()],
                                                                           ps))):
            return flat(layer(x, (h0, c0)))

    assert torch.autograd.gradcheck(fn, (x, h0, c0, *params))
    assert torch.autograd.gradgradcheck(fn, (x, h0, c0, *params))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_packed_two_layers_both_directions(device):
    """First and second derivatives through a pack (the CPU's packed loop, CUDA's runs)."""
    layer = pyroundlib.LLTMLayer(3, 4, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    x = torch.randn(4, 3, 3, device=device, dtype=torch.float64)
    lengths = [2, 4, 1]
    data = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False).data.requires_grad_()
    pack = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    h0, c0 = (torch.randn(4, 3, 4, device=device, dtype=torch.float64, requires_grad=True) for _ in range(2))
    names = [n for n, _ in layer.named_parameters()]

    def fn(data, h0, c0, *ps):
        with torch.nn.utils.stateless._reparametrize_module(layer, dict(zip(names, ps))):
            output, (h, c) = layer(torch.nn.utils.rnn.PackedSequence(data, *pack[1:]), (h0, c0))
            return output.data, h, c

    inputs = (data, h0, c0, *layer.parameters())
    assert torch.autograd.gradcheck(fn, inputs)
    assert torch.autograd.gradgradcheck(fn, inputs)


def test_malformed_packs_raise_naming_the_input():
    """A hand-built PackedSequence whose data or sizes do not fit each other: a ValueError
    before any kernel reads past a buffer."""
    layer = pyroundlib.LLTMLayer(I, S, dtype=torch.float64)
    pack = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(T, B, I, dtype=torch.float64), [5, 4, 2])
    PackedSequence = torch.nn.utils.rnn.PackedSequence
    cases = [(pack.data[:-1], pack.batch_sizes, "input"), (pack.data[:, :-1], pack.batch_sizes, "input"),
             (pack.data, torch.tensor([1, 3, 3, 2, 2]), "batch_sizes"),
             (pack.data, torch.tensor([3, 3, 3, 2, 0]), "batch_sizes")]
    for data, sizes, what in cases:
        with pytest.raises(ValueError, match=what):
            layer(PackedSequence(data, sizes))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_mixed_dtypes_raise_naming_the_argument(device, packed):
    """A state or an input in another dtype than the layer's: a TypeError naming it, padded
    or packed (never a kernel reading one dtype as another)."""
    layer = pyroundlib.LLTMLayer(I, S, device=device)
    x = torch.randn(T, B, I, device=device)
    if packed:
        x = torch.nn.utils.rnn.pack_padded_sequence(x, [5, 3, 2])
    state = tuple(torch.zeros(1, B, S, device=device, dtype=torch.float64) for _ in range(2))
    with pytest.raises(TypeError, match="h0 has dtype torch.float64"):
        layer(x, state)
    with pytest.raises(TypeError, match="float64"):
        layer(x.double() if not packed else x.to(torch.float64))


def test_bad_state_names_the_expected_shape():
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True)
    x = torch.randn(T, B, I)
    with pytest.raises(ValueError, match=r"h0 must be \[num_layers\*num_directions, batch, state_size\] = \[4, 3, 6\]"):
        layer(x, (torch.zeros(2, B, S), torch.zeros(4, B, S)))
    with pytest.raises(ValueError, match=r"c0 .* = \[4, 3, 6\], got \[4, 2, 6\]"):
        layer(x, (torch.zeros(4, B, S), torch.zeros(4, 2, S)))
    with pytest.raises(TypeError, match="state must be a tuple"):
        layer(x, torch.zeros(4, B, S))
    with pytest.raises(ValueError, match="input must be a 3-D tensor"):
        layer(torch.zeros(2, 3, 4, 5))
    with pytest.raises(ValueError, match="num_layers must be an int >= 1"):
        pyroundlib.LLTMLayer(I, S, num_layers=0)
    with pytest.raises(ValueError, match="dropout must be a number in"):
        pyroundlib.LLTMLayer(I, S, dropout=1.5)


def test_earlier_checkpoints_and_names():
    """A cell's checkpoint, and a 0.4.0 layer's (``weights``, ``bias``), load into a one-layer
    layer, and its into a cell; ``weights``/``bias`` and a [B, S] state still work, with a
    DeprecationWarning naming the replacement."""
    cell = pyroundlib.LLTM(I, S)
    layer = pyroundlib.LLTMLayer(I, S)
    layer.load_state_dict(cell.state_dict())
    assert torch.equal(layer.weights_l0, cell.weights) and torch.equal(layer.bias_l0, cell.bias)
    other = pyroundlib.LLTM(I, S)
    other.load_state_dict(layer.state_dict())
    assert torch.equal(other.weights, cell.weights)
    with pytest.warns(DeprecationWarning, match="use LLTMLayer.weights_l0"):
        assert layer.weights is layer.weights_l0
    with pytest.warns(DeprecationWarning, match="use LLTMLayer.bias_l0"):
        assert layer.bias is layer.bias_l0
    x = torch.randn(T, B, I)
    h0, c0 = torch.randn(B, S), torch.randn(B, S)
    with pytest.warns(DeprecationWarning, match=r"\[num_layers\*num_directions, batch, state_size\]"):
        output, (h, c) = layer(x, (h0, c0))
    assert h.shape == c.shape == (B, S)
    new_output, (new_h, new_c) = layer(x, (h0[None], c0[None]))
    torch.testing.assert_close((output, h, c), (new_output, new_h[0], new_c[0]))
    with pytest.raises(RuntimeError):  # a three-layer layer has more than a cell's parameters
        pyroundlib.LLTMLayer(I, S, num_layers=3).load_state_dict(cell.state_dict())
    assert "bias=False" in repr(pyroundlib.LLTMLayer(I, S, bias=False, num_layers=2))


@pytest.mark.parametrize("device", DEVICES)
def test_parametrized_and_swapped_parameters(device):
    """Parameters as users reshape them: a parametrization (weight_norm) on some of them, and
    torch.func.functional_call's swapped tensors: the layer computes with what its attributes
    are, in training (gradients reach the parametrization's tensors) and in inference."""
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    for name in ("weights_l0", "bias_l1_reverse"):
        torch.nn.utils.parametrizations.weight_norm(layer, name)
    x = torch.randn(T, B, I, device=device, dtype=torch.float64, requires_grad=True)
    got, want = flat(layer(x)), flat(reference(layer, x))
    torch.testing.assert_close(got, want)
    leaves = [x, *layer.parameters()]
    assert any("parametrizations" in name for name, _ in layer.named_parameters())
    torch.testing.assert_close(torch.autograd.grad(sum(t.sum() for t in got), leaves),
                               torch.autograd.grad(sum(t.sum() for t in want), leaves))
    with torch.inference_mode():
        torch.testing.assert_close(flat(layer(x.detach())), [t.detach() for t in want])
    plain = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    swapped = {name: torch.randn_like(p) * 0.3 for name, p in plain.named_parameters()}
    want = flat(reference(plain, x.detach()))
    for mode in (torch.no_grad, torch.enable_grad):
        with mode():
            got = flat(torch.func.functional_call(plain, swapped, (x.detach(),)))
        assert not torch.equal(got[0], want[0])  # the swapped parameters, not the layer's own
        plain.load_state_dict(swapped)
        torch.testing.assert_close(got, flat(reference(plain, x.detach())))
        plain = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
        want = flat(reference(plain, x.detach()))


def test_compile_fullgraph_stacked_both_directions():
    torch._dynamo.reset()
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, batch_first=True)
    compiled = torch.compile(layer, fullgraph=True)
    x = torch.randn(B, T, I, requires_grad=True)
    got, want = flat(compiled(x)), flat(layer(x))
    torch.testing.assert_close(got, want)
    params = [x, *layer.parameters()]
    torch.testing.assert_close(torch.autograd.grad(sum(g.sum() for g in got), params),
                               torch.autograd.grad(sum(w.sum() for w in want), params))


def test_packed_forwards_then_their_backwards():
    """Two forwards over a pack, then both backwards, each handed expanded (zero-stride)
    gradients, as sum() gives: each gets the gradients of a lone forward and backward."""
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, dtype=torch.float64)
    data = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(T, B, I, dtype=torch.float64), [5, 3, 2])
    packed = torch.nn.utils.rnn.PackedSequence(data.data.requires_grad_(), *data[1:])
    params = [packed.data, *layer.parameters()]
    alone = torch.autograd.grad(sum(t.sum() for t in layer_outputs(layer(packed))), params)
    first, second = layer_outputs(layer(packed)), layer_outputs(layer(packed))
    for outputs in (first, second):
        torch.testing.assert_close(torch.autograd.grad(sum(t.sum() for t in outputs), params), alone)


def test_compile_packed_as_nn_lstm_does():
    """Packed input under torch.compile (not fullgraph: the pack's sizes are read on the host,
    a graph break, as for nn.LSTM): the eager layer's outputs and gradients."""
    torch._dynamo.reset()
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True)
    data = torch.nn.utils.rnn.pack_padded_sequence(torch.randn(T, B, I), [5, 3, 2])
    packed = torch.nn.utils.rnn.PackedSequence(data.data.requires_grad_(), *data[1:])
    got, want = layer_outputs(torch.compile(layer)(packed)), layer_outputs(layer(packed))
    torch.testing.assert_close(got, want)
    params = [packed.data, *layer.parameters()]
    torch.testing.assert_close(torch.autograd.grad(sum(g.sum() for g in got), params),
                               torch.autograd.grad(sum(w.sum() for w in want), params))


def layer_outputs(result):
    output, (h, c) = result
    return [output.data, h, c]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "0"], ids=["default", "step-loop"])
def test_autocast_stacked_both_directions(monkeypatch, device, route):
    """A float32 layer under autocast runs in bfloat16 (on CUDA's step loop: its directions in
    lockstep, decided for the autocast dtype); float32 gradients for the float32 parameters."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    taken, both = [], pyroundlib.layer._Padded.both_forward
    monkeypatch.setattr(pyroundlib.layer._Padded, "both_forward", lambda *args: taken.append(1) or both(*args))
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device)
    x = torch.randn(T, B, I, device=device)
    with torch.autocast(device, dtype=torch.bfloat16):
        output, (h, c) = layer(x)
    assert output.dtype == h.dtype == c.dtype == torch.bfloat16
    assert len(taken) == (2 if device == "cuda" and route == "0" else 0)
    want = flat(reference(copy.deepcopy(layer).cpu(), x.cpu()))
    torch.testing.assert_close([output.float().cpu(), h.float().cpu(), c.float().cpu()], want, rtol=5e-2,
                               atol=5e-2)
    grads = torch.autograd.grad(output.float().sum(), list(layer.parameters()))
    assert all(g.dtype == torch.float32 for g in grads)


def test_export_stacked_both_directions():
    """torch.export records the differentiable sequence op for every layer and direction; the
    exported program computes the eager layer's outputs and gradients."""
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, batch_first=True)
    x = torch.randn(B, T, I)
    program = torch.export.export(layer, (x,))
    calls = [n for n in program.graph.nodes if n.target == torch.ops.pyroundlib.lltm_sequence_forward.default]
    assert len(calls) == 4
    exported = program.module()
    x = torch.randn(B, T, I, requires_grad=True)
    got, want = flat(exported(x)), flat(layer(x))
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(sum(g.sum() for g in got), [x, *exported.parameters()]),
                               torch.autograd.grad(sum(w.sum() for w in want), [x, *layer.parameters()]))


# ---- CUDA: a second GPU, a side stream, the caller's CUDA graph --------------------------------

def stacked_case(device, dtype=torch.float32, packed=True):
    """A 2-layer bidirectional layer and its inputs on `device`: (layer, input, state, loss), the
    input a pack of sequences of lengths 7, 3, 5, 7, 1, 4 (enforce_sorted=False) or padded; loss
    takes the layer's result (on any device) to a scalar that weighs every output element."""
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    x = torch.randn(7, 6, I, device=device, dtype=dtype)
    state = [torch.randn(4, 6, S, device=device, dtype=dtype) for _ in range(2)]
    if packed:
        x = torch.nn.utils.rnn.pack_padded_sequence(x, [7, 3, 5, 7, 1, 4], enforce_sorted=False)
    out = (x.data.shape[0],) if packed else (7, 6)
    weights = [torch.randn(*out, 2 * S, dtype=torch.float64)] + [torch.randn(4, 6, S, dtype=torch.float64)
                                                                 for _ in range(2)]
    on_device = [w.to(device) for w in weights]  # no copy from the host while a graph is captured

    def loss(result):
        output, (h, c) = result
        output = output.data if packed else output  # the pack's rows, as nn.LSTM's are
        ws = on_device if output.device == on_device[0].device else weights
        return sum((t.double() * w).sum() for t, w in zip((output, h, c), ws))

    return layer, x, state, loss


def check_stacked(layer, x, state, loss, result=None, grads=None):
    """The layer's loss and parameter gradients (computed now, or given) against the same layer
    copied to the CPU in float64."""
    if result is None:
        value = loss(layer(x, state))
        grads = torch.autograd.grad(value, list(layer.parameters()))
    else:
        value = result
    ref = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, dtype=torch.float64)
    ref.load_state_dict({k: v.detach().cpu().double() for k, v in layer.state_dict().items()})
    cpu_x = x.to("cpu", torch.float64)  # a PackedSequence or a tensor
    want = loss(ref(cpu_x, [t.detach().cpu().double() for t in state]))
    want_grads = torch.autograd.grad(want, list(ref.parameters()))
    for got, ref_value in zip([value, *grads], [want, *want_grads]):
        got = got.detach().cpu().double()
        if layer.weights_l0.dtype in (torch.float16, torch.bfloat16):  # rounding of every stored step
            assert (got - ref_value).norm() <= 0.05 * ref_value.norm() + (0.2 if got.dim() == 0 else 1e-2)
        else:
            torch.testing.assert_close(got, ref_value, **TOLERANCES[layer.weights_l0.dtype])


@requires_two_gpus
@pytest.mark.parametrize("route", ["1", "0", "fused"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_stacked_on_the_second_gpu(monkeypatch, route, packed):
    """Every CUDA route of a 2-layer bidirectional layer on cuda:1 while cuda:0 is current, on
    cuda:1's default stream and on another of its streams, then on cuda:0 and cuda:1 again."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    torch.cuda.set_device(0)
    for device in ("cuda:1", "cuda:0", "cuda:1"):
        check_stacked(*stacked_case(device, packed=packed))
        assert torch.cuda.current_device() == 0
    stream = torch.cuda.Stream("cuda:1")
    stream.wait_stream(torch.cuda.current_stream("cuda:1"))
    with torch.cuda.stream(stream):
        check_stacked(*stacked_case("cuda:1", packed=packed))
        layer, x, state, _ = stacked_case("cuda:1", packed=packed)
        want = flat(layer(x, state))  # then inference: on the fused route, the stack op
        with torch.inference_mode():
            got = flat(layer(x, state))
    torch.cuda.current_stream("cuda:1").wait_stream(stream)
    torch.testing.assert_close([t.data if packed and i == 0 else t for i, t in enumerate(got)],
                               [t.data if packed and i == 0 else t for i, t in enumerate(want)])
    assert torch.cuda.current_device() == 0


def step_loop_from(monkeypatch, device, where):
    """A pack's step loop on CUDA in the library over torch's cuBLAS ("library", asserted to be
    available there) or from Python ("python": PYROUNDLIB_CUBLAS=0); the CPU has the latter only."""
    if where == "python":
        monkeypatch.setenv(_cublas.ENV_VAR, "0")
    elif device == "cuda":
        assert _cublas.for_tensor(torch.zeros(1, device=device)) is not None, "torch's cuBLAS not found"
    else:
        pytest.skip("the CPU runs a pack's step loop from Python only")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "1", "0", "0-python"],
                         ids=["default", "one-call", "step-loop", "step-loop-from-python"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_packed_routes(monkeypatch, device, route, dtype):
    """Every route of a pack's recurrence (on CUDA by default the fused kernels over its rows
    at this size; one library call per direction; the step loop, on CUDA in the library and
    from Python) in every dtype against the CPU's float64 result; on CUDA into memory the
    caching allocator filled with NaN first: every output and gradient element written."""
    if route.startswith("0"):
        route, where = "0", route[2:] or "library"
        step_loop_from(monkeypatch, device, where)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    layer, x, state, loss = stacked_case(device, dtype, packed=True)
    expected = sequence.STEPS if route == "0" else \
        sequence.FUSED if device == "cuda" and route == "" else sequence.ONE_CALL
    assert sequence._packed_route(x.data, len(x.batch_sizes), 6, I, S) is expected
    if device == "cuda":
        poison = [torch.full((1 << 18,), float("nan"), device="cuda") for _ in range(64)]  # 64 MiB: small blocks
        del poison
    output, (h, c) = layer(x, state)
    value = loss((output, (h, c)))
    grads = torch.autograd.grad(value, list(layer.parameters()))
    for t in (output.data, h, c, *grads):
        assert not torch.isnan(t).any(), "elements not written"
    monkeypatch.delenv(sequence.PERSISTENT_ENV_VAR)  # the float64 CPU result from the library's loop
    check_stacked(layer, x, state, loss, value, grads)


def forced_lockstep(self, x, state, features=None):
    """_Packed.lockstep or _Padded.lockstep taking every bidirectional layer, where its rule would
    not (the CPU, full precision): the lockstep's calls tested on every device and dtype."""
    return self.directions == 2


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("packed", ["packed", "packed-split", "packed-from-python", "padded"])
def test_directions_in_lockstep(monkeypatch, device, dtype, packed):
    """A bidirectional layer's two directions as one step loop (a pack's: _packed.both_forward,
    both_backward, on CUDA in the library, there also with each backward step's product split
    in 3 slices of its inner dimension ("packed-split", in every dtype), and from Python; a
    padded batch's: _Padded.both_forward, both_backward): taken by the rule on CUDA in bfloat16
    and float32 at this size, forced elsewhere.  Output, h_n, c_n and the gradients of the
    input, every parameter and the state against the tutorial cell in float64 on the CPU, each
    sequence run alone, every element written (on CUDA into NaN-filled memory); inference the
    same bits as training."""
    splits, in_library = [], device == "cuda" and packed in ("packed", "packed-split")
    if packed != "padded":
        step_loop_from(monkeypatch, device, "python" if packed.endswith("python") else "library")
    if packed == "packed-split":
        monkeypatch.setattr(pyroundlib._packed, "split_parts", lambda data, state: splits.append(3) or 3)
    elif packed == "packed":  # the rule: no split at S = 6 (3S is not a multiple of SPLIT_PARTS)
        monkeypatch.setattr(pyroundlib._packed, "split_parts",
                            lambda data, state, rule=pyroundlib._packed.split_parts: splits.append(rule(data, state))
                            or splits[-1])
    packed = packed != "padded"
    layout = pyroundlib.layer._Packed if packed else pyroundlib.layer._Padded
    if not (device == "cuda" and dtype in (torch.bfloat16, torch.float32)):
        monkeypatch.setattr(layout, "lockstep", forced_lockstep)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")  # the step loop, as where the kernels do not fit
    taken, both = [], layout.both_forward
    monkeypatch.setattr(layout, "both_forward", lambda *args: taken.append(1) or both(*args))
    torch.manual_seed(0)
    lengths = [7, 3, 5, 7, 1, 4] if packed else [7] * 6
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    x = torch.randn(7, len(lengths), I, device=device, dtype=dtype, requires_grad=True)
    state = [torch.randn(4, len(lengths), S, device=device, dtype=dtype, requires_grad=True) for _ in range(2)]
    if device == "cuda":
        poison = [torch.full((1 << 18,), float("nan"), device="cuda") for _ in range(64)]
        del poison
    given = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False) if packed else x
    output, (h, c) = layer(given, state)
    results = (torch.nn.utils.rnn.pad_packed_sequence(output)[0] if packed else output, h, c)
    with torch.inference_mode():
        inferred = flat(layer(given, state))
    assert len(taken) == 4  # each layer, in training and in inference
    assert all(torch.equal(a.data, b.data) for a, b in zip(inferred, (output, h, c)))
    weights = [torch.randn(t.shape, dtype=torch.float64) for t in results]
    inputs = [x, *layer.parameters(), *state]
    grads = torch.autograd.grad(sum((t.double() * w.to(device)).sum() for t, w in zip(results, weights)), inputs)
    if in_library:  # both layers' backward
        assert splits in ([3, 3], [1, 1]), splits
    ref = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, dtype=torch.float64)
    ref.load_state_dict({k: v.detach().cpu().double() for k, v in layer.state_dict().items()})
    ref_inputs = [t.detach().cpu().double().requires_grad_() for t in (x, *state)]
    want = packed_reference(ref, ref_inputs[0], lengths, ref_inputs[1:])
    want_grads = torch.autograd.grad(sum((t * w).sum() for t, w in zip(want, weights)),
                                     [ref_inputs[0], *ref.parameters(), *ref_inputs[1:]])
    for got, expected in zip((*results, *grads), (*want, *want_grads)):
        got = got.detach().cpu().double()
        assert not torch.isnan(got).any(), "elements not written"
        if dtype == torch.bfloat16:  # the rounding of every stored step
            assert (got - expected).norm() <= 0.05 * expected.norm() + 1e-2
        else:
            torch.testing.assert_close(got, expected, **TOLERANCES[dtype])


def replay_case(device, dtype):
    """A 2-layer bidirectional layer, its input (7, 6, I) and state, weights for a loss of every
    result, and the tensors to differentiate; the graphs cleared first."""
    pyroundlib.graphs.clear()
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    x = torch.randn(7, 6, I, device=device, dtype=dtype, requires_grad=True)
    state = [torch.randn(4, 6, S, device=device, dtype=dtype, requires_grad=True) for _ in range(2)]
    weights = [torch.randn(7, 6, 2 * S, device=device)] + [torch.randn(4, 6, S, device=device) for _ in range(2)]
    return layer, x, state, weights, [x, *layer.parameters(), *state]


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
@pytest.mark.parametrize("keep", [False, True], ids=["own-tensors", "over-copies"])
@pytest.mark.parametrize("device", ["cuda:0", pytest.param("cuda:1", marks=requires_two_gpus)])
def test_padded_lockstep_replayed_from_graphs(monkeypatch, keep, dtype, device):
    """A padded layer's lockstep loops in bfloat16, and in float32 without TF32 (its products a
    direction at a time), replayed from CUDA graphs: five calls with the graphs on, each the bits
    of the call with them off (output, h_n, c_n, every gradient); the forward's and the
    backward's loops each captured (over the calls' own tensors, or, with the results kept
    alive, over copies). In float32 the captures run the reverse direction's products on a side
    stream of the layer's device. On cuda:1, cuda:0 is current throughout."""
    torch.cuda.set_device(0)
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    torch.backends.cuda.matmul.allow_tf32 = False
    assert pyroundlib.layer._products_apart(torch.empty(0, device=device, dtype=dtype)) == (dtype == torch.float32)
    beside, sides = pyroundlib.layer._beside, []
    monkeypatch.setattr(pyroundlib.layer, "_beside",
                        lambda *a: sides.append((torch.cuda.is_current_stream_capturing(), beside(*a))) or sides[-1][1])
    layer, x, state, weights, inputs = replay_case(device, dtype)

    def call():
        results = flat(layer(x, state))
        grads = torch.autograd.grad(sum((t.float() * w).sum() for t, w in zip(results, weights)), inputs)
        return [t.detach() for t in (*results, *grads)]
    assert pyroundlib.layer._Padded(2).lockstep(x, S)
    monkeypatch.setenv(pyroundlib.graphs.ENV_VAR, "0")
    want = [t.clone() for t in call()]
    monkeypatch.setenv(pyroundlib.graphs.ENV_VAR, "1")
    kept = []
    for i in range(5):
        got = call()
        assert all(torch.equal(g, w) for g, w in zip(got, want)), i
        if keep:
            kept.append(got)
        del got
    loops = {key[0] for key in pyroundlib.graphs._graphs}
    assert {pyroundlib.layer._both_forward_loop, pyroundlib.layer._both_backward_loop} <= loops, loops
    if keep:
        assert any(isinstance(g, pyroundlib.graphs._OverCopies) for g in pyroundlib.graphs._graphs.values())
    assert any(capturing for capturing, _ in sides), sides
    for capturing, side in sides:  # a side stream exactly where a float32 loop is captured
        assert (side is not None) == (capturing and dtype == torch.float32), sides
        assert side is None or (side.device == torch.device(device)
                                and side.cuda_stream != torch.cuda.current_stream(device).cuda_stream)
    assert torch.cuda.current_device() == 0
    pyroundlib.graphs.clear()


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("loss", ["weighted", "output-sum"])
@pytest.mark.parametrize("keep", [False, True], ids=["own-tensors", "kept"])
@pytest.mark.parametrize("device", ["cuda:0", pytest.param("cuda:1", marks=requires_two_gpus)])
def test_fused_stack_replayed_from_graphs(monkeypatch, dtype, loss, keep, device):
    """A padded 2-layer bidirectional layer on the fused kernels, its forward and backward each
    replayed from one CUDA graph: five calls with graphs on, each the bits of the call with them
    off (output, h_n, c_n, every gradient), for a loss of every result (each gradient given) and
    for output.sum() alone (an expanded gradient; none for h_n, c_n).  Repeated calls replay
    graphs over their own tensors; with the results kept alive the addresses move and the loops
    run from Python, never over copies.  On cuda:1, cuda:0 is current throughout."""
    torch.cuda.set_device(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    layer, x, state, weights, inputs = replay_case(device, dtype)
    assert not pyroundlib.layer._Padded(2).lockstep(x, S) and pyroundlib.layer._Padded(2).takes(x, S, 2)

    def call():
        results = flat(layer(x, state))
        total = results[0].float().sum() if loss == "output-sum" else \
            sum((t.float() * w).sum() for t, w in zip(results, weights))
        grads = torch.autograd.grad(total, inputs)
        return [t.detach() for t in (*results, *grads)]
    monkeypatch.setenv(pyroundlib.graphs.ENV_VAR, "0")
    want = [t.clone() for t in call()]
    assert not pyroundlib.graphs._graphs
    monkeypatch.setenv(pyroundlib.graphs.ENV_VAR, "1")
    kept = []
    for i in range(5):
        got = call()
        assert all(torch.equal(g, w) for g, w in zip(got, want)), i
        assert all(not t.isnan().any() for t in got)
        if keep:
            kept.append(got)
        del got
    if dtype == torch.float64:  # and the route's results are the reference's
        output, (h_n, c_n) = reference(layer, x, state)
        for got, expected in zip(want, (output, h_n, c_n)):
            torch.testing.assert_close(got, expected.detach())
    given = (True, False, False) if loss == "output-sum" else (True, True, True)
    loops = {key[0] for key in pyroundlib.graphs._graphs}
    if keep:
        assert not loops & {pyroundlib.layer._stack_loop(True, 2), pyroundlib.layer._stack_loop(False, 2, given)}
    else:
        assert {pyroundlib.layer._stack_loop(True, 2), pyroundlib.layer._stack_loop(False, 2, given)} <= loops, loops
    assert all(isinstance(g, torch.cuda.CUDAGraph) for g in pyroundlib.graphs._graphs.values())
    assert torch.cuda.current_device() == 0
    pyroundlib.graphs.clear()


@pytest.mark.parametrize("tf32", [False, True], ids=["tf32-off", "tf32-on"])
def test_split_parts_rule(monkeypatch, tf32):
    """A pack's lockstep backward splits each step's product (prl_lltm_packed_steps_backward_cuda's
    parts) in SPLIT_PARTS slices in full-precision float32 where they divide 3S; else not."""
    torch.backends.cuda.matmul.allow_tf32 = tf32
    rule, parts = pyroundlib._packed.split_parts, pyroundlib._packed.SPLIT_PARTS
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        data = torch.empty(2, 3, dtype=dtype)
        for state in (64, 768, 6):
            split = dtype == torch.float32 and not tf32 and 3 * state % parts == 0
            assert rule(data, state) == (parts if split else 1)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_lockstep_rule(monkeypatch, dtype):
    """Where a layer's two directions run in lockstep on CUDA (the step loop's route): a padded
    batch up to B*S = LOCKSTEP_MAX_WORK of its dtype; a pack at any B*S where the products run on
    tensor cores, else up to the same B*S; never in float64, nor with one direction."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
    torch.backends.cuda.matmul.allow_tf32 = False
    limit = pyroundlib.layer.LOCKSTEP_MAX_WORK.get(dtype, 0)
    for batch, state in ((16, 64), (64, 1024), (512, 1024)):
        x = torch.empty(3, batch, 8, device="cuda", dtype=dtype)
        fits = batch * state <= limit
        assert pyroundlib.layer._Padded(2).lockstep(x, state) == fits
        assert not pyroundlib.layer._Padded(1).lockstep(x, state)
        pack = pyroundlib._packed.Pack(torch.tensor([batch] * 3), x.device)
        assert pyroundlib.layer._Packed(2, pack).lockstep(x[0], state) == (dtype != torch.float64 and (
            dtype != torch.float32 or fits))
    assert limit == 0 or 16 * 64 <= limit < 512 * 1024


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "0"], ids=["one-call", "step-loop"])
def test_packed_inference_runs_no_autograd_node(monkeypatch, device, route):
    """A pack where no gradient is wanted (inference mode, no_grad) runs each direction's
    forward without PackedLLTMFunction: the same bits as with it, results that need no graph;
    or, on CUDA where the fused kernels take every layer, the whole stack as one op."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    layer, x, state, _ = stacked_case(device)
    output, (h, c) = layer(x, state)
    want = [t.detach() for t in (output.data, h, c)]
    calls, stack_calls = [], counting_stack_calls(monkeypatch)
    apply = pyroundlib._packed.PackedLLTMFunction.apply
    monkeypatch.setattr(pyroundlib._packed.PackedLLTMFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    stacked = STACK_OP and device == "cuda" and route == ""
    for mode in (torch.inference_mode, torch.no_grad):
        with mode():
            output, (h, c) = layer(x, state)
        assert not any(t.requires_grad for t in (output.data, h, c))
        if stacked:  # other kernels: the float32 tolerance
            torch.testing.assert_close([output.data, h, c], want)
        else:
            assert all(torch.equal(g, w) for g, w in zip((output.data, h, c), want))
    assert not calls and len(stack_calls) == (2 if stacked else 0)


@requires_cuda
@pytest.mark.parametrize("dtype,state", [(torch.float32, 64), (torch.float32, 100), (torch.float32, 300),
                                         (torch.bfloat16, 64), (torch.bfloat16, 100), (torch.float64, 32),
                                         (torch.float64, 40)], ids=str)
def test_packed_one_call_with_one_and_several_column_tiles(monkeypatch, dtype, state):
    """A pack through the persistent kernels where one block holds every state column (float32
    and bfloat16 up to S = 64, float64 up to 32: its steps separated by its own barrier), where
    a few blocks do (S = 100 in float32, 40 in float64: one cluster per row tile on a GPU with
    clusters) and where many do (S = 300: the grid's barrier): output, h_n, c_n and every
    gradient against the tutorial cell in float64, each sequence run alone."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")  # the persistent kernels where the fused ones could run
    check_pack_against_the_cell([9, 2, 6, 9, 4, 1, 7], state, dtype, sequence.ONE_CALL)


@requires_cuda
@pytest.mark.skipif(CUDA and torch.cuda.get_device_capability()[0] < 8, reason="tensor cores: sm_80 and later")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_packed_one_call_two_pairs_a_thread(monkeypatch, dtype):
    """A pack of 64 sequences at S = 768 on the persistent kernels whose threads finish two
    (row, column) pairs a step (test_sequence.py's test_persistent_kernels_two_pairs_a_thread):
    against the tutorial cell in float64.  Skips where the grid does not fit."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "1")
    monkeypatch.setattr(sequence, "_persistent_fits", {})
    lengths = torch.randint(1, 6, (64,), generator=torch.Generator().manual_seed(768)).tolist()
    if not sequence._packed_in_one_call(torch.empty(1, device="cuda", dtype=dtype), 64, 768):
        pytest.skip("(64, 768) does not fit in one co-resident grid on this GPU")
    check_pack_against_the_cell(lengths, 768, dtype, sequence.ONE_CALL)


@requires_cuda
@pytest.mark.parametrize("dtype,state,batch", [(torch.float32, 64, 40), (torch.float32, 8, 150),
                                               (torch.bfloat16, 32, 70), (torch.float16, 16, 9),
                                               (torch.float64, 16, 40)], ids=str)
def test_packed_fused_kernels(dtype, state, batch):
    """A pack through the fused kernels over its rows (the default for short packs of small
    states): batches over several blocks, each block's rows of different lengths, sequences of
    one step among them; against the tutorial cell in float64, each sequence run alone."""
    lengths = torch.randint(1, 13, (batch,), generator=torch.Generator().manual_seed(batch)).tolist()
    lengths[batch // 2], lengths[-1] = 12, 1
    check_pack_against_the_cell(lengths, state, dtype, sequence.FUSED)


def check_pack_against_the_cell(lengths, state, dtype, route):
    """A bidirectional layer over an unsorted pack at `lengths` on CUDA (its route `route`):
    output, h_n, c_n and every gradient against the tutorial cell in float64, each sequence run
    alone; every element written."""
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, state, bidirectional=True, device="cuda", dtype=dtype)
    x = torch.randn(max(lengths), len(lengths), I, device="cuda", dtype=dtype, requires_grad=True)
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
    assert sequence._packed_route(packed.data, max(lengths), len(lengths), I, state) is route
    poison_cuda_memory("cuda")
    output, (h, c) = layer(packed)
    padded = torch.nn.utils.rnn.pad_packed_sequence(output)[0]
    weights = [torch.randn_like(t) for t in (padded, h, c)]
    grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip((padded, h, c), weights)),
                                [x, *layer.parameters()])
    ref = pyroundlib.LLTMLayer(I, state, bidirectional=True, dtype=torch.float64)
    ref.load_state_dict({k: v.detach().cpu().double() for k, v in layer.state_dict().items()})
    ref_x = x.detach().cpu().double().requires_grad_()
    want = packed_reference(ref, ref_x, lengths)
    want_grads = torch.autograd.grad(sum((g * w.cpu().double()).sum() for g, w in zip(want, weights)),
                                     [ref_x, *ref.parameters()])
    assert not any(torch.isnan(t).any() for t in (output.data, h, c, *grads)), "elements not written"
    for got, expected in zip((padded, h, c, *grads), (*want, *want_grads)):
        got = got.detach().cpu().double()
        if dtype in (torch.bfloat16, torch.float16):  # rounding of every stored step
            assert (got - expected).norm() <= 0.05 * expected.norm() + 1e-2
        else:
            torch.testing.assert_close(got, expected, **TOLERANCES[dtype])


@requires_cuda
def test_packed_batch_sizes_on_the_gpu_too():
    """A PackedSequence with its batch_sizes on the GPU (torch's own packs keep them on the
    CPU; older torch let a hand-built pack have them there, newer torch's constructor refuses,
    so it is made here as the named tuple it is) behaves as it does for nn.LSTM: the same
    result (the sizes are read on the host), or the same refusal where torch refuses such a
    pack for the output."""
    layer, x, state, loss = stacked_case("cuda", torch.float64, packed=True)
    on_gpu = torch.nn.utils.rnn.PackedSequence._make(
        (x.data, x.batch_sizes.cuda(), x.sorted_indices, x.unsorted_indices))
    assert on_gpu.batch_sizes.is_cuda
    lstm = torch.nn.LSTM(x.data.shape[1], 3, device="cuda", dtype=torch.float64)
    try:
        lstm(on_gpu)
    except (ValueError, RuntimeError) as refusal:  # "batch_sizes ... should be on CPU"
        assert "on CPU" in str(refusal)
        with pytest.raises((ValueError, RuntimeError), match="on CPU"):
            layer(on_gpu, state)
    else:
        torch.testing.assert_close(loss(layer(on_gpu, state)), loss(layer(x, state)))


@requires_cuda
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype,route", [(torch.float32, ""), (torch.bfloat16, "0")],
                         ids=["float32", "bfloat16-step-loop"])  # a pack's: its directions in lockstep
def test_stacked_on_a_busy_side_stream(monkeypatch, packed, dtype, route):
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    layer, x, state, loss = stacked_case("cuda", dtype, packed=packed)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(1_000_000)  # a launch on another stream would race with it
        value = loss(layer(x, state))
        grads = torch.autograd.grad(value, list(layer.parameters()))
    torch.cuda.current_stream().wait_stream(side)
    check_stacked(layer, x, state, loss, value, grads)


@requires_cuda
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("route", ["", "0"], ids=["default", "step-loop"])
def test_stacked_training_step_in_a_users_cuda_graph(monkeypatch, packed, dtype, route):
    """A 2-layer bidirectional layer's forward and backward captured into the caller's CUDA
    graph and replayed on new data in the captured input; with the step loop too (a bfloat16
    pack's: both directions in lockstep)."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    layer, x, state, loss = stacked_case("cuda", dtype, packed)
    static = x.data if packed else x

    def step():
        layer.zero_grad(set_to_none=True)  # the captured backward allocates .grad in the graph's pool
        value = loss(layer(x, state))
        value.backward()
        return value

    graph, value = capture_after_warm_up(step)
    for _ in range(2):
        static.copy_(torch.randn_like(static))
        graph.replay()
        torch.cuda.synchronize()
        check_stacked(layer, x, state, loss, value, [p.grad for p in layer.parameters()])


def test_tracing_does_not_touch_the_deprecated_names():
    """torch.jit.trace scans a module's attributes: the deprecated weights/bias must not warn
    for a user who never named them."""
    layer = pyroundlib.LLTMLayer(I, S)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.jit.trace(layer, (torch.randn(T, B, I),))
    assert not [w for w in caught if "LLTMLayer" in str(w.message)], [str(w.message) for w in caught]


# ---- inference: the whole stack as one op (pyroundlib::lltm_layers_inference) ----------------

def counting_stack_calls(monkeypatch):
    """A list that gets an entry for each stack op a layer runs."""
    calls = []
    run = pyroundlib.layer.LLTMLayer._inference_stack

    def counted(self, *args):
        result = run(self, *args)
        if result is not None:
            calls.append(1)
        return result
    monkeypatch.setattr(pyroundlib.layer.LLTMLayer, "_inference_stack", counted)
    return calls


def check_inference(layer, x, state, got):
    """`got` (output, (h_n, c_n)) against the reference on a float64 copy of the layer; 16-bit
    results within the rounding of every stored step; no element left unwritten."""
    ref = pyroundlib.LLTMLayer(layer.input_features, layer.state_size, num_layers=layer.num_layers,
                               bias=layer.has_bias, batch_first=layer.batch_first, bidirectional=layer.bidirectional,
                               dtype=torch.float64).eval()
    ref.load_state_dict({k: v.detach().cpu().double() for k, v in layer.state_dict().items()})
    want = flat(reference(ref, x.cpu().double(), None if state is None else [t.cpu().double() for t in state]))
    for g, w in zip(flat(got), want):
        assert not g.requires_grad and not torch.isnan(g).any(), "elements not written"
        g = g.cpu().double()
        if layer.weights_l0.dtype in (torch.float16, torch.bfloat16):
            assert (g - w).norm() <= 0.05 * w.norm() + 1e-2
        else:
            torch.testing.assert_close(g, w, **TOLERANCES[layer.weights_l0.dtype])


def poison_cuda_memory(device):
    if device == "cuda":  # the caching allocator's blocks filled with NaN: unwritten elements show
        poison = [torch.full((1 << 18,), float("nan"), device="cuda") for _ in range(64)]
        del poison


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,bidirectional,batch_first,bias", CONFIGS)
def test_inference_runs_the_stack_as_one_op(monkeypatch, device, num_layers, bidirectional, batch_first, bias):
    """Under inference_mode and no_grad a padded batch runs every layer and direction in one op
    (on CUDA the fused kernels' layer launch: both directions at once, the reverse reading the
    sequence backwards; on the CPU the library loop's call a direction).  Against the float64
    reference, given a state or not, unbatched too."""
    calls = counting_stack_calls(monkeypatch)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bias=bias, batch_first=batch_first,
                                 bidirectional=bidirectional, device=device, dtype=torch.float64)
    directions = 2 if bidirectional else 1
    x = torch.randn(*((B, T, I) if batch_first else (T, B, I)), device=device, dtype=torch.float64)
    state = [torch.randn(num_layers * directions, B, S, device=device, dtype=torch.float64) for _ in range(2)]
    for mode, given in ((torch.inference_mode, None), (torch.no_grad, state), (torch.inference_mode, state)):
        poison_cuda_memory(device)
        with mode():
            got = layer(x, given)
        check_inference(layer, x, given, got)
    with torch.no_grad():
        got = layer(x[0] if batch_first else x[:, 0], [t[:, 0] for t in state])  # unbatched
    check_inference(layer, x[:1] if batch_first else x[:, :1], [t[:, :1] for t in state],
                    (got[0].unsqueeze(0 if batch_first else 1), [t.unsqueeze(1) for t in got[1]]))
    assert len(calls) == (4 if STACK_OP else 0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("route", ["", "0", "1", "fused"])
@pytest.mark.parametrize("steps", [5, 40])
def test_inference_stack_on_every_route(monkeypatch, device, dtype, route, steps):
    """Inference on each sequence route, every dtype: the stack op where the fused kernels take
    every layer (CUDA; by default below 32 steps) or the CPU's library loop does (but with =0),
    else layer by layer."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    calls = counting_stack_calls(monkeypatch)
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=dtype)
    x = torch.randn(steps, B, I, device=device, dtype=dtype)
    state = [torch.randn(4, B, S, device=device, dtype=dtype) for _ in range(2)]
    poison_cuda_memory(device)
    with torch.inference_mode():
        got = layer(x, state)
    check_inference(layer, x, state, got)
    assert len(calls) == (STACK_OP and (route != "0" if device == "cpu" else
                                        route == "fused" or (route == "" and steps < 32)))


@pytest.mark.parametrize("device", DEVICES)
def test_inference_stack_only_where_no_gradient_is_wanted(monkeypatch, device):
    """Training (a gradient wanted, or dropout in training mode) keeps one autograd node per
    layer and direction; dropout in eval mode runs the stack op."""
    calls = counting_stack_calls(monkeypatch)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, dropout=0.5, bidirectional=True, device=device)
    x = torch.randn(T, B, I, device=device)
    output, _ = layer(x)
    assert output.requires_grad and not calls
    with torch.no_grad():
        layer(x)  # dropout in training mode: the layer-by-layer path, which draws the masks
    assert not calls
    layer.eval()
    with torch.no_grad():
        check_inference(layer, x, None, layer(x))
    assert len(calls) == STACK_OP


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "lockstep"], ids=["default", "step-loop-in-lockstep"])
def test_inference_stack_under_vmap(monkeypatch, device, route):
    """vmap of a layer's inference: the stack op, or (forced in float64) the directions in lockstep
    through LLTMStackFunction's vmap rule."""
    if route:
        monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, "0")
        monkeypatch.setattr(pyroundlib.layer._Padded, "lockstep", forced_lockstep)
    taken, both = [], pyroundlib.layer._Padded.both_forward
    monkeypatch.setattr(pyroundlib.layer._Padded, "both_forward", lambda *args: taken.append(1) or both(*args))
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    xs = torch.randn(3, T, B, I, device=device, dtype=torch.float64)
    with torch.no_grad():
        got = torch.vmap(lambda x: flat(layer(x)))(xs)
        want = [torch.stack(o) for o in zip(*[flat(layer(x)) for x in xs])]
    torch.testing.assert_close(got, want)
    assert len(taken) == (2 * 2 * 3 if route else 0)  # two layers, vmapped and one at a time


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck_inference_stack(device):
    """The stack op's argument checks name the argument; opcheck on every device (the CPU runs
    a padded batch only)."""
    torch.manual_seed(0)
    x = torch.randn(T, B, I, device=device)
    weights = [torch.randn(3 * S, S + w, device=device) * 0.3 for w in (I, I, 2 * S, 2 * S)]
    bias = [torch.randn(3 * S, device=device) for _ in weights]
    h0, c0 = torch.randn(4, B, S, device=device), torch.randn(4, B, S, device=device)
    run = torch.ops.pyroundlib.lltm_layers_inference
    with pytest.raises(ValueError, match=r"weights\[2\] must have shape \[18, 18\]"):
        run(x, weights[:2] + [weights[2][:, :-1], weights[3]], bias, h0, c0, 2)
    with pytest.raises(ValueError, match=r"h0 must have shape \[4, 3, 6\]"):
        run(x, weights, bias, h0[:2], c0, 2)
    with pytest.raises(ValueError, match="h0 and c0 must both be given or both be None"):
        run(x, weights, bias, h0, None, 2)
    with pytest.raises(TypeError, match=r"bias\[1\] has dtype torch.float64"):
        run(x, weights, [bias[0], bias[1].double()] + bias[2:], h0, c0, 2)
    if device == "cpu":
        with pytest.raises(ValueError, match="runs a padded batch on the CPU"):
            run(x.flatten(0, 1), weights, bias, h0, c0, 2, torch.zeros(T, dtype=torch.int64),
                torch.full((B,), T, dtype=torch.int64))
    for state in ((h0, c0), (None, None)):
        torch.library.opcheck(run.default, (x, weights, bias, *state, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_layers,bidirectional", [(1, False), (1, True), (3, False), (3, True)])
@pytest.mark.parametrize("enforce_sorted", [True, False])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_packed_inference_against_reference(monkeypatch, device, num_layers, bidirectional, enforce_sorted, dtype):
    """A pack under inference_mode, each sequence exactly its own steps (on CUDA the whole stack
    as one op, the fused kernels reading the pack's rows; the reverse direction from each
    sequence's own last step), against each sequence run alone by the reference in float64:
    the output rows, h_n and c_n in the batch's own order, with and without a state; every
    output element written."""
    rnn = torch.nn.utils.rnn
    calls = counting_stack_calls(monkeypatch)
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bidirectional=bidirectional, device=device,
                                 dtype=dtype)
    ref = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bidirectional=bidirectional, dtype=torch.float64)
    ref.load_state_dict({k: v.cpu().double() for k, v in layer.state_dict().items()})
    lengths = [7, 7, 5, 3, 3, 1] if enforce_sorted else [3, 7, 1, 5, 7, 3]
    layers = num_layers * (2 if bidirectional else 1)
    x = torch.randn(max(lengths), len(lengths), I, device=device, dtype=dtype)
    state = [torch.randn(layers, len(lengths), S, device=device, dtype=dtype) for _ in range(2)]
    packed = rnn.pack_padded_sequence(x, lengths, enforce_sorted=enforce_sorted)
    for given in (state, None):
        poison_cuda_memory(device)
        with torch.inference_mode():
            output, (h, c) = layer(packed, given)
        assert torch.equal(output.batch_sizes, packed.batch_sizes)
        padded, _ = rnn.pad_packed_sequence(output)
        want = packed_reference(ref, x.cpu().double(), lengths, None if given is None else
                                [t.cpu().double() for t in given])
        for g, w in zip((output.data, h, c), (rnn.pack_padded_sequence(want[0], lengths,
                                                                       enforce_sorted=enforce_sorted).data, *want[1:])):
            assert not torch.isnan(g).any(), "elements not written"
            g = g.cpu().double()
            if dtype == torch.bfloat16:
                assert (g - w).norm() <= 0.05 * w.norm() + 1e-2
            else:
                torch.testing.assert_close(g, w, **TOLERANCES[dtype])
    assert len(calls) == (2 if STACK_OP and device == "cuda" else 0)


@requires_cuda
def test_opcheck_inference_stack_on_a_pack():
    rnn = torch.nn.utils.rnn
    packed = rnn.pack_padded_sequence(torch.randn(7, 4, I, device="cuda"), [7, 5, 5, 2])
    pack = pyroundlib._packed.Pack(packed.batch_sizes, packed.data.device)
    weights = [torch.randn(3 * S, S + w, device="cuda") * 0.3 for w in (I, I, 2 * S, 2 * S)]
    bias = [torch.randn(3 * S, device="cuda") for _ in weights]
    h0, c0 = torch.randn(4, 4, S, device="cuda"), torch.randn(4, 4, S, device="cuda")
    args = (packed.data, weights, bias, h0, c0, 2, pack.first, pack.lengths)
    run = torch.ops.pyroundlib.lltm_layers_inference
    torch.library.opcheck(run.default, args)
    with pytest.raises(ValueError, match="lengths must be a 1-D int64 tensor"):
        run(*args[:-1], pack.lengths.int())
    # order: the states' rows in the caller's order (sorted row b is state row order[b])
    order = torch.tensor([2, 0, 3, 1], device="cuda")
    torch.library.opcheck(run.default, (*args, order))
    poison_cuda_memory("cuda")
    output, h_n, c_n = run(packed.data, weights, bias, h0, c0, 2, pack.first, pack.lengths, order)
    sorted_h0, sorted_c0 = h0.index_select(1, order), c0.index_select(1, order)
    want = run(packed.data, weights, bias, sorted_h0, sorted_c0, 2, pack.first, pack.lengths)
    back = torch.argsort(order)
    assert not torch.isnan(h_n).any() and not torch.isnan(c_n).any(), "elements not written"
    torch.testing.assert_close((output, h_n, c_n), (want[0], want[1].index_select(1, back),
                                                    want[2].index_select(1, back)))
    for bad, message in ((order.int(), "order must be a 1-D int64 tensor"), (order[:3], "order must be given with a "
                                                                                     "pack only, one row a sequence")):
        with pytest.raises(ValueError, match=message):
            run(*args, bad)


@requires_cuda
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_inference_stack_in_a_users_cuda_graph(packed):
    """The stack op captured into the caller's CUDA graph (a pack's table uploaded in the
    capture) and replayed on new data in the captured input: against the layer-by-layer
    training forward on the same data."""
    layer, x, state, _ = stacked_case("cuda", packed=packed)
    static = x.data if packed else x
    with torch.inference_mode():
        graph, result = capture_after_warm_up(lambda: layer(x, state))
    for _ in range(2):
        static.copy_(torch.randn_like(static))
        graph.replay()
        got = [t.data if packed and i == 0 else t for i, t in enumerate(flat(result))]
        want = [t.data if packed and i == 0 else t for i, t in enumerate(flat(layer(x, state)))]
        torch.testing.assert_close(got, [t.detach() for t in want])


@pytest.mark.parametrize("device", DEVICES)
def test_inference_under_autocast(monkeypatch, device):
    """Autocast casts the stack's input, parameters and state as it does each direction's."""
    calls = counting_stack_calls(monkeypatch)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device)
    x = torch.randn(T, B, I, device=device)
    state = [torch.randn(4, B, S, device=device) for _ in range(2)]
    with torch.inference_mode(), torch.autocast(device, dtype=torch.bfloat16):
        got = layer(x, state)
    assert all(t.dtype == torch.bfloat16 for t in flat(got))
    want = flat(reference(layer.double().cpu(), x.double().cpu(), [t.double().cpu() for t in state]))
    for g, w in zip(flat(got), want):
        assert (g.double().cpu() - w).norm() <= 0.05 * w.norm() + 1e-2
    assert len(calls) == STACK_OP


# ---- training: the whole stack as one autograd node (LLTMStackFunction) ----------------------

def stack_case(device, directions=2, layers=2, dtype=torch.float64):
    torch.manual_seed(0)
    widths = [I] * directions + [directions * S] * (directions * (layers - 1))
    params = [t.requires_grad_() for w in widths
              for t in (torch.randn(3 * S, S + w, device=device, dtype=dtype) * 0.4,
                        torch.randn(3 * S, device=device, dtype=dtype) * 0.4)]
    x = torch.randn(T, B, I, device=device, dtype=dtype, requires_grad=True)
    h0, c0 = (torch.randn(directions * layers, B, S, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    return x, h0, c0, params


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layers", [1, 3])
@pytest.mark.parametrize("given", [(True, True, True), (True, False, False), (False, True, True)])
def test_replayed_stack_loops_write_the_stacks_results(device, layers, given):
    """The loops a padded fused stack replays (_forward_loop, _backward_loop), run as they are
    (graphs.run's first sighting, and the CPU): every tensor they write holds what the stack's
    forward and backward return, for every layer count and pattern of gradients given."""
    x, h0, c0, params = stack_case(device, 2, layers)
    x, h0, c0, *params = (t.detach() for t in (x, h0, c0, *params))
    layer = pyroundlib.layer
    want = layer._stack_forward(x, h0, c0, layer._Padded(2), *params)
    written = [torch.full_like(t, float("nan")) for t in want]
    layer._stack_loop(True, layers)(x, h0, c0, *params, *written)
    assert all(torch.equal(w, g) for w, g in zip(want, written))
    saved = list(want[3:])
    grads = [torch.randn_like(t) if g else None for t, g in zip(want[:3], given)]
    d_x, d_params, d_h0, d_c0 = layer._stack_backward(*grads, x, h0, c0, layer._Padded(2), params, saved)
    outs = [torch.full_like(t, float("nan")) for t in (x, *params, h0, c0)]
    layer._stack_loop(False, layers, given)(*(g for g in grads if g is not None), x, h0, c0, *params, *saved, *outs)
    assert all(torch.equal(w, g) for w, g in zip((d_x, *d_params, d_h0, d_c0), outs))
    assert not layer._replays_stack(layer._Padded(2), x, h0, c0, params) or x.is_cuda


@pytest.mark.parametrize("directions,layers", [(2, 2), (2, 1), (1, 3)])
def test_stack_function_against_the_layer_by_layer_path(directions, layers):
    """The padded stack on the CPU (the library loop's calls): the same bits as a node per
    direction, outputs and every gradient, some results unused."""
    x, h0, c0, params = stack_case("cpu", directions, layers)
    inputs = [x, h0, c0, *params]
    got = pyroundlib.layer.LLTMStackFunction.apply(x, h0, c0, pyroundlib.layer._Padded(directions), *params)[:3]
    want = pyroundlib.layer._layer_by_layer(x, h0, c0, list(zip(params[::2], params[1::2])), directions)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weights = [torch.randn_like(t) for t in want]
    for used in ((0, 1, 2), (0,), (1, 2)):  # every result's gradient, or some left unused (None)
        grads = torch.autograd.grad(sum((got[i] * weights[i]).sum() for i in used), inputs, retain_graph=True)
        ref = torch.autograd.grad(sum((want[i] * weights[i]).sum() for i in used), inputs, retain_graph=True)
        torch.testing.assert_close(grads, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device,route", [("cpu", "")] + [(device, "lockstep") for device in DEVICES],
                         ids=lambda v: v or "library-loop")
def test_stack_function_gradcheck_and_gradgradcheck(monkeypatch, device, route):
    """The padded stack node, on the CPU's library loop and with its directions in lockstep
    (forced: float64 never takes it); each result's gradient alone (the others None).  The
    double backward differentiates the layer-by-layer path whatever the forward's route: once."""
    if route == "lockstep":
        monkeypatch.setattr(pyroundlib.layer._Padded, "lockstep", forced_lockstep)
    x, h0, c0, params = stack_case(device, 2, 2)
    layouts = []

    def f(x, h0, c0, *params):
        layouts.append(pyroundlib.layer._Padded(2))
        return pyroundlib.layer.LLTMStackFunction.apply(x, h0, c0, layouts[-1], *params)[:3]
    torch.autograd.gradcheck(f, (x, h0, c0, *params))
    if not route:
        torch.autograd.gradgradcheck(f, (x, h0, c0, *params))
    assert (pyroundlib.layer.LOCKSTEP in layouts[0].routes.values()) == (route == "lockstep")


def packed_stack_case(device, directions, layers, route, monkeypatch, dtype=torch.float64):
    """stack_case's tensors with x a pack's rows (lengths 5, 2, 4: unsorted) and its Pack."""
    monkeypatch.setenv(sequence.PERSISTENT_ENV_VAR, route)
    x, h0, c0, params = stack_case(device, directions, layers, dtype)
    lengths = [5, 2, 4][:B]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x.detach(), lengths, enforce_sorted=False)
    data = packed.data.clone().requires_grad_()
    return data, h0, c0, params, pyroundlib._packed.Pack(packed.batch_sizes, data.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "0"], ids=["one-call", "step-loop"])
@pytest.mark.parametrize("directions,layers", [(2, 2), (1, 3)])
def test_packed_stack_function_against_the_layer_by_layer_path(monkeypatch, device, route, directions, layers):
    """A pack's training as one LLTMStackFunction node: the same bits as a node per layer and
    direction (the same library calls), outputs and every gradient, some results unused."""
    data, h0, c0, params, pack = packed_stack_case(device, directions, layers, route, monkeypatch)
    inputs = [data, h0, c0, *params]
    layout = pyroundlib.layer._Packed(directions, pack)
    got = pyroundlib.layer.LLTMStackFunction.apply(data, h0, c0, layout, *params)[:3]
    want = pyroundlib.layer._layer_by_layer(data, h0, c0, list(zip(params[::2], params[1::2])), directions,
                                            lambda *args, reverse: pyroundlib._packed.packed_direction(
                                                args[0], pack, *args[1:], reverse=reverse))
    assert pyroundlib.layer.LOCKSTEP not in layout.routes.values()  # float64: never
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    weights = [torch.randn_like(t) for t in want]
    for used in ((0, 1, 2), (0,), (1, 2)):
        grads = torch.autograd.grad(sum((got[i] * weights[i]).sum() for i in used), inputs, retain_graph=True)
        ref = torch.autograd.grad(sum((want[i] * weights[i]).sum() for i in used), inputs, retain_graph=True)
        torch.testing.assert_close(grads, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route", ["", "lockstep"], ids=["one-call", "step-loop-in-lockstep"])
def test_packed_stack_function_gradcheck_and_gradgradcheck(monkeypatch, device, route):
    """A pack's stack node, its layers in one call each or (forced: float64 never takes it) with
    their directions in lockstep.  The double backward differentiates the layer-by-layer path
    whatever the forward's route: checked once."""
    if route == "lockstep":
        monkeypatch.setattr(pyroundlib.layer._Packed, "lockstep", forced_lockstep)
    data, h0, c0, params, pack = packed_stack_case(device, 2, 2, "0" if route else "", monkeypatch)
    layouts = []

    def f(data, h0, c0, *params):
        layouts.append(pyroundlib.layer._Packed(2, pack))
        return pyroundlib.layer.LLTMStackFunction.apply(data, h0, c0, layouts[-1], *params)[:3]
    torch.autograd.gradcheck(f, (data, h0, c0, *params))
    if not route:
        torch.autograd.gradgradcheck(f, (data, h0, c0, *params))
    assert (pyroundlib.layer.LOCKSTEP in layouts[0].routes.values()) == (route == "lockstep")


@pytest.mark.parametrize("device", DEVICES)
def test_packed_training_is_one_stack_node(monkeypatch, device):
    """LLTMLayer's training on a pack takes LLTMStackFunction, on every device; with dropout
    between layers, or while torch.compile traces, the layer-by-layer path."""
    calls = []
    apply = pyroundlib.layer.LLTMStackFunction.apply
    monkeypatch.setattr(pyroundlib.layer.LLTMStackFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    layer, x, state, loss = stacked_case(device, torch.float64)
    loss(layer(x, state)).backward()
    assert len(calls) == 1
    pyroundlib.LLTMLayer(I, S, num_layers=2, dropout=0.5, device=device, dtype=torch.float64)(x)
    assert len(calls) == 1


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("tracked", [True, False], ids=["parameters-tracked", "parameters-detached"])
def test_stack_function_vjp_in_its_input(monkeypatch, packed, tracked):
    """torch.func.vjp and grad in the stack's input, its parameters tracked by autograd or not:
    the double backward that torch.func runs differentiates the layer-by-layer path through
    torch.func itself (a torch.autograd.grad of a recomputation would see no transform's tensors
    and give zeros)."""
    if packed:
        data, h0, c0, params, pack = packed_stack_case("cpu", 2, 2, "", monkeypatch)
        layout = pyroundlib.layer._Packed(2, pack)
    else:
        data, h0, c0, params = stack_case("cpu", 2, 2)
        layout = pyroundlib.layer._Padded(2)
    params = params if tracked else [p.detach() for p in params]

    def f(x):
        output, h, c = pyroundlib.layer.LLTMStackFunction.apply(x, h0.detach(), c0.detach(), layout, *params)[:3]
        return (output * output).sum() + h.sum() + c.sum()
    x = data.detach().clone().requires_grad_()
    want = torch.autograd.grad(f(x), x)[0]
    _, pullback = torch.func.vjp(f, data.detach())
    torch.testing.assert_close(pullback(torch.ones((), dtype=torch.float64))[0], want)
    torch.testing.assert_close(torch.func.grad(f)(data.detach()), want)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("stacked", [True, False], ids=["stack-node", "node-per-direction"])
def test_packed_training_under_torch_func(monkeypatch, device, stacked):
    """torch.func.grad and vjp over a layer on a pack: the gradients autograd gives, through the
    stack node and through a node per direction (each differentiates its recurrence in torch
    ops there: torch.func builds a graph of the gradient)."""
    if not stacked:
        monkeypatch.setattr(pyroundlib.layer.LLTMLayer, "_stack_training", lambda *args: None)
    layer, x, state, loss = stacked_case(device, torch.float64)
    params = dict(layer.named_parameters())

    def f(p, data):
        output, (h, c) = torch.func.functional_call(layer, p, (torch.nn.utils.rnn.PackedSequence(data, *x[1:]),
                                                               state))
        return loss((output, (h, c)))
    data = x.data.clone().requires_grad_()
    want = torch.autograd.grad(f(params, data), [*params.values(), data])
    got = torch.func.grad(f, argnums=(0, 1))(params, x.data)
    torch.testing.assert_close([*got[0].values(), got[1]], list(want))
    _, pullback = torch.func.vjp(lambda data: f(params, data), x.data)
    torch.testing.assert_close(pullback(torch.ones((), dtype=torch.float64, device=device))[0], want[-1])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_stack_function_in_the_layer(monkeypatch, device, dtype):
    """A bidirectional padded layer's training is one LLTMStackFunction node, on CUDA's fused
    route and on the CPU's library loop: the same bits as the layer-by-layer path, outputs and
    every gradient."""
    calls = []
    apply = pyroundlib.layer.LLTMStackFunction.apply
    monkeypatch.setattr(pyroundlib.layer.LLTMStackFunction, "apply", lambda *a: calls.append(1) or apply(*a))
    for num_layers, bias, batch_first in ((2, True, False), (3, False, True)):
        torch.manual_seed(0)
        layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bias=bias, batch_first=batch_first,
                                     bidirectional=True, device=device, dtype=dtype)
        x = torch.randn(*((B, T, I) if batch_first else (T, B, I)), device=device, dtype=dtype, requires_grad=True)
        state = [torch.randn(2 * num_layers, B, S, device=device, dtype=dtype, requires_grad=True) for _ in range(2)]
        inputs = [x, *layer.parameters(), *state]
        for given in (state, None):
            got = flat(layer(x, given))
            with monkeypatch.context() as m:  # the layer-by-layer path: the same kernels, a node each
                m.setattr(pyroundlib.layer, "_all_fused", lambda *a, **k: False)
                want = flat(layer(x, given))
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            weights = [torch.randn_like(t) for t in got]
            wanted = inputs if given is not None else inputs[:-2]
            grads = torch.autograd.grad(sum((g * w).sum() for g, w in zip(got, weights)), wanted)
            ref = torch.autograd.grad(sum((g * w).sum() for g, w in zip(want, weights)), wanted)
            torch.testing.assert_close(grads, ref, rtol=0, atol=0)
    assert len(calls) == 4


@pytest.mark.parametrize("device", DEVICES)
def test_stack_function_under_torch_func(device):
    """torch.func.grad and vmap over a layer whose training takes LLTMStackFunction."""
    layer = pyroundlib.LLTMLayer(I, S, num_layers=2, bidirectional=True, device=device, dtype=torch.float64)
    params = dict(layer.named_parameters())
    xs = torch.randn(3, T, B, I, device=device, dtype=torch.float64)

    def loss(p, x):
        output, (h, c) = torch.func.functional_call(layer, p, (x,))
        return output.sum() + h.sum() + c.sum()
    got = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0))(params, xs)
    for i, x in enumerate(xs):
        want = torch.autograd.grad(loss(params, x), list(params.values()))
        for name, w in zip(params, want):
            torch.testing.assert_close(got[name][i], w)


@pytest.mark.parametrize("num_layers,bidirectional,batch_first,bias", CONFIGS)
def test_cpu_inference_stack_is_the_layer_by_layer_path(monkeypatch, num_layers, bidirectional, batch_first, bias):
    """On the CPU the stack op makes the layer-by-layer path's library calls: the same bits,
    given a state or not."""
    torch.manual_seed(0)
    layer = pyroundlib.LLTMLayer(I, S, num_layers=num_layers, bias=bias, batch_first=batch_first,
                                 bidirectional=bidirectional)
    x = torch.randn(*((B, T, I) if batch_first else (T, B, I)))
    state = [torch.randn(num_layers * (2 if bidirectional else 1), B, S) for _ in range(2)]
    for given in (None, state):
        with torch.inference_mode():
            got = flat(layer(x, given))
            monkeypatch.setattr(pyroundlib.layer.LLTMLayer, "_inference_stack", lambda self, *args: None)
            want = flat(layer(x, given))
            monkeypatch.undo()
        assert all(torch.equal(g, w) for g, w in zip(got, want))
