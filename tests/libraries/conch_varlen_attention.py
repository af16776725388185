"""conch-triton-kernels: `conch.ops.attention.varlen_attention.varlen_attention` (causal prefill
attention over a batch of variable-length sequences whose K/V sit in a paged cache; cu_seqlens_q
and seq_lens describe the ragged batch; GQA 4 query heads on 2 KV heads)."""

import torch
from conch.ops.attention.varlen_attention import varlen_attention

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

HEADS, KV_HEADS, HEAD, PAGE, MAX_BLOCKS, CACHE_BLOCKS = 4, 2, 32, 16, 16, 64


class Model(torch.nn.Module):
    def forward(self, query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table):
        return varlen_attention(query, key_cache, value_cache, cu_seqlens_q, query.shape[0],
                                seq_lens, PAGE * MAX_BLOCKS, block_table, causal=True)


def _make_inputs(tokens=24):
    g = torch.Generator().manual_seed(0)
    lens = [tokens // 3, tokens - tokens // 3]  # two sequences
    query = torch.randn(tokens, HEADS, HEAD, generator=g)
    key_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    value_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    cu_seqlens_q = torch.tensor([0, lens[0], tokens], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    block_table = torch.randperm(CACHE_BLOCKS, generator=g)[:2 * MAX_BLOCKS].view(2, MAX_BLOCKS).int()
    return (query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table)


def reference(query, key_cache, value_cache, cu_seqlens_q, seq_lens, block_table):
    out = torch.empty_like(query)
    group = HEADS // KV_HEADS
    for b in range(seq_lens.shape[0]):
        lo, hi, n = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seq_lens[b])
        q = query[lo:hi]
        k = key_cache[block_table[b].long()].flatten(0, 1)[:n].repeat_interleave(group, 1)
        v = value_cache[block_table[b].long()].flatten(0, 1)[:n].repeat_interleave(group, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / HEAD ** 0.5
        qpos = torch.arange(n - (hi - lo), n)[:, None]
        s = s.masked_fill(torch.arange(n)[None, :] > qpos, float("-inf"))
        out[lo:hi] = torch.einsum("hqk,khd->qhd", s.softmax(-1), v)
    return out


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"query": {0: torch.export.Dim("tokens", min=2, max=PAGE * MAX_BLOCKS)},
                  "key_cache": None, "value_cache": None, "cu_seqlens_q": None, "seq_lens": None,
                  "block_table": None}
tolerance = (1e-4, 1e-4)
