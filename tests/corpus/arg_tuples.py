"""Tuple arguments, as Triton >= 3.2 takes them: a tuple of tensors, a nested tuple of strides
(dynamic), a tuple of sizes, and a tuple mixing a float, ``None`` and a constexpr; a named tuple
of strides read by field name; an empty tuple. Elements are specialized as Triton's JIT does (a
stride of 1 is folded, others are checked for divisibility by 16)."""

from collections import namedtuple

import torch
import triton
import triton.language as tl

Strides = namedtuple("Strides", ["row", "col"])


@triton.jit
def tuple_axpy_kernel(ptrs, strides, shape, extra, out_strides, nothing, BLOCK: tl.constexpr):
    x_ptr, y_ptr, out_ptr = ptrs
    rows, cols = shape
    alpha, unused, SHIFT = extra
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < cols
    x = tl.load(x_ptr + row * strides[0][0] + offs * strides[0][1], mask=mask)
    y = tl.load(y_ptr + row * strides[1][0] + offs * strides[1][1], mask=mask)
    out = alpha * x + y + SHIFT
    for i in tl.static_range(len(nothing)):
        out += 1.0
    tl.store(out_ptr + row * out_strides.row + offs * out_strides.col, out, mask=mask & (row < rows))


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        yt = y.t()  # a transposed view: strides (1, rows)
        rows, cols = x.shape
        grid = (rows, triton.cdiv(cols, 32))
        tuple_axpy_kernel[grid]((x, yt, out), ((x.stride(0), x.stride(1)), (yt.stride(0), yt.stride(1))),
                                (rows, cols), (0.5, None, tl.constexpr(2.0)),
                                Strides(out.stride(0), out.stride(1)), (), BLOCK=32)
        return out


def _make_inputs(rows=5, cols=40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(cols, rows, generator=g)


def reference(x, y):
    return 0.5 * x + y.t() + 2.0


model = Model()
example_inputs = _make_inputs()
_rows, _cols = torch.export.Dim("rows", min=2, max=1024), torch.export.Dim("cols", min=2, max=4096)
dynamic_shapes = {"x": {0: _rows, 1: _cols}, "y": {0: _cols, 1: _rows}}
expected_roles = {"tuple_axpy_kernel": {"ptrs_0": "input", "ptrs_1": "input", "ptrs_2": "output"}}
tolerance = (1e-6, 1e-6)
