"""fla-core: `fla.modules.rotary.rotary_embedding` (non-interleaved RoPE on [B, T, H, D])."""

import torch
from fla.modules.rotary import rotary_embedding

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, cos, sin):
        return rotary_embedding(x, cos, sin)


def _make_inputs(batch=2, seq=8, heads=2, dim=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq, heads, dim, generator=g)
    pos = torch.arange(seq, dtype=torch.float32)[:, None]
    freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ang = pos * freq
    return (x, ang.cos(), ang.sin())


def reference(x, cos, sin):
    d = cos.shape[-1]
    x1, x2 = x[..., :d], x[..., d:2 * d]
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * d:]], -1)


model = Model()
example_inputs = _make_inputs()
_s = torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8), 1: _s}, "cos": {0: _s}, "sin": {0: _s}}
tolerance = (1e-5, 1e-5)
