"""fla-core: `fla.modules.layernorm.rms_norm` with a residual and prenorm=True (returns the
normalized output and the updated residual)."""

import torch
from fla.modules.layernorm import rms_norm

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(1)))

    def forward(self, x, residual):
        return rms_norm(x, self.weight, None, residual=residual, eps=1e-5, prenorm=True)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g))


def reference(x, residual):
    s = x + residual
    rstd = torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5)
    return s * rstd * model.weight.detach(), s


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _b, 1: _s}, "residual": {0: _b, 1: _s}}
tolerance = (1e-5, 1e-5)
