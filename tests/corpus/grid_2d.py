"""A tiled matrix transpose on a 2-D grid.

Covers case 10 (2-D grid, given as a tuple): program (i, j) copies tile (i, j) of ``x`` to tile
(j, i) of the output.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def transpose_kernel(
    x_ptr, out_ptr, M, N,
    stride_xm, stride_xn, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    tile = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :] * stride_xn, mask=mask)
    tl.store(out_ptr + cols[None, :] * stride_om + rows[:, None] * stride_on, tile, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        M, N = x.shape
        out = torch.empty((N, M), device=x.device, dtype=x.dtype)
        block_m, block_n = 16, 32
        grid = (triton.cdiv(M, block_m), triton.cdiv(N, block_n))
        transpose_kernel[grid](
            x, out, M, N,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            BLOCK_M=block_m, BLOCK_N=block_n,
        )
        return out


def _make_inputs(m=40, n=50):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, n, generator=g),)


def reference(x):
    return x.t().contiguous()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("m", min=2, max=4096), 1: torch.export.Dim("n", min=2, max=4096)}
}
expected_roles = {"transpose_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
