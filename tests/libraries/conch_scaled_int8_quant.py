"""conch-triton-kernels: `conch.ops.quantization.int8.scaled_int8_quant` (static per-tensor
scale: int8(clamp(round(x / scale), -128, 127)); returns (quantized, scale))."""

import torch
from conch.ops.quantization.int8 import scaled_int8_quant

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.02]))

    def forward(self, x):
        q, _ = scaled_int8_quant(x, self.scale)
        return q


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g),)


def reference(x):
    return torch.round(x / model.scale).clamp(-128, 127).to(torch.int8)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (0, 1)  # round-half-even vs half-away-from-zero
