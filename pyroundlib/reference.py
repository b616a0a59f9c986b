"""Plain-PyTorch references for both ops: what the tests, the benchmark and the demo
compare pyroundlib against.  No native code here."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def round_ste_reference(x: torch.Tensor) -> torch.Tensor:
    """The usual straight-through idiom: forward ``torch.round``, gradient identity."""
    return x + (torch.round(x) - x).detach()


def lltm_cell_reference(input, weights, bias, old_h, old_cell):
    """The LLTM cell of PyTorch's "Custom C++ and CUDA Extensions" tutorial, in plain PyTorch."""
    X = torch.cat([old_h, input], dim=1)
    gate_weights = F.linear(X, weights, bias)
    gates = gate_weights.chunk(3, dim=1)
    input_gate = torch.sigmoid(gates[0])
    output_gate = torch.sigmoid(gates[1])
    candidate_cell = F.elu(gates[2])
    new_cell = old_cell + candidate_cell * input_gate
    new_h = torch.tanh(new_cell) * output_gate
    return new_h, new_cell
