"""Non-contiguous inputs addressed through explicit strides.

Covers case 9 (and a 2-D grid): the kernel adds a transposed view ``x.t()`` and a step slice
``y[:, ::2]``; neither is contiguous, and their strides are passed as scalar arguments.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_strided_kernel(
    a_ptr, b_ptr, out_ptr,
    M, N,
    stride_am, stride_an,
    stride_bm, stride_bn,
    stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    a = tl.load(a_ptr + rows[:, None] * stride_am + cols[None, :] * stride_an, mask=mask)
    b = tl.load(b_ptr + rows[:, None] * stride_bm + cols[None, :] * stride_bn, mask=mask)
    tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :] * stride_on, a + b, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, y):
        a = x.t()  # (M, N), strides (1, M)
        b = y[:, ::2]  # (M, N), strides (2N, 2)
        M, N = a.shape
        out = torch.empty((M, N), device=x.device, dtype=x.dtype)
        grid = lambda meta: (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))
        add_strided_kernel[grid](
            a, b, out,
            M, N,
            a.stride(0), a.stride(1),
            b.stride(0), b.stride(1),
            out.stride(0), out.stride(1),
            BLOCK_M=16, BLOCK_N=16,
        )
        return out


def _make_inputs(m=20, n=24):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, m, generator=g), torch.randn(m, 2 * n, generator=g)


def reference(x, y):
    return x.t() + y[:, ::2]


model = Model()
example_inputs = _make_inputs()
_m = torch.export.Dim("m", min=2, max=4096)
_n = torch.export.Dim("n", min=2, max=4096)
dynamic_shapes = {"x": {0: _n, 1: _m}, "y": {0: _m, 1: 2 * _n}}
expected_roles = {"add_strided_kernel": {"a_ptr": "input", "b_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
