"""A LLaMA-style decoder block whose RMSNorm, RoPE and SwiGLU are Triton kernels.

    h   = x + Wo · attention(rope(Wq · rmsnorm(x)), rope(Wk · rmsnorm(x)), Wv · rmsnorm(x))
    out = h + Wdown · swiglu(Wgate · rmsnorm(h), Wup · rmsnorm(h))

Projections are ``F.linear`` with ``nn.Parameter`` weights and attention is torch's
``scaled_dot_product_attention`` (causal). The RoPE tables are computed in ``forward`` from the
positions ``0..seq-1``. The input is (batch=1, seq, hidden=64) fp32 with a dynamic ``seq``.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl


# --------------------------------------------------------------------------- Triton kernels


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """One program per row: out = x / sqrt(mean(x^2) + eps) * w."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(
    x_ptr, cos_ptr, sin_ptr, out_ptr,
    n_heads,
    stride_xb, stride_xs, stride_xh,
    stride_ob, stride_os, stride_oh,
    stride_cos,
    HALF_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
):
    """One program per (batch, position): rotate every head's (x1, x2) halves by the angle table."""
    b = tl.program_id(0)
    pos = tl.program_id(1)
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, HALF_DIM)
    mask = heads[:, None] < n_heads
    cos = tl.load(cos_ptr + pos * stride_cos + dims)[None, :]
    sin = tl.load(sin_ptr + pos * stride_cos + dims)[None, :]

    x = x_ptr + b * stride_xb + pos * stride_xs + heads[:, None] * stride_xh + dims[None, :]
    x1 = tl.load(x, mask=mask).to(tl.float32)
    x2 = tl.load(x + HALF_DIM, mask=mask).to(tl.float32)

    out = out_ptr + b * stride_ob + pos * stride_os + heads[:, None] * stride_oh + dims[None, :]
    tl.store(out, (x1 * cos - x2 * sin).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out + HALF_DIM, (x2 * cos + x1 * sin).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = silu(gate) * up, elementwise."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    gate = tl.load(gate_ptr + offsets, mask=mask).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask).to(tl.float32)
    tl.store(out_ptr + offsets, (gate * tl.sigmoid(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- launch wrappers


def rms_norm(x, weight, eps):
    hidden = x.shape[-1]
    x2d = x.reshape(-1, hidden)
    out = torch.empty_like(x2d)
    rmsnorm_kernel[(x2d.shape[0],)](
        x2d, weight, out, hidden, eps, x2d.stride(0), out.stride(0),
        BLOCK_N=triton.next_power_of_2(hidden),
    )
    return out.reshape(x.shape)


def apply_rope(x, cos, sin):
    """x: (batch, seq, heads, head_dim); cos, sin: (seq, head_dim // 2)."""
    batch, seq, n_heads, head_dim = x.shape
    out = torch.empty_like(x)
    rope_kernel[(batch, seq)](
        x, cos, sin, out,
        n_heads,
        x.stride(0), x.stride(1), x.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        cos.stride(0),
        HALF_DIM=head_dim // 2, BLOCK_H=triton.next_power_of_2(n_heads),
    )
    return out


def swiglu(gate, up):
    out = torch.empty_like(gate)
    n_elements = out.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
    swiglu_kernel[grid](gate, up, out, n_elements, BLOCK_SIZE=1024)
    return out


# --------------------------------------------------------------------------- model


class LlamaBlock(torch.nn.Module):
    def __init__(self, hidden=64, n_heads=4, intermediate=128, rope_base=10000.0, eps=1e-6, seed=0):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = hidden // n_heads
        self.eps = eps
        g = torch.Generator().manual_seed(seed)

        def linear_weight(out_features, in_features):
            w = torch.randn(out_features, in_features, generator=g) / in_features**0.5
            return torch.nn.Parameter(w)

        self.attn_norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.wq = linear_weight(hidden, hidden)
        self.wk = linear_weight(hidden, hidden)
        self.wv = linear_weight(hidden, hidden)
        self.wo = linear_weight(hidden, hidden)
        self.mlp_norm = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.w_gate = linear_weight(intermediate, hidden)
        self.w_up = linear_weight(intermediate, hidden)
        self.w_down = linear_weight(hidden, intermediate)
        inv_freq = 1.0 / rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def rope_tables(self, seq, device):
        positions = torch.arange(seq, device=device, dtype=torch.float32)
        freqs = torch.outer(positions, self.inv_freq)
        return freqs.cos(), freqs.sin()

    def forward(self, x):
        batch, seq, hidden = x.shape
        cos, sin = self.rope_tables(seq, x.device)

        h = rms_norm(x, self.attn_norm, self.eps)
        q = F.linear(h, self.wq).view(batch, seq, self.n_heads, self.head_dim)
        k = F.linear(h, self.wk).view(batch, seq, self.n_heads, self.head_dim)
        v = F.linear(h, self.wv).view(batch, seq, self.n_heads, self.head_dim)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        attn = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        x = x + F.linear(attn.transpose(1, 2).reshape(batch, seq, hidden), self.wo)

        h = rms_norm(x, self.mlp_norm, self.eps)
        return x + F.linear(swiglu(F.linear(h, self.w_gate), F.linear(h, self.w_up)), self.w_down)


# --------------------------------------------------------------------------- plain-torch reference


def _rms_norm_ref(x, weight, eps):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def _rope_ref(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


@torch.no_grad()
def reference(x):
    m = model
    batch, seq, hidden = x.shape
    cos, sin = m.rope_tables(seq, x.device)

    h = _rms_norm_ref(x, m.attn_norm, m.eps)
    q = F.linear(h, m.wq).view(batch, seq, m.n_heads, m.head_dim)
    k = F.linear(h, m.wk).view(batch, seq, m.n_heads, m.head_dim)
    v = F.linear(h, m.wv).view(batch, seq, m.n_heads, m.head_dim)
    q, k = _rope_ref(q, cos, sin), _rope_ref(k, cos, sin)
    attn = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
    )
    x = x + F.linear(attn.transpose(1, 2).reshape(batch, seq, hidden), m.wo)

    h = _rms_norm_ref(x, m.mlp_norm, m.eps)
    return x + F.linear(F.silu(F.linear(h, m.w_gate)) * F.linear(h, m.w_up), m.w_down)


def _make_inputs(seq=16, hidden=64):
    g = torch.Generator().manual_seed(1)
    return (torch.randn(1, seq, hidden, generator=g),)


model = LlamaBlock().eval()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {1: torch.export.Dim("seq", min=2, max=2048)}}
expected_roles = {
    "rmsnorm_kernel": {"x_ptr": "input", "w_ptr": "input", "out_ptr": "output"},
    "rope_kernel": {"x_ptr": "input", "cos_ptr": "input", "sin_ptr": "input", "out_ptr": "output"},
    "swiglu_kernel": {"gate_ptr": "input", "up_ptr": "input", "out_ptr": "output"},
}
tolerance = (1e-4, 1e-4)
