"""Skinny GEMM ``y = x @ w (+ bias) (+ residual)`` for a few rows (M <= 16): the weight is
streamed once, each program owning ``BLOCK_N`` columns for every row; fp32 accumulation.
With ``SPLIT_K > 1`` each program also owns a slice of K and writes an fp32 partial, and a
second kernel adds the partials in a fixed order (bit-stable run to run: no atomics). A residual
is added to y as y's dtype holds it: the result has the bits of ``y + residual`` (the GEMM's
epilogue saves the add's launch and its read of y)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.testing
import triton.language as tl

MAX_ROWS = 16


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    dot: bool = False  # rows padded to 16 and multiplied on the tensor cores (tl.dot)
    num_stages: int = 3  # Triton's software pipelining: num_stages - 1 tiles of K in flight


@triton.jit
def _segment_offsets(rm, rn, M, N, S1, S2):
    """Where y's element (m, n) lives when y's columns are cut at S1 <= S2 into segments, each
    stored whole and row-major after the one before it (S1 = S2 = N: y row-major [M, N])."""
    lo = tl.where(rn < S1, 0, tl.where(rn < S2, S1, S2))
    hi = tl.where(rn < S1, S1, tl.where(rn < S2, S2, N))
    return lo[None, :] * M + rm[:, None] * (hi - lo)[None, :] + (rn - lo)[None, :]


@triton.jit
def _plus_residual(acc, res_ptr, rm, rn, stride_rm, keep, dtype: tl.constexpr):
    """``acc`` rounded to y's dtype, then the residual added in fp32: the bits of y (as the GEMM
    alone stores it) + residual in y's dtype (fp32 has over twice the bits of fp16/bf16, so its
    sum rounds to what the dtype's own correctly rounded add gives)."""
    res = tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :], mask=keep, other=0.0)
    return acc.to(dtype).to(tl.float32) + res.to(tl.float32)


