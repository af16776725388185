"""Decode attention split over keys (flash-decoding): one query position per sequence, a key
/value cache [B, H_kv, S, D] read where it lies (grouped heads: query head ``h`` reads key head
``h // (H_q // H_kv)``), keys at positions ``< lengths[b]`` attended. Each program owns one
(sequence, query head, slice of the keys) and writes its partial output with the slice's
running max and sum; a second kernel combines the slices in a fixed order (bit-stable)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, len_ptr, acc_ptr, stat_ptr, scale, S,
                  stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                  H_Q: tl.constexpr, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                  BLOCK_S: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    split = tl.program_id(2)
    kv = h // GROUP
    length = tl.load(len_ptr + b)
    per = tl.cdiv(tl.cdiv(S, SPLITS), BLOCK_S) * BLOCK_S
    start = split * per
    end = tl.minimum(start + per, tl.minimum(length, S))
    d = tl.arange(0, BLOCK_D)
    q = tl.load(q_ptr + b * stride_qb + h * stride_qh + d, mask=d < D, other=0.0).to(tl.float32)
    m = -float("inf")
    l = 0.0
    acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        keep = s < end
        k = tl.load(k_ptr + b * stride_kb + kv * stride_kh + s[:, None] * stride_ks + d[None, :],
                    mask=keep[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
        scores = tl.sum(k * q[None, :], axis=1) * scale
        scores = tl.where(keep, scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=0))
        p = tl.exp(scores - m_new)
        alpha = tl.exp(m - m_new)
        v = tl.load(v_ptr + b * stride_vb + kv * stride_vh + s[:, None] * stride_vs + d[None, :],
                    mask=keep[:, None] & (d[None, :] < D), other=0.0).to(tl.float32)
        acc = acc * alpha + tl.sum(p[:, None] * v, axis=0)
        l = l * alpha + tl.sum(p, axis=0)
        m = m_new
    row = (b * H_Q + h) * SPLITS + split
    tl.store(acc_ptr + row * BLOCK_D + d, acc)
    tl.store(stat_ptr + row * 2, m)
    tl.store(stat_ptr + row * 2 + 1, l)


@triton.jit
def _decode_combine(acc_ptr, stat_ptr, o_ptr, stride_ob, stride_oh, H_Q: tl.constexpr,
                    D: tl.constexpr, BLOCK_D: tl.constexpr, SPLITS: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    base = (b * H_Q + h) * SPLITS
    top = -float("inf")
    for i in range(SPLITS):
        top = tl.maximum(top, tl.load(stat_ptr + (base + i) * 2))
    total = 0.0
    out = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for i in range(SPLITS):  # a fixed order: the same bits every run
        m = tl.load(stat_ptr + (base + i) * 2)
        w = tl.where(m == -float("inf"), 0.0, tl.exp(m - top))
        total += tl.load(stat_ptr + (base + i) * 2 + 1) * w
        out += tl.load(acc_ptr + (base + i) * BLOCK_D + d) * w
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, (out / total).to(o_ptr.dtype.element_ty), mask=d < D)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                     scale: float | None = None, splits: int = 8, block_s: int = 64) -> torch.Tensor:
    """Attention of ``q`` [B, H_q, D] (one position each) over ``k``, ``v`` [B, H_kv, S, D]
    (last dim contiguous), keys ``< lengths[b]`` of sequence ``b``; the result is [B, H_q, D]
    in ``q``'s dtype."""
    B, H_q, D = q.shape
    Bk, H_kv, S, Dk = k.shape
    if Bk != B or Dk != D or v.shape != k.shape or H_q % H_kv or lengths.shape != (B,):
        raise ValueError(f"decode_attention takes q [B, H_q, D], k and v [B, H_kv, S, D] with H_kv "
                         f"dividing H_q, lengths [B]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {tuple(lengths.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("decode_attention needs the last dim of q, k and v contiguous")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    block_d = triton.next_power_of_2(D)
    acc = torch.empty((B, H_q, splits, block_d), dtype=torch.float32, device=q.device)
    stats = torch.empty((B, H_q, splits, 2), dtype=torch.float32, device=q.device)
    out = torch.empty((B, H_q, D), dtype=q.dtype, device=q.device)
    _decode_split[(B, H_q, splits)](q, k, v, lengths, acc, stats, scale, S,
                                    q.stride(0), q.stride(1), k.stride(0), k.stride(1), k.stride(2),
                                    v.stride(0), v.stride(1), v.stride(2), H_Q=H_q, GROUP=H_q // H_kv,
                                    D=D, BLOCK_D=block_d, BLOCK_S=block_s, SPLITS=splits)
    _decode_combine[(B, H_q)](acc, stats, out, out.stride(0), out.stride(1), H_Q=H_q, D=D,
                              BLOCK_D=block_d, SPLITS=splits)
    return out
