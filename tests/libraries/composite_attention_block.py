"""Composite: a decoder attention block over a paged KV cache, chaining library ops as a serving
engine does: flashnn's rms_norm, the q/k/v projection in torch, conch's rotary_embedding (NeoX,
a cos/sin cache), conch's reshape_and_cache writing k/v into the paged cache in place, conch's
varlen_attention (causal, grouped-query) over the cache, the output projection and the residual
in torch. A prefill of two sequences (conch's causal varlen_attention aligns the mask at each
sequence's first key: queries of a sequence with past context would need another kernel)."""

import torch
import flashnn
from conch.ops.attention.varlen_attention import varlen_attention
from conch.ops.embedding.rotary_embedding import rotary_embedding
from conch.ops.vllm.reshape_and_cache import reshape_and_cache

library = "conch-triton-kernels+flashnn"  # written against conch-triton-kernels 1.3, flashnn 0.1.1
library_module = "conch"
library_env = {}

HIDDEN, HEADS, KV_HEADS, HEAD, PAGE, MAX_BLOCKS, CACHE_BLOCKS, MAX_POS = 128, 4, 2, 32, 16, 8, 32, 1024


def _cos_sin_cache(base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, HEAD, 2, dtype=torch.float) / HEAD))
    freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.norm = flashnn.RMSNorm(HIDDEN, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(HIDDEN, generator=g))
        self.qkv = torch.nn.Parameter(torch.randn((HEADS + 2 * KV_HEADS) * HEAD, HIDDEN, generator=g) / HIDDEN ** 0.5)
        self.out = torch.nn.Parameter(torch.randn(HIDDEN, HEADS * HEAD, generator=g) / (HEADS * HEAD) ** 0.5)
        self.register_buffer("cos_sin_cache", _cos_sin_cache())

    def forward(self, x, positions, key_cache, value_cache, slots, cu_seqlens_q, seq_lens, block_table):
        h = self.norm(x)
        qkv = h @ self.qkv.T
        q, k, v = qkv.split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
        q, k = q.contiguous(), k.contiguous()
        q, k = rotary_embedding(positions, q, k, HEAD, self.cos_sin_cache, is_neox=True)
        k = k.view(-1, KV_HEADS, HEAD)
        v = v.contiguous().view(-1, KV_HEADS, HEAD)
        reshape_and_cache(k, v, key_cache, value_cache, slots, "auto", None, None)
        attn = varlen_attention(q.view(-1, HEADS, HEAD), key_cache, value_cache, cu_seqlens_q,
                                x.shape[0], seq_lens, PAGE * MAX_BLOCKS, block_table, causal=True)
        return x + attn.flatten(1) @ self.out.T


def _make_inputs(tokens=12):
    g = torch.Generator().manual_seed(0)
    first = tokens // 3
    new = [first, tokens - first]
    past = [0, 0]
    lens = [p + n for p, n in zip(past, new)]
    x = torch.randn(tokens, HIDDEN, generator=g)
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(past, new)])
    key_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    value_cache = torch.randn(CACHE_BLOCKS, PAGE, KV_HEADS, HEAD, generator=g)
    block_table = torch.randperm(CACHE_BLOCKS, generator=g)[:2 * MAX_BLOCKS].view(2, MAX_BLOCKS).int()
    slots = torch.cat([block_table[b].long().repeat_interleave(PAGE)[past[b]:lens[b]] * PAGE
                       + torch.arange(past[b], lens[b]) % PAGE for b in range(2)])
    cu_seqlens_q = torch.tensor([0, new[0], tokens], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    return (x, positions, key_cache, value_cache, slots, cu_seqlens_q, seq_lens, block_table)


def reference(x, positions, key_cache, value_cache, slots, cu_seqlens_q, seq_lens, block_table):
    m = model
    h = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * m.norm.weight.detach()
    q, k, v = (h @ m.qkv.detach().T).split([HEADS * HEAD, KV_HEADS * HEAD, KV_HEADS * HEAD], dim=-1)
    cos, sin = m.cos_sin_cache[positions].chunk(2, dim=-1)

    def rope(t):
        t = t.reshape(t.shape[0], -1, HEAD)
        a, b = t.chunk(2, dim=-1)
        return torch.cat((a * cos[:, None] - b * sin[:, None], b * cos[:, None] + a * sin[:, None]), -1)

    q, k, v = rope(q), rope(k), v.reshape(-1, KV_HEADS, HEAD)
    kc, vc = key_cache.clone().flatten(0, 1), value_cache.clone().flatten(0, 1)
    kc[slots], vc[slots] = k, v
    out = torch.empty_like(q)
    for b in range(2):
        lo, hi, n = int(cu_seqlens_q[b]), int(cu_seqlens_q[b + 1]), int(seq_lens[b])
        idx = (block_table[b].long().repeat_interleave(PAGE) * PAGE + torch.arange(PAGE * MAX_BLOCKS) % PAGE)[:n]
        kk = kc[idx].repeat_interleave(HEADS // KV_HEADS, 1)
        vv = vc[idx].repeat_interleave(HEADS // KV_HEADS, 1)
        s = torch.einsum("qhd,khd->hqk", q[lo:hi], kk) / HEAD ** 0.5
        qpos = torch.arange(n - (hi - lo), n)[:, None]
        s = s.masked_fill(torch.arange(n)[None, :] > qpos, float("-inf"))
        out[lo:hi] = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv)
    return x + out.flatten(1) @ m.out.detach().T


model = Model()
example_inputs = _make_inputs()
_t = torch.export.Dim("tokens", min=4, max=64)
dynamic_shapes = {"x": {0: _t}, "positions": {0: _t}, "key_cache": None, "value_cache": None,
                  "slots": {0: _t}, "cu_seqlens_q": None, "seq_lens": None, "block_table": None}
tolerance = (1e-4, 1e-4)
