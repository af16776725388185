"""Decode attention split over keys (flash-decoding): one query position per sequence, a key
/value cache [B, H_kv, S, D] read where it lies (grouped heads: query head ``h`` reads key head
``h // (H_q // H_kv)``), keys at positions ``< lengths[b]`` and where a bool mask holds
attended. Each program owns one (sequence, key head, slice of the keys) and every query head
that reads that key head, so each key and value is read from memory once; it writes each head's
partial output with the slice's running max and sum, and a second kernel combines the slices
in a fixed order (bit-stable)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _dot(a, b):
    """a @ b with fp32 accumulation: fp16/bf16 on the tensor cores, fp32 exactly (no tf32)."""
    if a.dtype == tl.float32:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b, out_dtype=tl.float32)


@triton.jit
def _decode_split(q_ptr, k_ptr, v_ptr, len_ptr, mask_ptr, acc_ptr, stat_ptr, scale, S,
                  stride_qb, stride_qh, stride_kb, stride_kh, stride_ks, stride_vb, stride_vh, stride_vs,
                  stride_mb, H_Q: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, SPLITS: tl.constexpr,
                  HAS_LENGTHS: tl.constexpr, HAS_MASK: tl.constexpr):
    """One program: sequence ``b``, key head ``kv`` and the GROUP query heads that read it (rows
    of a [BLOCK_G, D] tile, padded to 16 for the tensor cores), one slice of the keys: each
    key/value block is read once for the whole group."""
    b = tl.program_id(0)
    kv = tl.program_id(1)
    split = tl.program_id(2)
    per = tl.cdiv(tl.cdiv(S, SPLITS), BLOCK_S) * BLOCK_S
    start = split * per
    end = tl.minimum(start + per, S)
    if HAS_LENGTHS:
        end = tl.minimum(end, tl.load(len_ptr + b))
    d = tl.arange(0, BLOCK_D)
    g = tl.arange(0, BLOCK_G)
    h = kv * GROUP + g
    head = g < GROUP
    q = tl.load(q_ptr + b * stride_qb + h[:, None] * stride_qh + d[None, :],
                mask=head[:, None] & (d[None, :] < D), other=0.0)
    m = tl.full((BLOCK_G,), -float("inf"), dtype=tl.float32)
    l = tl.zeros((BLOCK_G,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_G, BLOCK_D), dtype=tl.float32)
    for s0 in range(start, end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        keep = s < end
        if HAS_MASK:  # a bool row per sequence (stride 0: one row for all)
            keep = keep & (tl.load(mask_ptr + b * stride_mb + s, mask=keep, other=0) != 0)
        k = tl.load(k_ptr + b * stride_kb + kv * stride_kh + s[:, None] * stride_ks + d[None, :],
                    mask=keep[:, None] & (d[None, :] < D), other=0.0)
        scores = _dot(q, tl.trans(k)) * scale
        scores = tl.where(keep[None, :], scores, -float("inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        base = tl.where(m_new == -float("inf"), 0.0, m_new)  # no key yet: exp(-inf) = 0, not NaN
        p = tl.exp(scores - base[:, None])
        alpha = tl.exp(m - base)
        v = tl.load(v_ptr + b * stride_vb + kv * stride_vh + s[:, None] * stride_vs + d[None, :],
                    mask=keep[:, None] & (d[None, :] < D), other=0.0)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v)  # p in v's dtype, as flash attention
        l = l * alpha + tl.sum(p, axis=1)
        m = m_new
    row = (b * H_Q + h) * SPLITS + split
    tl.store(acc_ptr + row[:, None] * BLOCK_D + d[None, :], acc, mask=head[:, None])
    tl.store(stat_ptr + row * 2, m, mask=head)
    tl.store(stat_ptr + row * 2 + 1, l, mask=head)


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
    out = tl.where(total > 0, out / total, 0.0)  # no key attended: 0, as torch's SDPA gives
    tl.store(o_ptr + b * stride_ob + h * stride_oh + d, out.to(o_ptr.dtype.element_ty), mask=d < D)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor | None = None,
                     scale: float | None = None, splits: int = 8, block_s: int = 64,
                     mask: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of ``q`` [B, H_q, D] (one position each) over ``k``, ``v`` [B, H_kv, S, D]
    (last dim contiguous), keys ``< lengths[b]`` of sequence ``b`` (all keys without
    ``lengths``) where ``mask`` (bool [B or 1, S], last dim contiguous) holds; the result is
    [B, H_q, D] in ``q``'s dtype. A sequence with no key attended gets 0 (as torch's SDPA
    gives). ``block_s`` keys a step (rounded up to a power of two, at least 16: the tensor
    cores' smallest tile; at most 8192 // the padded head size), in ``splits`` slices (see
    :func:`split_count`)."""
    B, H_q, D = q.shape
    Bk, H_kv, S, Dk = k.shape
    if Bk != B or Dk != D or v.shape != k.shape or H_q % H_kv or \
            (lengths is not None and lengths.shape != (B,)):
        raise ValueError(f"decode_attention takes q [B, H_q, D], k and v [B, H_kv, S, D] with H_kv "
                         f"dividing H_q, lengths [B]; got {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}, {None if lengths is None else tuple(lengths.shape)}")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("decode_attention needs the last dim of q, k and v contiguous")
    if mask is not None and (mask.dtype != torch.bool or mask.dim() != 2 or mask.shape[1] != S
                             or mask.stride(1) != 1):
        raise ValueError(f"decode_attention's mask is bool [B or 1, S] with its last dim contiguous; "
                         f"got {mask.dtype} {tuple(mask.shape)}")
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    block_d = max(triton.next_power_of_2(D), 16)  # tl.dot's smallest tile
    # at most 8192 elements a K/V tile: the pipelined tiles stay within ~72 KB of shared memory,
    # under the 99 KB a block gets on sm_86/sm_89 (head size 256 would take 141 KB at 64 keys)
    block_s = max(min(triton.next_power_of_2(block_s), 8192 // block_d), 16)
    group = H_q // H_kv
    acc = torch.empty((B, H_q, splits, block_d), dtype=torch.float32, device=q.device)
    stats = torch.empty((B, H_q, splits, 2), dtype=torch.float32, device=q.device)
    out = torch.empty((B, H_q, D), dtype=q.dtype, device=q.device)
    stride_mb = 0 if mask is None or mask.shape[0] == 1 else mask.stride(0)
    _decode_split[(B, H_kv, splits)](q, k, v, q if lengths is None else lengths, q if mask is None else mask,
                                    acc, stats, scale, S, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                                    k.stride(2), v.stride(0), v.stride(1), v.stride(2), stride_mb, H_Q=H_q,
                                    GROUP=group, BLOCK_G=max(triton.next_power_of_2(group), 16), D=D,
                                    BLOCK_D=block_d, BLOCK_S=block_s, SPLITS=splits,
                                    HAS_LENGTHS=lengths is not None, HAS_MASK=mask is not None)
    _decode_combine[(B, H_q)](acc, stats, out, out.stride(0), out.stride(1), H_Q=H_q, D=D,
                              BLOCK_D=block_d, SPLITS=splits)
    return out


#: Programs enough to keep an H100's or H200's 132 SMs busy with one pass (two a SM).
TARGET_PROGRAMS = 264


def split_count(batch: int, kv_heads: int, keys: int, block_s: int = 64) -> int:
    """Slices of the keys for ``batch`` x ``kv_heads`` programs: enough for
    :data:`TARGET_PROGRAMS` programs, at most one slice per ``block_s`` keys and 16 in all."""
    want = -(-TARGET_PROGRAMS // max(batch * kv_heads, 1))
    return max(1, min(16, want, -(-keys // block_s)))
