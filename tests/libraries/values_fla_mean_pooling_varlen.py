"""fla-core: `fla.ops.utils.mean_pooling(x, 8, cu_seqlens=cu)` on a packed varlen batch
[1, T, H, D] (the mean of each chunk of 8 tokens of each sequence). The host code reads VALUES:
`prepare_chunk_indices(cu_seqlens, 8)` (`diff`, `repeat_interleave` by the per-sequence chunk
counts), and `NT = len(chunk_indices)` sizes both the grid and the OUTPUT [1, NT, H, D], so the
output's shape follows cu_seqlens' values. cu_seqlens (int64, as fla documents) is an input."""

import torch
from fla.ops.utils import mean_pooling

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}

CHUNK = 8


class Model(torch.nn.Module):
    def forward(self, x, cu_seqlens):
        return mean_pooling(x, chunk_size=CHUNK, cu_seqlens=cu_seqlens)


def _make_inputs(lens=(5, 12, 7), heads=2, dim=16):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, sum(lens), heads, dim, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    return (x, cu)


def reference(x, cu_seqlens):
    bounds = cu_seqlens.tolist()
    chunks = [x[:, s:min(s + CHUNK, eos)].float().mean(1)
              for bos, eos in zip(bounds[:-1], bounds[1:]) for s in range(bos, eos, CHUNK)]
    return torch.stack(chunks, 1).to(x.dtype)


model = Model()
example_inputs = _make_inputs()
# other cu_seqlens values over the same 24 tokens: 4 chunks (example), 3 and 5
extra_examples = [_make_inputs(lens=(8, 8, 8)), _make_inputs(lens=(1, 1, 22))]
dynamic_shapes = {"x": {1: torch.export.Dim("tokens", min=2, max=2048)}, "cu_seqlens": None}
tolerance = (1e-5, 1e-5)
