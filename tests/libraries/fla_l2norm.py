"""fla-core: `fla.modules.l2norm.l2norm` (autotuned row-block L2 norm; D <= 512 path)."""

import torch
from fla.modules.l2norm import l2norm

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x):
        return l2norm(x, eps=1e-6)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    return x / torch.sqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
