"""Liger-Kernel SwiGLU, unchanged: ``LigerSiLUMulFunction.apply(gate, up)``.

The kernel casts its float ``gate_multiplier`` with ``.to(tl.float32)`` (fp32 on Triton's JIT, a
typed scalar in capture's interpreter) and calls a ``@triton.jit`` helper (``silu``).
"""

import torch
from liger_kernel.ops.swiglu import LigerSiLUMulFunction


class Model(torch.nn.Module):
    def forward(self, gate, up):
        return LigerSiLUMulFunction.apply(gate, up)


def _make_inputs(tokens=10, intermediate=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, intermediate, generator=g),
            torch.randn(tokens, intermediate, generator=g))


def reference(gate, up):
    return torch.nn.functional.silu(gate.float()).to(gate.dtype) * up


model = Model()
example_inputs = _make_inputs()
_tokens = torch.export.Dim("tokens", min=2, max=4096)
dynamic_shapes = {"gate": {0: _tokens}, "up": {0: _tokens}}
expected_roles = {"_swiglu_forward_kernel": {"a_ptr": "input", "b_ptr": "input", "c_ptr": "output"}}
tolerance = (1e-5, 1e-6)