@triton.jit
def _skinny_gemm(x_ptr, w_ptr, bias_ptr, res_ptr, out_ptr, M, N, K, S1, S2,
                 stride_xm, stride_xk, stride_wk, stride_wn, stride_rm,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    """``out`` is y in segments (SPLIT_K 1: bias and residual added) or the fp32 partials
    [SPLIT_K, M, N]."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    per = tl.cdiv(tl.cdiv(K, SPLIT_K), BLOCK_K) * BLOCK_K
    k_start = pid_k * per
    k_end = tl.minimum(k_start + per, K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_start, k_end, BLOCK_K):
        rk = k + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                    mask=(rm[:, None] < M) & (rk[None, :] < k_end), other=0.0)
        w = tl.load(w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn,
                    mask=(rk[:, None] < k_end) & (rn[None, :] < N), other=0.0)
        if BLOCK_M >= 16:
            acc += tl.dot(x, w, out_dtype=tl.float32)
        else:  # a few rows: multiply and add over K on the CUDA cores
            acc += tl.sum(x.to(tl.float32)[:, :, None] * w.to(tl.float32)[None, :, :], axis=1)
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if HAS_RES:
            acc = _plus_residual(acc, res_ptr, rm, rn, stride_rm, keep, out_ptr.dtype.element_ty)
        tl.store(out_ptr + _segment_offsets(rm, rn, M, N, S1, S2), acc.to(out_ptr.dtype.element_ty),
                 mask=keep)
    else:
        tl.store(out_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=keep)


@triton.jit
def _add_partials(part_ptr, bias_ptr, res_ptr, y_ptr, M, N, S1, S2, stride_rm,
                  HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rm = tl.arange(0, BLOCK_M)
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = (rm[:, None] < M) & (rn[None, :] < N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for s in range(SPLIT_K):  # a fixed order: the same bits every run
        acc += tl.load(part_ptr + s * M * N + rm[:, None] * N + rn[None, :], mask=keep, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    if HAS_RES:
        acc = _plus_residual(acc, res_ptr, rm, rn, stride_rm, keep, y_ptr.dtype.element_ty)
    tl.store(y_ptr + _segment_offsets(rm, rn, M, N, S1, S2), acc.to(y_ptr.dtype.element_ty), mask=keep)


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, config: GemmConfig = GemmConfig(),
                  segments: tuple[int, ...] = ()) -> Any:
    """``x @ w (+ bias) (+ residual)`` for ``x`` [M, K] with M <= 16 and ``w`` [K, N] (any
    strides: a transposed ``nn.Linear`` weight is ``weight.t()``); the result has ``x``'s dtype.
    With ``segments`` (at most 3 widths adding up to N; sibling weights concatenated along N)
    the result is a list of contiguous [M, width] tensors, one per segment, written in place
    by the kernel (views of one buffer: no split, no copy). An absent bias or residual is given
    the kernel as ``w`` (never read: its flag is off), so no launch reads and writes a buffer."""
    M, K = x.shape
    K2, N = w.shape
    if K2 != K or not 1 <= M <= MAX_ROWS:
        raise ValueError(f"skinny_matmul takes x [M <= {MAX_ROWS}, K] and w [K, N]; got {tuple(x.shape)} "
                         f"and {tuple(w.shape)}")
    if residual is not None and (residual.dim() != 2 or residual.stride(1) != 1):
        raise ValueError(f"skinny_matmul takes a residual [M, N] whose rows are contiguous; got shape "
                         f"{tuple(residual.shape)}, strides {residual.stride()}")
    if segments and (len(segments) > 3 or sum(segments) != N or min(segments) < 1):
        raise ValueError(f"segments {segments} are not 1 to 3 widths adding up to N = {N}")
    bounds = list(itertools.accumulate(segments))[:2] if segments else []
    s1, s2 = (bounds + [N, N])[:2]
    y = torch.empty((M * N,), dtype=x.dtype, device=x.device)
    block_m = 16 if config.dot else max(triton.next_power_of_2(M), 2)
    has_bias, has_res = bias is not None, residual is not None
    b = bias if has_bias else w
    res = residual if has_res else w
    split = config.split_k
    out = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    _skinny_gemm[(triton.cdiv(N, config.block_n), split)](
        x, w, b, res, out, M, N, K, s1, s2, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
        res.stride(0) if has_res else 0, HAS_BIAS=has_bias, HAS_RES=has_res, BLOCK_M=block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, SPLIT_K=split, num_warps=config.num_warps,
        num_stages=config.num_stages)
    if split > 1:
        _add_partials[(triton.cdiv(N, 128),)](
            out, bias if has_bias else out, residual if has_res else out, y, M, N, s1, s2,
            res.stride(0) if has_res else 0, HAS_BIAS=has_bias, HAS_RES=has_res, SPLIT_K=split,
            BLOCK_M=MAX_ROWS, BLOCK_N=128)
    if not segments:
        return y.view(M, N)
    starts = [0, *itertools.accumulate(segments)][:-1]
    return [y[M * a:M * (a + n)].view(M, n) for a, n in zip(starts, segments)]


# ----------------------------------------------------------------------------- F.linear at -O2

#: Configs measured best on the H200 (sm_90, fp16, M 1 and 8; benchmarks/bench_own_kernels.py,
#: 2026-12-05, benchmarks/own_kernels_results.json), by (N, K): the table a CPU-only host uses
#: and the first candidate a GPU's autotuning starts from.
MEASURED_SM90: dict[tuple[int, int], GemmConfig] = {
    (4096, 4096): GemmConfig(block_n=128, block_k=256, split_k=4, dot=True),
    (1024, 4096): GemmConfig(block_n=32, block_k=256, split_k=4, dot=True),
    (11008, 4096): GemmConfig(block_n=32, block_k=256, split_k=1, dot=True),
    (4096, 11008): GemmConfig(block_n=32, block_k=128, split_k=4, dot=True),
    (32000, 4096): GemmConfig(block_n=64, block_k=256, split_k=1, dot=True),
}


#: Dynamic shared memory a block may opt in to, by arch (CUDA's tables); an arch not listed is
#: given the smallest (sm_86/sm_89/sm_120: 99 KB)
SHARED_BYTES = {80: 163 * 1024, 86: 99 * 1024, 87: 163 * 1024, 89: 99 * 1024, 90: 227 * 1024}
SHARED_BYTES_SMALLEST = min(SHARED_BYTES.values())


def shared_room(archs: Any) -> int:
    """What every arch of ``archs`` gives a block: the binaries of one config run on each."""
    return min(SHARED_BYTES.get(a, SHARED_BYTES_SMALLEST) for a in archs)


def shared_bytes(config: GemmConfig) -> int:
    """What the pipelined fp16/bf16 x and w tiles of one program take: ``num_stages - 1`` of each
    in flight, as the compiler allocated on sm_80 and sm_90 for every tile of 32..128 columns x
    128..256 of K at 3 stages (24,576 to 147,456 B)."""
    return max(config.num_stages - 1, 1) * (16 * config.block_k + config.block_k * config.block_n) * 2


def table_config(n: int, k: int, room: int = SHARED_BYTES[90]) -> GemmConfig:
    """The config for an [N, K] weight without a GPU to time it: the one measured on sm_90 where
    its tiles fit ``room`` bytes of shared memory (128 x 256 takes 147 KB: past sm_86/sm_89's
    99 KB), else the rule the measurements follow (one program per 32 columns; split over K in
    4 when that leaves fewer than two programs per SM of an H100/H200 and K has room for it)."""
    measured = MEASURED_SM90.get((n, k))
    if measured is not None and shared_bytes(measured) <= room:
        return measured
    block_k = 256 if k >= 256 else max(triton.next_power_of_2(k), 16)
    split = 4 if triton.cdiv(n, 32) < 264 and k >= 4 * block_k else 1
    return GemmConfig(block_n=32, block_k=block_k, split_k=split, dot=True)


def candidates(first: GemmConfig, k: int) -> list[GemmConfig]:
    """What a GPU times first for one [N, K] weight: ``first`` (the table's), then block sizes
    and splits over K around it (a split only where each part keeps at least one block of K)."""
    out = [first]
    for split in (1, 2, 4):
        for block_n in (32, 64, 128):
            for block_k in (128, 256):
                c = GemmConfig(block_n=block_n, block_k=block_k, split_k=split, dot=True)
                if c not in out and k >= split * block_k:
                    out.append(c)
    return out


def deeper(best: GemmConfig) -> list[GemmConfig]:
    """What a GPU times second: ``best`` of the first round with more or fewer tiles of K in
    flight (Triton's num_stages 2..5) and with 8 warps."""
    out = [replace(best, num_stages=s) for s in (2, 3, 4, 5) if s != best.num_stages]
    return out + [replace(best, num_warps=8)] if best.num_warps != 8 else out


_TUNED: dict[tuple, GemmConfig] = {}


def tune(rows: int, weight: torch.Tensor, bias: torch.Tensor | None = None,
         room: int = SHARED_BYTES[90]) -> GemmConfig:
    """The fastest of :func:`candidates`, then of the best one's :func:`deeper` variants, whose
    tiles fit ``room`` bytes of shared memory (and this GPU's) for ``F.linear`` with ``rows``
    rows and ``weight`` [N, K] on its GPU, the split-K's second launch included (timed by
    ``triton.testing``; once per (N, K, dtype, bias, GPU, room) in a process; a config the
    compiler finds out of resources is skipped). Without a GPU: the table's config."""
    n, k = weight.shape
    if not weight.is_cuda:
        return table_config(n, k, room)
    room = min(room, torch.cuda.get_device_properties(weight.device).shared_memory_per_block_optin)
    first = table_config(n, k, room)
    key = (n, k, weight.dtype, bias is not None, torch.cuda.get_device_name(weight.device), room)
    if key not in _TUNED:
        x = torch.randn(rows, k, dtype=weight.dtype, device=weight.device)
        w = weight.t()

        def timed(configs: list[GemmConfig]) -> dict[GemmConfig, float]:
            times = {}
            for c in configs:
                if shared_bytes(c) > room:
                    continue
                try:
                    times[c] = triton.testing.do_bench(lambda c=c: skinny_matmul(x, w, bias, config=c),
                                                       warmup=5, rep=20)
                except triton.runtime.errors.OutOfResources:  # registers or shared memory
                    continue
            return times

        times = timed(candidates(first, k))
        times.update(timed(deeper(min(times, key=times.get))))
        _TUNED[key] = min(times, key=times.get)
    return _TUNED[key]


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           config: GemmConfig | None = None, segments: tuple[int, ...] = (),
           residual: torch.Tensor | None = None) -> Any:
    """``F.linear(x, weight, bias)`` (``x @ weight.T + bias``) for x's rows (all dims but the
    last, flattened) <= 16, on the tensor cores with fp32 accumulation, with ``config`` (by
    default :func:`table_config`'s). With ``segments`` (see :func:`skinny_matmul`): one
    contiguous result per segment, each shaped like x with the segment's width last. With
    ``residual`` (shaped like the result, last dim contiguous): ``F.linear(...) + residual``,
    bit for bit, in one launch."""
    K, N = x.shape[-1], weight.shape[0]
    res = None if residual is None else residual.reshape(-1, N)
    y = skinny_matmul(x.reshape(-1, K), weight.t(), bias, res, config=config or table_config(N, K),
                      segments=segments)
    if not segments:
        return y.view(*x.shape[:-1], N)
    return [part.view(*x.shape[:-1], n) for part, n in zip(y, segments)]
