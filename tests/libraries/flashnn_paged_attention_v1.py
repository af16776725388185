"""flashnn: `flashnn.PagedAttention(version=1)` (single-query decode attention over a paged KV
cache laid out [blocks, heads, block_size, head_dim], fp16, 4 heads, blocks of 16 tokens)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}

HEADS, HEAD, PAGE, MAX_BLOCKS, CACHE_BLOCKS = 4, 32, 16, 16, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = flashnn.PagedAttention(version=1)
        self.register_buffer("head_mapping", torch.arange(HEADS, dtype=torch.int32))

    def forward(self, query, key_cache, value_cache, block_tables, context_lens):
        return self.attn(query, key_cache, value_cache, self.head_mapping, HEAD ** -0.5,
                         block_tables, context_lens, PAGE * MAX_BLOCKS)


def _make_inputs(batch=3):
    g = torch.Generator().manual_seed(0)
    query = torch.randn(batch, HEADS, HEAD, generator=g).half()
    key_cache = torch.randn(CACHE_BLOCKS, HEADS, PAGE, HEAD, generator=g).half()
    value_cache = torch.randn(CACHE_BLOCKS, HEADS, PAGE, HEAD, generator=g).half()
    block_tables = torch.randint(0, CACHE_BLOCKS, (batch, MAX_BLOCKS), generator=g, dtype=torch.int32)
    context_lens = torch.randint(1, PAGE * MAX_BLOCKS + 1, (batch,), generator=g, dtype=torch.int32)
    return (query, key_cache, value_cache, block_tables, context_lens)


def reference(query, key_cache, value_cache, block_tables, context_lens):
    out = torch.empty_like(query)
    for b in range(query.shape[0]):
        n = int(context_lens[b])
        k = key_cache[block_tables[b].long()].float().transpose(1, 2).flatten(0, 1)[:n]
        v = value_cache[block_tables[b].long()].float().transpose(1, 2).flatten(0, 1)[:n]
        s = torch.einsum("hd,nhd->hn", query[b].float(), k) * HEAD ** -0.5
        out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v).half()
    return out


model = Model()
example_inputs = _make_inputs()
_b = torch.export.Dim("batch", min=2, max=256)
dynamic_shapes = {"query": {0: _b}, "key_cache": None, "value_cache": None,
                  "block_tables": {0: _b}, "context_lens": {0: _b}}
tolerance = (2e-3, 2e-3)
