"""fla-core: `fla.ops.utils.chunk_local_cumsum` on a scalar gate [B, T, H] (cumsum within
chunks of 16 tokens: the launch grid is cdiv(T, 16) * B * H)."""

import torch
from fla.ops.utils import chunk_local_cumsum

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, g):
        return chunk_local_cumsum(g, chunk_size=16)


def _make_inputs(batch=2, seq=32, heads=4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, heads, generator=g),)


def reference(g):
    B, T, H = g.shape
    pad = (-T) % 16
    x = torch.nn.functional.pad(g.float(), (0, 0, 0, pad)).reshape(B, -1, 16, H)
    return x.cumsum(2).reshape(B, -1, H)[:, :T]


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"g": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
