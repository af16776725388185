"""fla-core: `fla.ops.utils.mean_pooling` (mean over chunks of 4 tokens, [B, T, H, D])."""

import torch
from fla.ops.utils import mean_pooling

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x):
        return mean_pooling(x, chunk_size=4)


def _make_inputs(batch=2, seq=16, heads=2, dim=32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, heads, dim, generator=g),)


def reference(x):
    B, T, H, D = x.shape
    chunks = [x[:, i:i + 4].mean(1) for i in range(0, T, 4)]
    return torch.stack(chunks, 1)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=5, max=2048)}}
tolerance = (1e-5, 1e-5)
