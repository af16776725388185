"""conch-triton-kernels: `conch.ops.normalization.rms_norm.fused_add_rms_norm` (in place:
residual += x, x = rms_norm(residual) * weight; returns both). The model works on clones of its
inputs, as a layer would on its own activations."""

import torch
from conch.ops.normalization.rms_norm import fused_add_rms_norm

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))

    def forward(self, x, residual):
        x, residual = x.clone(), residual.clone()
        return fused_add_rms_norm(x, residual, self.weight, 1e-6)


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g), torch.randn(tokens, hidden, generator=g))


def reference(x, residual):
    r = x + residual
    rstd = torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + 1e-6)
    return r * rstd * model.weight.detach(), r


model = Model()
example_inputs = _make_inputs()
_t = torch.export.Dim("tokens", min=2, max=4096)
dynamic_shapes = {"x": {0: _t}, "residual": {0: _t}}
tolerance = (1e-5, 1e-5)
