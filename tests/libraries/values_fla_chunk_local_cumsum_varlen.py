"""fla-core: `fla.ops.utils.chunk_local_cumsum(g, 16, cu_seqlens=cu)` on a packed varlen batch
[1, T, H] (cumsum within chunks of 16 tokens of each sequence). The host code reads VALUES:
`prepare_chunk_indices(cu_seqlens, 16)` takes `diff(cu_seqlens)`, `repeat_interleave`s by the
per-sequence chunk counts (a length from values) and the grid is `len(chunk_indices) * B * H`.
cu_seqlens is a model input, so its values vary from call to call. It is int32 (as vLLM-style
callers pass it); kernel_lens translates `repeat_interleave` of the counts itself, in their
dtype (torchlib's translation compared int64 with int32 and ONNX refused the graph)."""

import torch
from fla.ops.utils import chunk_local_cumsum

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}

CHUNK = 16


class Model(torch.nn.Module):
    def forward(self, g, cu_seqlens):
        return chunk_local_cumsum(g, chunk_size=CHUNK, cu_seqlens=cu_seqlens)


def _make_inputs(lens=(5, 20, 15), heads=4):
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(1, sum(lens), heads, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return (g, cu)


def reference(g, cu_seqlens):
    out = torch.empty_like(g, dtype=torch.float)
    bounds = cu_seqlens.tolist()
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        for start in range(bos, eos, CHUNK):
            stop = min(start + CHUNK, eos)
            out[:, start:stop] = g[:, start:stop].float().cumsum(1)
    return out


model = Model()
example_inputs = _make_inputs()
# other cu_seqlens values over the same 40 tokens: other chunk counts, so another grid
extra_examples = [_make_inputs(lens=(16, 16, 8)), _make_inputs(lens=(1, 1, 38))]
dynamic_shapes = {"g": {1: torch.export.Dim("tokens", min=2, max=2048)}, "cu_seqlens": None}
tolerance = (1e-5, 1e-5)
