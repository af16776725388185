"""Liger-Kernel GeGLU (tanh-approximated GELU), unchanged: ``LigerGELUMulFunction.apply``.

The kernel's GELU calls ``tanh`` from ``triton.language.extra.libdevice``; capture evaluates it on
the CPU. ``n_cols`` is a constexpr, so the feature size is static.
"""

import torch
from liger_kernel.ops.geglu import LigerGELUMulFunction


class Model(torch.nn.Module):
    def forward(self, gate, up):
        return LigerGELUMulFunction.apply(gate, up)


def _make_inputs(batch=2, seq=5, intermediate=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, intermediate, generator=g),
            torch.randn(batch, seq, intermediate, generator=g))


def reference(gate, up):
    return torch.nn.functional.gelu(gate.float(), approximate="tanh").to(gate.dtype) * up


model = Model()
example_inputs = _make_inputs()
_batch = torch.export.Dim("batch", min=2, max=64)
_seq = torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"gate": {0: _batch, 1: _seq}, "up": {0: _batch, 1: _seq}}
expected_roles = {"_geglu_tanh_forward_kernel": {"a": "input", "b": "input", "c": "output"}}
tolerance = (1e-5, 1e-5)
