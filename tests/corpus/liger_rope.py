"""Liger-Kernel RoPE (HuggingFace Llama layout), unchanged: ``LigerRopeFunction.apply``.

``q``/``k`` are (batch, heads, seq, head_dim); Liger transposes them to (batch, seq, heads,
head_dim) copies and rotates those in place, so both pointers are read and written. The batch
is a constexpr of the kernel (static); the sequence length is dynamic.
"""

import torch
from liger_kernel.ops.rope import LigerRopeFunction


class Model(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return LigerRopeFunction.apply(q, k, cos, sin)


def rope_tables(seq, head_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)[None]  # (1, seq, head_dim)
    return emb.cos(), emb.sin()


def _make_inputs(batch=2, q_heads=4, kv_heads=2, seq=8, head_dim=16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, q_heads, seq, head_dim, generator=g)
    k = torch.randn(batch, kv_heads, seq, head_dim, generator=g)
    return (q, k, *rope_tables(seq, head_dim))


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def reference(q, k, cos, sin):
    cos, sin = cos[:, None], sin[:, None]  # broadcast over heads
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


model = Model()
example_inputs = _make_inputs()
_seq = torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"q": {2: _seq}, "k": {2: _seq}, "cos": {1: _seq}, "sin": {1: _seq}}
expected_roles = {
    "_triton_rope": {"q_ptr": "inplace", "k_ptr": "inplace", "cos": "input", "sin": "input"},
}
tolerance = (1e-5, 1e-5)
