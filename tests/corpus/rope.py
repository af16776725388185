"""Rotary position embedding (RoPE), half-split ("rotate_half") layout.

Covers case 14: ``q`` is (batch, seq, heads, head_dim); ``cos``/``sin`` are (seq, head_dim // 2)
tables. One program per (batch, position) rotates all heads at once as a
(BLOCK_H, head_dim // 2) tile:

    out[..., :d/2] = q1 * cos - q2 * sin
    out[..., d/2:] = q2 * cos + q1 * sin
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rope_kernel(
    q_ptr, cos_ptr, sin_ptr, out_ptr,
    n_heads,
    stride_qb, stride_qs, stride_qh,
    stride_ob, stride_os, stride_oh,
    stride_cos,
    HALF_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
):
    b = tl.program_id(0)
    pos = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF_DIM)
    mask = heads[:, None] < n_heads

    cos = tl.load(cos_ptr + pos * stride_cos + dims)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cos + dims)[None, :]

    q = q_ptr + b * stride_qb + pos * stride_qs + heads[:, None] * stride_qh + dims[None, :]
    q1 = tl.load(q, mask=mask).to(tl.float32)
    q2 = tl.load(q + HALF_DIM, mask=mask).to(tl.float32)

    out = out_ptr + b * stride_ob + pos * stride_os + heads[:, None] * stride_oh + dims[None, :]
    tl.store(out, (q1 * cos - q2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + HALF_DIM, (q2 * cos + q1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def forward(self, q, cos, sin):
        batch, seq, n_heads, head_dim = q.shape
        out = torch.empty_like(q)
        rope_kernel[(batch, seq)](
            q, cos, sin, out,
            n_heads,
            q.stride(0), q.stride(1), q.stride(2),
            out.stride(0), out.stride(1), out.stride(2),
            cos.stride(0),
            HALF_DIM=head_dim // 2, BLOCK_H=triton.next_power_of_2(n_heads),
        )
        return out


def rope_tables(seq, head_dim, base=10000.0):
    inv_freq = 1.0 / base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    freqs = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
    return freqs.cos(), freqs.sin()


def _make_inputs(batch=2, seq=8, heads=3, head_dim=16):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(batch, seq, heads, head_dim, generator=g)
    return (q, *rope_tables(seq, head_dim))


def reference(q, cos, sin):
    q1, q2 = q.float().chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return torch.cat([q1 * cos - q2 * sin, q2 * cos + q1 * sin], dim=-1).to(q.dtype)


model = Model()
example_inputs = _make_inputs()
# Heads and head_dim are static (they pick constexpr block shapes); batch and seq are dynamic.
_seq = torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {
    "q": {0: torch.export.Dim("batch", min=2, max=64), 1: _seq},
    "cos": {0: _seq},
    "sin": {0: _seq},
}
expected_roles = {
    "rope_kernel": {"q_ptr": "input", "cos_ptr": "input", "sin_ptr": "input", "out_ptr": "output"}
}
tolerance = (1e-5, 1e-5)
