"""fla-core: `fla.modules.activations.swiglu` (silu(x) * y)."""

import torch
from fla.modules.activations import swiglu

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, y):
        return swiglu(x, y)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g))


def reference(x, y):
    return torch.nn.functional.silu(x) * y


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _b, 1: _s}, "y": {0: _b, 1: _s}}
tolerance = (1e-5, 1e-5)
