"""Triton kernels for the norms, MLP activations and RoPE of Hugging Face transformer models,
plus ``torch.nn.Module`` / function wrappers that launch them with plain ``kernel[grid](...)``.

Every kernel works for any number of rows / positions (blocks are masked) and uses only plain
``tl`` ops (no libdevice), so it also runs in Triton's interpreter on a CPU-only host: ``tanh``
is written with ``exp``. Arithmetic is done in fp32 and rounded to the output dtype on store.

Kernels (names are what tests count launches by):

================================  =========================================================
``rmsnorm_kernel``                ``x * rsqrt(mean(x^2) + eps) * w`` (Llama, Mistral, Qwen2)
``gemma_rmsnorm_kernel``          ``x * rsqrt(mean(x^2) + eps) * (1 + w)`` (Gemma)
``layernorm_kernel``              ``(x - mean) * rsqrt(var + eps) * w + b`` (GPT-2, OPT, Phi, BERT)
``silu_mul_kernel``               ``silu(gate) * up`` (SwiGLU: Llama, Mistral, Qwen2)
``gelu_tanh_mul_kernel``          ``gelu_tanh(gate) * up`` (GeGLU: Gemma)
``gelu_tanh_kernel``              ``gelu_tanh(x)`` (``gelu_new``: GPT-2, Phi)
``gelu_erf_kernel``               ``gelu(x)`` with ``erf`` (BERT)
``relu_kernel``                   ``max(x, 0)`` (OPT)
``rope_kernel``                   HF ``apply_rotary_pos_emb`` on q and k in one launch
================================  =========================================================
"""

from __future__ import annotations

import contextlib
import importlib

import torch
import triton
import triton.language as tl

ELEMENTWISE_BLOCK = 1024
ROPE_BLOCK_S = 16  # positions per RoPE program: sequences not a multiple of 16 mask the tail


# --------------------------------------------------------------------------- kernels: norms


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out, BLOCK_N: tl.constexpr):
    """One program per row."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gemma_rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out,
                         BLOCK_N: tl.constexpr):
    """Gemma's RMSNorm: the weight is stored as an offset from 1."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = tl.rsqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (x * rstd * (1.0 + w)).to(out_ptr.dtype.element_ty),
             mask=mask)


@triton.jit
def layernorm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, eps, stride_x, stride_out,
                     BLOCK_N: tl.constexpr):
    """One program per row; biased variance, like torch.nn.LayerNorm."""
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    rstd = tl.rsqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, (centered * rstd * w + b).to(out_ptr.dtype.element_ty),
             mask=mask)


# --------------------------------------------------------------------------- kernels: activations


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): exp overflows to inf for large x (-> 1), underflows to
    # 0 for very negative x (-> -1); no libdevice call.
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _gelu_tanh(x):
    return 0.5 * x * (1.0 + _tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))


