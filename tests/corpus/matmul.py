"""A ``tl.dot`` GEMM: fp16 inputs, fp32 accumulation, fp16 output.

Covers case 11: C = A @ B with 16x16x16 tiles on a 2-D grid; M, N and K are not multiples of
the block sizes, so every load and the store are masked (K included).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs, mask=(offs_m[:, None] < M) & (offs_k[None, :] < K - k), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < K - k) & (offs_n[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


class Model(torch.nn.Module):
    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=a.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
        matmul_kernel[grid](
            a, b, c,
            M, N, K,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
        )
        return c


def _make_inputs(m=37, k=50, n=29):
    g = torch.Generator().manual_seed(0)
    return torch.randn(m, k, generator=g).half(), torch.randn(k, n, generator=g).half()


def reference(a, b):
    return (a.float() @ b.float()).half()


model = Model()
example_inputs = _make_inputs()
_k = torch.export.Dim("k", min=2, max=4096)
dynamic_shapes = {
    "a": {0: torch.export.Dim("m", min=2, max=4096), 1: _k},
    "b": {0: _k, 1: torch.export.Dim("n", min=2, max=4096)},
}
expected_roles = {"matmul_kernel": {"a_ptr": "input", "b_ptr": "input", "c_ptr": "output"}}
tolerance = (1e-2, 1e-2)
