"""conch-triton-kernels: `conch.ops.normalization.gemma_rms_norm.gemma_rms_norm` (Gemma's RMS norm
x * rstd * (1 + w), in place on x; the model normalizes a clone of its input). Without a residual:
with one, the op returns the normalized tensor twice (its `residual` aliases the x it normalizes)."""

import torch
from conch.ops.normalization.gemma_rms_norm import gemma_rms_norm

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return gemma_rms_norm(x.clone(), self.weight, 1e-6)


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g),)


def reference(x):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return x * rstd * (1.0 + model.weight.detach())


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (1e-5, 1e-5)
