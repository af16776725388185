"""Skinny GEMM ``y = x @ w (+ bias) (+ residual)`` for a few rows (M <= 16): the weight is
streamed once, each program owning ``BLOCK_N`` columns for every row; fp32 accumulation.
With ``SPLIT_K > 1`` each program also owns a slice of K and writes an fp32 partial, and a
second kernel adds the partials in a fixed order (bit-stable run to run: no atomics)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch
import triton
import triton.language as tl

MAX_ROWS = 16


@dataclass(frozen=True)
class GemmConfig:
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    dot: bool = False  # rows padded to 16 and multiplied on the tensor cores (tl.dot)


@triton.jit
def _skinny_gemm(x_ptr, w_ptr, bias_ptr, res_ptr, y_ptr, part_ptr, M, N, K,
                 stride_xm, stride_xk, stride_wk, stride_wn, stride_rm, stride_ym,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
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
            acc += tl.load(res_ptr + rm[:, None] * stride_rm + rn[None, :], mask=keep, other=0.0).to(tl.float32)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty), mask=keep)
    else:
        tl.store(part_ptr + pid_k * M * N + rm[:, None] * N + rn[None, :], acc, mask=keep)


@triton.jit
def _add_partials(part_ptr, bias_ptr, res_ptr, y_ptr, M, N, stride_rm, stride_ym,
                  HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, SPLIT_K: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs // N
    n = offs % N
    keep = offs < M * N
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(SPLIT_K):  # a fixed order: the same bits every run
        acc += tl.load(part_ptr + s * M * N + offs, mask=keep, other=0.0)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=keep, other=0.0).to(tl.float32)
    if HAS_RES:
        acc += tl.load(res_ptr + m * stride_rm + n, mask=keep, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + n, acc.to(y_ptr.dtype.element_ty), mask=keep)


def skinny_matmul(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None,
                  residual: torch.Tensor | None = None, config: GemmConfig = GemmConfig()) -> torch.Tensor:
    """``x @ w (+ bias) (+ residual)`` for ``x`` [M, K] with M <= 16 and ``w`` [K, N] (any
    strides: a transposed ``nn.Linear`` weight is ``weight.t()``); the result has ``x``'s dtype."""
    M, K = x.shape
    K2, N = w.shape
    if K2 != K or not 1 <= M <= MAX_ROWS:
        raise ValueError(f"skinny_matmul takes x [M <= {MAX_ROWS}, K] and w [K, N]; got {tuple(x.shape)} "
                         f"and {tuple(w.shape)}")
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    block_m = 16 if config.dot else max(triton.next_power_of_2(M), 2)
    has_bias, has_res = bias is not None, residual is not None
    res = residual if has_res else y
    split = config.split_k
    part = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    grid = (triton.cdiv(N, config.block_n), split)
    _skinny_gemm[grid](x, w, bias if has_bias else y, res, y, part, M, N, K,
                       x.stride(0), x.stride(1), w.stride(0), w.stride(1), res.stride(0), y.stride(0),
                       HAS_BIAS=has_bias, HAS_RES=has_res, BLOCK_M=block_m, BLOCK_N=config.block_n,
                       BLOCK_K=config.block_k, SPLIT_K=split, num_warps=config.num_warps)
    if split > 1:
        _add_partials[(triton.cdiv(M * N, 1024),)](part, bias if has_bias else y, res, y, M, N,
                                                  res.stride(0), y.stride(0), HAS_BIAS=has_bias,
                                                  HAS_RES=has_res, SPLIT_K=split, BLOCK=1024)
    return y


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


def table_config(n: int, k: int) -> GemmConfig:
    """The config for an [N, K] weight without a GPU to time it: the measured one, else the rule
    the measurements follow (one program per 32 columns; split over K in 4 when that leaves
    fewer than two programs per SM of an H100/H200 and K has room for it)."""
    if (n, k) in MEASURED_SM90:
        return MEASURED_SM90[(n, k)]
    block_k = 256 if k >= 256 else max(triton.next_power_of_2(k), 16)
    split = 4 if triton.cdiv(n, 32) < 264 and k >= 4 * block_k else 1
    return GemmConfig(block_n=32, block_k=block_k, split_k=split, dot=True)


def candidates(first: GemmConfig) -> list[GemmConfig]:
    """What a GPU times for one weight: ``first`` (the table's), then the block sizes around it
    (the split stays: it sizes the partial buffer and the second launch)."""
    out = [first]
    for block_n in (32, 64, 128):
        for block_k in (128, 256):
            c = GemmConfig(block_n=block_n, block_k=block_k, split_k=first.split_k, dot=True)
            if c not in out and block_k <= max(first.block_k, 128):
                out.append(c)
    return out


@functools.lru_cache(maxsize=None)
def _tuner(first: GemmConfig) -> Any:
    configs = [triton.Config({"BLOCK_N": c.block_n, "BLOCK_K": c.block_k}, num_warps=c.num_warps)
               for c in candidates(first)]
    return triton.autotune(configs=configs, key=["N", "K"])(_skinny_gemm)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` (``x @ weight.T + bias``) for x's rows (all dims but the
    last, flattened) <= 16, on the tensor cores with fp32 accumulation. On a GPU the block sizes
    are autotuned per (N, K, dtype) from :func:`table_config`'s; elsewhere the table's are used."""
    K, N = x.shape[-1], weight.shape[0]
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    first = table_config(N, K)
    split = first.split_k
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    part = torch.empty((split, M, N), dtype=torch.float32, device=x.device) if split > 1 else y
    w = weight.t()
    has_bias = bias is not None
    b = bias if has_bias else y
    args = (rows, w, b, y, y, part, M, N, K, rows.stride(0), rows.stride(1), w.stride(0), w.stride(1),
            y.stride(0), y.stride(0))
    flags = dict(HAS_BIAS=has_bias, HAS_RES=False, BLOCK_M=16, SPLIT_K=split)
    if x.is_cuda:
        _tuner(first)[lambda meta: (triton.cdiv(N, meta["BLOCK_N"]), split)](*args, **flags)
    else:
        _skinny_gemm[(triton.cdiv(N, first.block_n), split)](
            *args, **flags, BLOCK_N=first.block_n, BLOCK_K=first.block_k, num_warps=first.num_warps)
    if split > 1:
        _add_partials[(triton.cdiv(M * N, 1024),)](part, b, y, y, M, N, y.stride(0), y.stride(0),
                                                  HAS_BIAS=has_bias, HAS_RES=False, SPLIT_K=split,
                                                  BLOCK=1024)
    return y.view(*x.shape[:-1], N)
