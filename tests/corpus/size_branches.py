"""Python code that branches on sizes inside the declared range, as library wrappers do: a
special case for one size (``m == 48`` picks another block size, as FlagGems' mm does), a
single-block fast path (``cdiv(n, 64) == 1`` launches one kernel, else a two-pass reduction
with a torch op between), and an int argument that is 1 at the range's low end (Triton's binder
folds it, so the trace branches there too). kernel_lens splits the range into pieces, one graph
each, dispatched by size at run time."""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_rows_kernel(x_ptr, out_ptr, cols, scale, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    for start in range(0, cols, BLOCK):
        mask = start + offs < cols
        x = tl.load(x_ptr + row * cols + start + offs, mask=mask)
        tl.store(out_ptr + row * cols + start + offs, x * scale, mask=mask)


@triton.jit
def block_sums_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + pid, tl.sum(tl.load(x_ptr + offs, mask=offs < n, other=0.0), axis=0))


@triton.jit
def stride_copy_kernel(x_ptr, out_ptr, n, step, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * step, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, v):
        rows, cols = x.shape
        y = torch.empty_like(x)
        block = 16 if rows == 48 else 32  # a special case for one size
        scale_rows_kernel[(rows,)](x, y, cols, 2.0, BLOCK=block)
        n = v.shape[0]
        blocks = triton.cdiv(n, 64)
        if blocks == 1:  # a single-block fast path
            total = torch.empty(1, dtype=v.dtype, device=v.device)
            block_sums_kernel[(1,)](v, total, n, BLOCK=64)
        else:
            partial = torch.empty(blocks, dtype=v.dtype, device=v.device)
            block_sums_kernel[(blocks,)](v, partial, n, BLOCK=64)
            total = partial.sum(0, keepdim=True)
        w = torch.empty_like(v)
        stride_copy_kernel[(triton.cdiv(n, 64),)](v, w, n, n - 1, BLOCK=64)  # n - 1 == 1 at n = 2
        return y, total, w


def _make_inputs(rows=40, cols=24, n=100):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(n, generator=g)


def reference(x, v):
    return 2.0 * x, v.sum(0, keepdim=True), v * (v.shape[0] - 1)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=2, max=1024)},
                  "v": {0: torch.export.Dim("n", min=2, max=4096)}}
expected_roles = {"scale_rows_kernel": {"x_ptr": "input", "out_ptr": "output"},
                  "block_sums_kernel": {"x_ptr": "input", "out_ptr": "output"},
                  "stride_copy_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-5, 1e-5)
