"""Models that compiled silently wrong before issue 38, and the partial-write patterns it names.

Each entry of ``CASES`` is ``name -> (model, example inputs, dynamic_shapes)``. Every model is
small (a few columns), so the compiled model can be evaluated on the CPU at every size its
declared range is tried at.
"""

import torch
import triton
import triton.language as tl
from torch.export import Dim


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * s, mask=m)


@triton.jit
def head_kernel(x_ptr, out_ptr, x_row, out_row, width, BLOCK: tl.constexpr):
    """out[row, :width] = -x[row, :width] (rows strided by x_row / out_row elements)."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    m = offs < width
    x = tl.load(x_ptr + row * x_row + offs, mask=m)
    tl.store(out_ptr + row * out_row + offs, -x, mask=m)


@triton.jit
def rows_kernel(x_ptr, out_ptr, cols, step, BLOCK: tl.constexpr):
    """out[row * step, :] = x[row * step, :] + 1 for each program's row: every step-th row."""
    row = tl.program_id(0) * step
    offs = tl.arange(0, BLOCK)
    m = offs < cols
    x = tl.load(x_ptr + row * cols + offs, mask=m)
    tl.store(out_ptr + row * cols + offs, x + 1.0, mask=m)


COLS = 8
_TABLE = [1.0, 0.5, 0.25, 0.125]


class TableScale(torch.nn.Module):
    """A value computed from a size inside a piece: a table indexed by min(batch, 3)."""

    def forward(self, x):
        h = x * _TABLE[min(x.shape[0], 3)]
        out = torch.empty_like(h)
        scale_kernel[(triton.cdiv(h.numel(), 64),)](h, out, h.numel(), 2.0, BLOCK=64)
        return out


class SizeOneFastPath(torch.nn.Module):
    """A size-1 fast path."""

    def forward(self, x):
        h = x + 1
        if x.shape[0] == 1:
            h = h * 0.5
        out = torch.empty_like(h)
        scale_kernel[(triton.cdiv(h.numel(), 64),)](h, out, h.numel(), 2.0, BLOCK=64)
        return out


