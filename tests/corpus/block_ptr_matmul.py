"""An fp32 GEMM written with block pointers.

Covers case 18: ``tl.make_block_ptr`` for A, B and C, ``tl.advance`` along K, ``tl.load`` with
``boundary_check`` and zero padding, and a boundary-checked ``tl.store`` through a block pointer.
Shapes are not multiples of the 16x16x16 tiles.

``tl.dot`` on fp32 inputs may use TF32 on GPUs, so ``tolerance`` is TF32-sized.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def block_ptr_matmul_kernel(
    a_ptr, b_ptr, c_ptr,
    M, N, K,
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    a_block = tl.make_block_ptr(
        base=a_ptr, shape=(M, K), strides=(stride_am, stride_ak),
        offsets=(pid_m * BLOCK_M, 0), block_shape=(BLOCK_M, BLOCK_K), order=(1, 0),
    )
    b_block = tl.make_block_ptr(
        base=b_ptr, shape=(K, N), strides=(stride_bk, stride_bn),
        offsets=(0, pid_n * BLOCK_N), block_shape=(BLOCK_K, BLOCK_N), order=(1, 0),
    )
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, K, BLOCK_K):
        a = tl.load(a_block, boundary_check=(0, 1), padding_option="zero")
        b = tl.load(b_block, boundary_check=(0, 1), padding_option="zero")
        acc = tl.dot(a, b, acc)
        a_block = tl.advance(a_block, (0, BLOCK_K))
        b_block = tl.advance(b_block, (BLOCK_K, 0))

    c_block = tl.make_block_ptr(
        base=c_ptr, shape=(M, N), strides=(stride_cm, stride_cn),
        offsets=(pid_m * BLOCK_M, pid_n * BLOCK_N), block_shape=(BLOCK_M, BLOCK_N), order=(1, 0),
    )
    tl.store(c_block, acc, boundary_check=(0, 1))


class Model(torch.nn.Module):
    def forward(self, a, b):
        M, K = a.shape
        N = b.shape[1]
        c = torch.empty((M, N), device=a.device, dtype=torch.float32)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
        block_ptr_matmul_kernel[grid](
            a, b, c,
            M, N, K,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            c.stride(0), c.stride(1),
            BLOCK_M=16, BLOCK_N=16, BLOCK_K=16,
        )
        return c


def _make_inputs(m=33, k=40, n=20):
    g = torch.Generator().manual_seed(0)
    return torch.randn(m, k, generator=g), torch.randn(k, n, generator=g)


def reference(a, b):
    return a @ b


model = Model()
example_inputs = _make_inputs()
_k = torch.export.Dim("k", min=2, max=4096)
dynamic_shapes = {
    "a": {0: torch.export.Dim("m", min=2, max=4096), 1: _k},
    "b": {0: _k, 1: torch.export.Dim("n", min=2, max=4096)},
}
expected_roles = {
    "block_ptr_matmul_kernel": {"a_ptr": "input", "b_ptr": "input", "c_ptr": "output"}
}
tolerance = (1e-2, 1e-2)
