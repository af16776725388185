"""conch-triton-kernels: `conch.ops.activation.silu_and_mul.silu_and_mul` (SwiGLU activation:
silu(x[..., :d]) * x[..., d:], one program per token)."""

import torch
from conch.ops.activation.silu_and_mul import silu_and_mul

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x):
        return silu_and_mul(x)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, 2 * hidden, generator=g),)


def reference(x):
    d = x.shape[-1] // 2
    return torch.nn.functional.silu(x[..., :d]) * x[..., d:]


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