class SizeArithmetic(torch.nn.Module):
    """Host code computing from sizes with min, max, //, % and a threshold: torch ops and kernel
    scalars both take the values."""

    def forward(self, x):
        n = x.shape[0]
        a = min(max(n // 4, 1), 3)
        b = n % 3
        t = 2.0 if n > 40 else 0.5
        h = x * a + b
        out = torch.empty_like(h)
        scale_kernel[(triton.cdiv(h.numel(), 64),)](h, out, h.numel(), t, BLOCK=64)
        return out


class PartialRotary(torch.nn.Module):
    """A kernel writing the first ``rot`` columns of a buffer whose tail torch filled (copy_)."""

    def forward(self, x):
        rot = 4
        out = torch.empty_like(x)
        out[..., rot:].copy_(x[..., rot:])
        head_kernel[(x.shape[0],)](x, out, x.shape[1], out.shape[1], rot, BLOCK=8)
        return out


class ZerosFirstRows(torch.nn.Module):
    """torch.zeros, then a kernel writes the first half of its rows."""

    def forward(self, x):
        out = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
        half = (x.shape[0] + 1) // 2
        rows_kernel[(half,)](x, out, x.shape[1], 1, BLOCK=8)
        return out


class EveryOtherRow(torch.nn.Module):
    """A torch result written every other row in place by a kernel that never reads it."""

    def forward(self, x):
        out = x * 2
        rows_kernel[((x.shape[0] + 1) // 2,)](x, out, x.shape[1], 2, BLOCK=8)
        return out


class SliceWrite(torch.nn.Module):
    """A kernel writing through a column slice of a buffer torch filled."""

    def forward(self, x):
        out = torch.empty_like(x)
        out.fill_(3.0)
        view = out[:, 2:6]
        head_kernel[(x.shape[0],)](x, view, x.shape[1], out.shape[1], 4, BLOCK=8)
        return out


class StridedViewWrite(torch.nn.Module):
    """A kernel writing through a strided view (every other row) of a torch result."""

    def forward(self, x):
        out = x - 1
        view = out[::2]
        head_kernel[(view.shape[0],)](x[::2], view, 2 * x.shape[1], 2 * out.shape[1], 6, BLOCK=8)
        return out


class SeveralLaunchesOneBuffer(torch.nn.Module):
    """torch fills the first columns, one kernel the middle ones (through a slice), another the
    first rows' head, all into one torch.empty buffer."""

    def forward(self, x):
        out = torch.empty_like(x)
        out[:, :2].copy_(x[:, :2] * 3)
        out[:, 6:].fill_(-1.0)
        head_kernel[(x.shape[0],)](x[:, 2:], out[:, 2:], x.shape[1], out.shape[1], 4, BLOCK=8)
        half = (x.shape[0] + 1) // 2
        rows_kernel[(half,)](x, out, x.shape[1], 2, BLOCK=8)
        return out


def _x(rows: int = 4) -> tuple:
    return (torch.randn(rows, COLS, generator=torch.Generator().manual_seed(rows)),)


_BATCH = {"x": {0: Dim("batch", min=1, max=256)}}
_ROWS = {"x": {0: Dim("rows", min=1, max=64)}}

CASES = {
    "table_scale": (TableScale(), _x(4), _BATCH),
    "size_one_fast_path": (SizeOneFastPath(), _x(4), _BATCH),
    "size_arithmetic": (SizeArithmetic(), _x(8), {"x": {0: Dim("n", min=1, max=64)}}),
    "partial_rotary": (PartialRotary(), _x(4), _ROWS),
    "zeros_first_rows": (ZerosFirstRows(), _x(6), _ROWS),
    "every_other_row": (EveryOtherRow(), _x(6), _ROWS),
    "slice_write": (SliceWrite(), _x(5), _ROWS),
    "strided_view_write": (StridedViewWrite(), _x(6), {"x": {0: 2 * Dim("half", min=1, max=32)}}),
    "several_launches_one_buffer": (SeveralLaunchesOneBuffer(), _x(5), _ROWS),
}


def sizes_to_try(lo: int, hi: int) -> list[int]:
    """Every size up to 9 and the sizes around each power of two up to ``hi``, within [lo, hi]."""
    picks = set(range(lo, min(hi, 9) + 1)) | {hi}
    k = 4
    while k <= hi:
        picks |= {k - 1, k, k + 1}
        k *= 2
    return sorted(p for p in picks if lo <= p <= hi)


class Stateful(torch.nn.Module):
    """A forward whose kernel scalar changes from call to call (a counter): no size explains the
    difference, so no condition torch records does; traced again at the range's ends it differs."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), float(self.calls), BLOCK=64)
        return out


class Stateless(torch.nn.Module):
    """One kernel over the whole input, nothing branching on its size."""

    def forward(self, x):
        out = torch.empty_like(x)
        scale_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), 2.0, BLOCK=64)
        return out


# --- generated models (tests/test_never_wrong.py's differential strategy) -----------------------
SIZE_FUNCTIONS = {
    # name -> (f(n, c, table), description): a Python value the host code computes from a size
    "min": lambda n, c, t: min(n, c),
    "max": lambda n, c, t: max(n, c),
    "floordiv": lambda n, c, t: n // c,
    "mod": lambda n, c, t: n % c,
    "table": lambda n, c, t: t[min(n, len(t) - 1)],
    "threshold": lambda n, c, t: t[0] if n > c else t[1],
    "size_one": lambda n, c, t: t[0] if n == 1 else t[1],
}
BUFFERS = ("fresh", "tail_copy", "zeros_rows", "every_other", "inplace", "slice")


class Program(torch.nn.Module):
    """A small model put together from parts: host code computing a value ``v`` from the row
    count (``SIZE_FUNCTIONS[fn]``), used as a torch multiplier and/or a kernel scalar; a kernel
    writing a buffer the way ``buffer`` says (all of it, or part of one torch wrote); optionally
    a second kernel over the result."""

    def __init__(self, fn: str, c: int, table: tuple, torch_use: bool, kernel_use: bool,
                 buffer: str, second: bool) -> None:
        super().__init__()
        self.fn, self.c, self.table = fn, c, table
        self.torch_use, self.kernel_use, self.buffer, self.second = torch_use, kernel_use, buffer, second

    def __repr__(self) -> str:
        return (f"Program({self.fn!r}, c={self.c}, table={self.table}, torch_use={self.torch_use}, "
                f"kernel_use={self.kernel_use}, buffer={self.buffer!r}, second={self.second})")

    def forward(self, x):
        rows, cols = x.shape
        v = SIZE_FUNCTIONS[self.fn](rows, self.c, self.table)
        h = x * v + 1 if self.torch_use else x + 1
        s = float(v) + 0.5 if self.kernel_use else 1.5
        if self.buffer == "fresh":
            out = torch.empty_like(h)
            scale_kernel[(triton.cdiv(h.numel(), 32),)](h, out, h.numel(), s, BLOCK=32)
        elif self.buffer == "tail_copy":
            out = torch.empty_like(h)
            out[:, 3:].copy_(h[:, 3:] * s)
            head_kernel[(rows,)](h, out, cols, cols, 3, BLOCK=8)
        elif self.buffer == "zeros_rows":
            out = torch.zeros_like(h)
            rows_kernel[((rows + 1) // 2,)](h, out, cols, 1, BLOCK=8)
        elif self.buffer == "every_other":
            out = h * s
            rows_kernel[((rows + 1) // 2,)](h, out, cols, 2, BLOCK=8)
        elif self.buffer == "inplace":
            out = h.clone()
            scale_kernel[(triton.cdiv(out.numel(), 32),)](out, out, out.numel(), s, BLOCK=32)
        else:  # "slice": a kernel writing a column slice of a buffer torch filled
            out = torch.full_like(h, s)
            head_kernel[(rows,)](h, out[:, 2:6], cols, cols, 4, BLOCK=8)
        if self.second:
            final = torch.empty_like(out)
            scale_kernel[(triton.cdiv(out.numel(), 32),)](out, final, out.numel(), -1.0, BLOCK=32)
            return final
        return out


@triton.jit
def dot_kernel(a_ptr, b_ptr, c_ptr, K: tl.constexpr, N: tl.constexpr, BLOCK_M: tl.constexpr):
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn, rk = tl.arange(0, N), tl.arange(0, K)
    a = tl.load(a_ptr + rm[:, None] * K + rk[None, :])
    b = tl.load(b_ptr + rk[:, None] * N + rn[None, :])
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], tl.dot(a, b))


class Bf16Dot(torch.nn.Module):
    """bf16 ``tl.dot``: Triton 3.6's interpreter multiplies the operands' bit patterns unless
    kernel_lens widens them (frontends/capture/interpreter_casts.py)."""

    def forward(self, a, b):
        c = torch.empty(a.shape[0], b.shape[1], dtype=torch.float32, device=a.device)
        dot_kernel[(a.shape[0] // 16,)](a, b, c, K=16, N=16, BLOCK_M=16)
        return c


class SiblingMatMuls(torch.nn.Module):
    """Two products of one activation by constant weights (q/k-like: fuse_sibling_matmuls'
    pattern), a size-1 path, and a kernel: a model split by size whose pieces each have siblings."""

    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.wa = torch.nn.Parameter(torch.randn(COLS, COLS, generator=g), requires_grad=False)
        self.wb = torch.nn.Parameter(torch.randn(COLS, COLS, generator=g), requires_grad=False)

    def forward(self, x):
        h = (x @ self.wa) * (x @ self.wb)
        if x.shape[0] == 1:
            h = h + 1
        out = torch.empty_like(h)
        scale_kernel[(triton.cdiv(h.numel(), 64),)](h, out, h.numel(), 2.0, BLOCK=64)
        return out


@triton.jit
def second_of_pair_kernel(x_ptr, ptrs, n, BLOCK: tl.constexpr):
    """Writes x * 2 into the second tensor of the pair ``ptrs`` only."""
    _, out_ptr = ptrs
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


class TupleWrite(torch.nn.Module):
    """A tuple of two torch.zeros buffers; the kernel writes the second: the first stays zero."""

    def forward(self, x):
        a, b = torch.zeros_like(x), torch.zeros_like(x)
        second_of_pair_kernel[(triton.cdiv(x.numel(), 64),)](x, (a, b), x.numel(), BLOCK=64)
        return a, b


class HalfWritten(torch.nn.Module):
    """A kernel writes the first half of a torch.empty buffer; the whole buffer is returned."""

    def forward(self, x):
        out = torch.empty_like(x)
        half = x.shape[0] // 2
        rows_kernel[(half,)](x, out, x.shape[1], 1, BLOCK=8)
        return out