@triton.jit
def silu_mul_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_tanh_mul_kernel(gate_ptr, up_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    gate = tl.load(gate_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(up_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, (_gelu_tanh(gate) * up).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_tanh_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + offsets, _gelu_tanh(x).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def gelu_erf_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    out = 0.5 * x * (1.0 + tl.erf(x * 0.7071067811865476))
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def relu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
    tl.store(out_ptr + offsets, tl.maximum(x, 0.0).to(out_ptr.dtype.element_ty), mask=mask)


# --------------------------------------------------------------------------- kernels: RoPE


@triton.jit
def _rope_heads(x_ptr, out_ptr, cos1, sin1, cos2, sin2, b, pos, dims, mask,
                stride_b, stride_h, stride_s, stride_ob, stride_oh, stride_os,
                N_HEADS: tl.constexpr, HALF: tl.constexpr):
    for h in tl.static_range(N_HEADS):
        x = x_ptr + b * stride_b + h * stride_h + pos[:, None] * stride_s + dims[None, :]
        x1 = tl.load(x, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(x + HALF, mask=mask, other=0.0).to(tl.float32)
        out = out_ptr + b * stride_ob + h * stride_oh + pos[:, None] * stride_os + dims[None, :]
        tl.store(out, (x1 * cos1 - x2 * sin1).to(out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + HALF, (x2 * cos2 + x1 * sin2).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def rope_kernel(
    q_ptr, k_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr,
    seq_len,
    stride_qb, stride_qh, stride_qs,
    stride_kb, stride_kh, stride_ks,
    stride_qob, stride_qoh, stride_qos,
    stride_kob, stride_koh, stride_kos,
    stride_cb, stride_cs,
    N_Q_HEADS: tl.constexpr, N_K_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_S: tl.constexpr,
):
    """``x * cos + rotate_half(x) * sin`` for q and k: one program per (BLOCK_S positions, batch).

    The last dim of q, k, cos and sin is contiguous; cos/sin are (batch, seq, 2 * HALF) with a
    batch stride of 0 when they are shared by the whole batch."""
    pos = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    b = tl.program_id(1)
    dims = tl.arange(0, HALF)
    mask = (pos < seq_len)[:, None]
    c = cos_ptr + b * stride_cb + pos[:, None] * stride_cs + dims[None, :]
    s = sin_ptr + b * stride_cb + pos[:, None] * stride_cs + dims[None, :]
    cos1 = tl.load(c, mask=mask, other=0.0).to(tl.float32)
    cos2 = tl.load(c + HALF, mask=mask, other=0.0).to(tl.float32)
    sin1 = tl.load(s, mask=mask, other=0.0).to(tl.float32)
    sin2 = tl.load(s + HALF, mask=mask, other=0.0).to(tl.float32)
    _rope_heads(q_ptr, q_out_ptr, cos1, sin1, cos2, sin2, b, pos, dims, mask,
                stride_qb, stride_qh, stride_qs, stride_qob, stride_qoh, stride_qos, N_Q_HEADS, HALF)
    _rope_heads(k_ptr, k_out_ptr, cos1, sin1, cos2, sin2, b, pos, dims, mask,
                stride_kb, stride_kh, stride_ks, stride_kob, stride_koh, stride_kos, N_K_HEADS, HALF)


# --------------------------------------------------------------------------- launch wrappers


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def _row_norm(kernel, x, weight, eps, *extra):
    hidden = x.shape[-1]
    x2d = _rows(x)
    if x2d.stride(-1) != 1:
        x2d = x2d.contiguous()
    out = torch.empty(x2d.shape, dtype=x.dtype, device=x.device)
    kernel[(x2d.shape[0],)](x2d, weight, *extra, out, hidden, eps, x2d.stride(0), out.stride(0),
                            BLOCK_N=triton.next_power_of_2(hidden))
    return out.reshape(x.shape)


def _elementwise(kernel, out_like, *tensors):
    tensors = [t.contiguous() for t in tensors]
    out = torch.empty(out_like.shape, dtype=out_like.dtype, device=out_like.device)
    n = out.numel()
    kernel[(triton.cdiv(n, ELEMENTWISE_BLOCK),)](*tensors, out, n, BLOCK_SIZE=ELEMENTWISE_BLOCK)
    return out


def rms_norm(x, weight, eps):
    return _row_norm(rmsnorm_kernel, x, weight, eps)


def gemma_rms_norm(x, weight, eps):
    return _row_norm(gemma_rmsnorm_kernel, x, weight, eps)


def layer_norm(x, weight, bias, eps):
    # The kernel signature is (x, w, b, out, ...): b rides in _row_norm's ``extra``.
    return _row_norm(layernorm_kernel, x, weight, eps, bias)


def silu_mul(gate, up):
    return _elementwise(silu_mul_kernel, gate, gate, up)


def gelu_tanh_mul(gate, up):
    return _elementwise(gelu_tanh_mul_kernel, gate, gate, up)


def gelu_tanh(x):
    return _elementwise(gelu_tanh_kernel, x, x)


def gelu_erf(x):
    return _elementwise(gelu_erf_kernel, x, x)


def relu(x):
    return _elementwise(relu_kernel, x, x)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    """Drop-in for transformers' ``apply_rotary_pos_emb``.

    q: (batch, q_heads, seq, rot_dim) for ``unsqueeze_dim=1`` or (batch, seq, q_heads, rot_dim)
    for ``unsqueeze_dim=2`` (any strides, last dim contiguous, e.g. Phi's partial-rotary slice);
    k likewise with its own head count; cos, sin: (batch or 1, seq, rot_dim).
    Returns new contiguous tensors shaped like q and k."""
    if unsqueeze_dim not in (1, 2):
        raise ValueError(f"unsqueeze_dim must be 1 or 2, got {unsqueeze_dim}")
    h_dim, s_dim = (1, 2) if unsqueeze_dim == 1 else (2, 1)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    batch, seq, rot = q.shape[0], q.shape[s_dim], q.shape[-1]
    cos = cos.expand(batch, -1, -1)  # a shared (1, seq, rot) table gets batch stride 0
    sin = sin.expand(batch, -1, -1)
    if cos.stride(-1) != 1 or sin.stride() != cos.stride():
        cos, sin = cos.contiguous(), sin.contiguous()
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    grid = (triton.cdiv(seq, ROPE_BLOCK_S), batch)
    rope_kernel[grid](
        q, k, cos, sin, q_out, k_out,
        seq,
        q.stride(0), q.stride(h_dim), q.stride(s_dim),
        k.stride(0), k.stride(h_dim), k.stride(s_dim),
        q_out.stride(0), q_out.stride(h_dim), q_out.stride(s_dim),
        k_out.stride(0), k_out.stride(h_dim), k_out.stride(s_dim),
        cos.stride(0), cos.stride(1),
        N_Q_HEADS=q.shape[h_dim], N_K_HEADS=k.shape[h_dim], HALF=rot // 2, BLOCK_S=ROPE_BLOCK_S,
    )
    return q_out, k_out


# --------------------------------------------------------------------------- modules


class TritonRMSNorm(torch.nn.Module):
    """Replaces LlamaRMSNorm / MistralRMSNorm / Qwen2RMSNorm (``gemma=False``) or GemmaRMSNorm
    (``gemma=True``); shares the original's weight."""

    def __init__(self, weight: torch.nn.Parameter, eps: float, gemma: bool = False):
        super().__init__()
        self.weight = weight
        self.eps = float(eps)
        self.gemma = gemma

    @classmethod
    def from_hf(cls, norm: torch.nn.Module, gemma: bool = False) -> "TritonRMSNorm":
        eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
        return cls(norm.weight, eps, gemma)

    def forward(self, x):
        return (gemma_rms_norm if self.gemma else rms_norm)(x, self.weight, self.eps)


class TritonLayerNorm(torch.nn.Module):
    """Replaces a ``torch.nn.LayerNorm`` over the last dim (with weight and bias)."""

    def __init__(self, weight: torch.nn.Parameter, bias: torch.nn.Parameter, eps: float):
        super().__init__()
        self.weight = weight
        self.bias = bias
        self.eps = float(eps)

    @classmethod
    def from_torch(cls, norm: torch.nn.LayerNorm) -> "TritonLayerNorm":
        if len(norm.normalized_shape) != 1 or norm.weight is None or norm.bias is None:
            raise ValueError(f"only 1-d affine LayerNorm with bias is supported, got {norm}")
        return cls(norm.weight, norm.bias, norm.eps)

    def forward(self, x):
        return layer_norm(x, self.weight, self.bias, self.eps)


class TritonGatedMLP(torch.nn.Module):
    """Replaces a gated MLP (LlamaMLP, MistralMLP, Qwen2MLP, GemmaMLP):
    ``down(act(gate(x)) * up(x))`` with the act-and-multiply fused in one kernel. Shares the
    original's projections."""

    def __init__(self, mlp: torch.nn.Module, act: str):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.fused = {"silu": silu_mul, "gelu_tanh": gelu_tanh_mul}[act]

    def forward(self, x):
        return self.down_proj(self.fused(self.gate_proj(x), self.up_proj(x)))


class TritonActivation(torch.nn.Module):
    """Replaces an ``ACT2FN`` activation module: ``gelu_tanh`` (gelu_new, gelu_pytorch_tanh),
    ``gelu`` (erf) or ``relu``."""

    def __init__(self, act: str):
        super().__init__()
        self.act = act
        self.fn = {"gelu_tanh": gelu_tanh, "gelu": gelu_erf, "relu": relu}[act]

    def forward(self, x):
        return self.fn(x)

    def extra_repr(self):
        return self.act


def use_triton_llama(model: torch.nn.Module) -> None:
    """Replace a transformers Llama's RMSNorm and MLP modules, in place, by the Triton drop-ins
    above (sharing their parameters)."""
    from transformers.models.llama import modeling_llama

    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, modeling_llama.LlamaRMSNorm):
                setattr(parent, name, TritonRMSNorm.from_hf(child))
            elif isinstance(child, modeling_llama.LlamaMLP):
                setattr(parent, name, TritonGatedMLP(child, "silu"))


@contextlib.contextmanager
def triton_rope(modeling_module: str | None):
    """transformers' attention calls its modeling module's ``apply_rotary_pos_emb``: swap it for
    the Triton one while the block runs (always restored; ``None``: no swap)."""
    if modeling_module is None:
        yield
        return
    mod = importlib.import_module(modeling_module)
    original = mod.apply_rotary_pos_emb
    mod.apply_rotary_pos_emb = apply_rotary_pos_emb
    try:
        yield
    finally:
        mod.apply_rotary_pos_emb = original
