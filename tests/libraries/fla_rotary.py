"""fla-core: `fla.modules.rotary.rotary_embedding` (non-interleaved RoPE on [B, T, H, D]).

The cos/sin table has a fixed number of rows (``TABLE``, the model's maximum position), as models
build it once; fla passes its length to the kernel as a constexpr (``TR``), so a table declared
dynamic would need one binary per length (kernel_lens refuses that, naming the dim)."""

import torch
from fla.modules.rotary import rotary_embedding

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, cos, sin):
        return rotary_embedding(x, cos, sin)


TABLE = 256  # rotary table rows: positions 0 .. TABLE-1


def _make_inputs(batch=2, seq=8, heads=2, dim=32):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq, heads, dim, generator=g)
    pos = torch.arange(TABLE, dtype=torch.float32)[:, None]
    freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    ang = pos * freq
    return (x, ang.cos(), ang.sin())


def reference(x, cos, sin):
    d = cos.shape[-1]
    x1, x2 = x[..., :d], x[..., d:2 * d]
    t = x.shape[1]
    c, s = cos[None, :t, None, :], sin[None, :t, None, :]
    return torch.cat([x1 * c - x2 * s, x1 * s + x2 * c, x[..., 2 * d:]], -1)


model = Model()
example_inputs = _make_inputs()
_s = torch.export.Dim("seq", min=2, max=TABLE)
# fla passes the batch size to the kernel as a constexpr too (B): the batch is static here
dynamic_shapes = {"x": {1: _s}, "cos": None, "sin": None}
tolerance = (1e-5, 1e-5)
