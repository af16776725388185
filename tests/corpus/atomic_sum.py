"""Reductions by atomic accumulation into zero-initialised outputs.

Covers case 16: ``column_sum_kernel`` reduces a (BLOCK_M, BLOCK_N) tile over rows and
``tl.atomic_add``s the partial column sums into ``out``; ``total_sum_kernel`` adds one partial
sum per block into a one-element tensor. Both outputs start as ``torch.zeros`` and are read and
written by the atomics, hence role ``inplace``. Float atomics make the summation order
nondeterministic on GPUs, so ``tolerance`` is not exact.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def column_sum_kernel(x_ptr, out_ptr, n_rows, n_cols, stride_row, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    tile = tl.load(x_ptr + rows[:, None] * stride_row + cols[None, :], mask=mask, other=0.0)
    tl.atomic_add(out_ptr + cols, tl.sum(tile, axis=0), mask=cols < n_cols)


@triton.jit
def total_sum_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    x = tl.load(x_ptr + offsets, mask=offsets < n_elements, other=0.0)
    tl.atomic_add(out_ptr, tl.sum(x, axis=0))


class Model(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        col_sums = torch.zeros(n_cols, device=x.device, dtype=torch.float32)
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))
        column_sum_kernel[grid](x, col_sums, n_rows, n_cols, x.stride(0), BLOCK_M=16, BLOCK_N=32)

        total = torch.zeros(1, device=x.device, dtype=torch.float32)
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        total_sum_kernel[grid](x, total, n_elements, BLOCK_SIZE=256)
        return col_sums, total


def _make_inputs(rows=50, cols=40):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g),)


def reference(x):
    return x.sum(dim=0), x.sum().reshape(1)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("rows", min=2, max=4096), 1: torch.export.Dim("cols", min=2, max=4096)}
}
expected_roles = {
    "column_sum_kernel": {"x_ptr": "input", "out_ptr": "inplace"},
    "total_sum_kernel": {"x_ptr": "input", "out_ptr": "inplace"},
}
tolerance = (1e-5, 1e-4)
