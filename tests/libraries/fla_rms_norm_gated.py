"""fla-core: `fla.modules.FusedRMSNormGated` (RMSNorm(x) * swish(g), one fused kernel)."""

import torch
from fla.modules import FusedRMSNormGated

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.norm = FusedRMSNormGated(hidden, eps=1e-5)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(1)))

    def forward(self, x, g):
        return self.norm(x, g)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g))


def reference(x, g):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    return x * rstd * model.norm.weight.detach() * torch.nn.functional.silu(g)


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _b, 1: _s}, "g": {0: _b, 1: _s}}
tolerance = (1e-5, 1e-5)
