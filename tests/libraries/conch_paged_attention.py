"""conch-triton-kernels: `conch.ops.attention.paged_attention.paged_attention` (vLLM-style decode
attention over a paged KV cache with FlashDecoding: a split kernel and a reduce kernel; GQA with
4 query heads on 2 KV heads, 16 blocks of 16 tokens per sequence)."""

import torch
from conch.ops.attention.paged_attention import paged_attention

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

HEADS, KV_HEADS, HEAD, PAGE, MAX_BLOCKS, CACHE_BLOCKS = 4, 2, 32, 16, 16, 64


class Model(torch.nn.Module):
    def forward(self, query, key_cache, value_cache, block_table, seq_lens):
        return paged_attention(query, key_cache, value_cache, block_table, seq_lens)


def _make_inputs(batch=3):
    g = torch.Generator().manual_seed(0)
    query = torch.randn(batch, HEADS, HEAD, generator=g)
    key_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    value_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    block_table = torch.randint(0, CACHE_BLOCKS, (batch, MAX_BLOCKS), generator=g, dtype=torch.int32)
    seq_lens = torch.randint(1, PAGE * MAX_BLOCKS + 1, (batch,), generator=g, dtype=torch.int32)
    return (query, key_cache, value_cache, block_table, seq_lens)


def reference(query, key_cache, value_cache, block_table, seq_lens):
    out = torch.empty_like(query)
    group = HEADS // KV_HEADS
    for b in range(query.shape[0]):
        n = int(seq_lens[b])
        k = key_cache[block_table[b].long()].flatten(0, 1)[:n].repeat_interleave(group, 1)
        v = value_cache[block_table[b].long()].flatten(0, 1)[:n].repeat_interleave(group, 1)
        s = torch.einsum("hd,nhd->hn", query[b], k) / HEAD ** 0.5
        out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v)
    return out


model = Model()
example_inputs = _make_inputs()
_b = torch.export.Dim("batch", min=2, max=256)
dynamic_shapes = {"query": {0: _b}, "key_cache": None, "value_cache": None,
                  "block_table": {0: _b}, "seq_lens": {0: _b}}
tolerance = (1e-4, 1e-4)
