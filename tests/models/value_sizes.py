"""Models whose host code reads tensor VALUES (issue 40): a nonzero() count as a grid and a
size, an .item() as a size, an .item() branch choosing what the kernel writes, int() of a tensor."""

import operator

import torch
import triton
import triton.language as tl


@triton.jit
def gather_scale(x_ptr, idx_ptr, out_ptr, D: tl.constexpr):
    r = tl.program_id(0)
    row = tl.load(idx_ptr + r)
    cols = tl.arange(0, D)
    tl.store(out_ptr + r * D + cols, tl.load(x_ptr + row * D + cols) * 2.0)


@triton.jit
def ramp(src_ptr, out_ptr, n, v, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    base = tl.load(src_ptr).to(tl.float32)
    tl.store(out_ptr + o, v + base + o.to(tl.float32), mask=o < n)


class NonzeroRows(torch.nn.Module):
    """Rows selected by a mask, doubled: the count sets the grid and the output's rows."""

    def forward(self, x, mask):
        idx = mask.nonzero().squeeze(1)
        n = idx.shape[0]
        out = torch.empty((n, x.shape[1]), dtype=x.dtype, device=x.device)
        if n > 0:  # BRANCH-NONZERO
            gather_scale[(n,)](x, idx, out, D=x.shape[1])
        return out


class ItemSize(torch.nn.Module):
    """A size from .item(): the output has sum(lengths) elements."""

    def forward(self, lengths):
        total = lengths.sum().item()
        out = torch.empty(total, device=lengths.device)
        ramp[(triton.cdiv(total, 64),)](lengths, out, total, 3.0, BLOCK=64)
        return out


class ItemBranch(torch.nn.Module):
    """A branch on a value chooses the constant the kernel adds."""

    def forward(self, x, mask):
        out = torch.empty_like(x)
        n = x.numel()
        if not torch.any(mask).item():  # BRANCH-ANY
            ramp[(triton.cdiv(n, 64),)](x, out, n, 1.0, BLOCK=64)
        else:
            ramp[(triton.cdiv(n, 64),)](x, out, n, 5.0, BLOCK=64)
        return out


class IntSize(torch.nn.Module):
    """int() of an integer tensor, and int() of an .item(): sizes that follow the values."""

    def forward(self, lengths):
        total = int(lengths.sum())  # INT-SIZE
        out = torch.empty(total, device=lengths.device)
        ramp[(triton.cdiv(int(lengths.max().item()) + total, 64),)](lengths, out, total, 3.0, BLOCK=64)
        return out


class IndexSize(torch.nn.Module):
    """A tensor as an index (``operator.index``): Python makes it a constant of the trace
    (pinned, checked)."""

    def forward(self, lengths):
        total = operator.index(lengths.sum())  # PINNED
        out = torch.empty(total, device=lengths.device)
        ramp[(triton.cdiv(total, 64),)](lengths, out, total, 3.0, BLOCK=64)
        return out


@triton.jit
def add_in_place(x_ptr, n, v, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + o, tl.load(x_ptr + o, mask=o < n) + v, mask=o < n)


class TwoBranches(torch.nn.Module):
    """Two independent branches on values: four paths, each adding other constants."""

    def forward(self, x, a, b):
        out = torch.empty_like(x)
        n = x.numel()
        v = 1.0
        if a.any().item():  # BRANCH-A
            v = 2.0
        w = 10.0
        if b.any().item():  # BRANCH-B
            w = 20.0
        ramp[(triton.cdiv(n, 64),)](x, out, n, v + w, BLOCK=64)
        return out


class WritesInputInOneBranch(torch.nn.Module):
    """A kernel writes its input in place on one branch only; both return a fresh result."""

    def forward(self, x, flag):
        n = x.numel()
        if flag.any().item():  # BRANCH-WRITE
            add_in_place[(triton.cdiv(n, 64),)](x, n, 4.0, BLOCK=64)
        out = torch.empty_like(x)
        ramp[(triton.cdiv(n, 64),)](x, out, n, 0.5, BLOCK=64)
        return out


COMPILER_CALLS = []


def _refusing_backend(gm, inputs):
    """A torch.compile backend that records being asked: kernel_lens must never ask it."""
    COMPILER_CALLS.append(gm)
    raise RuntimeError("torch.compile compiled a helper during kernel_lens's capture or trace")


@torch.compile(backend=_refusing_backend)
def compiled_helper(x):
    out = torch.empty_like(x)
    n = x.numel()
    ramp[(triton.cdiv(n, 64),)](x, out, n, 1.5, BLOCK=64)
    return out * 2


class CompiledHelper(torch.nn.Module):
    """Library code that wraps its Triton launch in a @torch.compile'd helper."""

    def forward(self, x):
        return compiled_helper(x) + 1


class CountEqualsTotal(torch.nn.Module):
    """The issue's `valids.numel() != total`: a count compared with a size picks the path."""

    def forward(self, x, keep):
        valids = x[keep]
        out = torch.empty_like(x)
        n = x.numel()
        if valids.numel() != n:  # BRANCH-COUNT
            ramp[(triton.cdiv(n, 64),)](x, out, n, 7.0, BLOCK=64)
        else:
            ramp[(triton.cdiv(n, 64),)](x, out, n, -7.0, BLOCK=64)
        return out


class CheckedCount(torch.nn.Module):
    """torch._check equates a count with a size: a run-time assert, never an assumption."""

    def forward(self, x, keep):
        valids = x[keep]
        torch._check(valids.shape[0] == x.shape[0])  # CHECKED-COUNT
        out = torch.empty_like(valids)
        n = valids.numel()
        ramp[(triton.cdiv(n, 64),)](valids, out, n, 1.0, BLOCK=64)
        return out


@triton.jit
def add_scalar(x_ptr, out_ptr, n, k, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + o, tl.load(x_ptr + o, mask=o < n) + k, mask=o < n)


class ItemScalar(torch.nn.Module):
    """An .item() only a kernel's scalar reads (nothing else uses it)."""

    def forward(self, x, counts):
        out = torch.empty_like(x)
        n = x.numel()
        add_scalar[(triton.cdiv(n, 64),)](x, out, n, counts.sum().item(), BLOCK=64)
        return out


class MaskedSelect(torch.nn.Module):
    """torch.masked_select with a broadcast mask, then a kernel over what it selected."""

    def forward(self, x, keep):
        picked = torch.masked_select(x, keep > 1)
        out = torch.empty_like(picked)
        n = picked.numel()
        add_scalar[(triton.cdiv(n, 64),)](picked, out, n, 2, BLOCK=64)
        return out


class NonzeroAsTuple(torch.nn.Module):
    """torch.nonzero(as_tuple=True): torch decomposes it, and the decomposition makes sizes of
    its own, which are the forward's count."""

    def forward(self, x, keep):
        (idx,) = torch.nonzero(keep > 1, as_tuple=True)
        picked = x[idx]
        out = torch.empty_like(picked)
        n = picked.numel()
        add_scalar[(triton.cdiv(n, 64),)](picked, out, n, 2, BLOCK=64)
        return out


class RepeatInterleave(torch.nn.Module):
    """repeat_interleave by a tensor of counts: the length is their sum."""

    def forward(self, x, counts):
        stretched = torch.repeat_interleave(x, counts)
        out = torch.empty_like(stretched)
        n = stretched.numel()
        add_scalar[(triton.cdiv(n, 64),)](stretched, out, n, 1, BLOCK=64)
        return out


class HalfOnOneBranch(torch.nn.Module):
    """One branch returns float16, the other float32: no one compiled output dtype."""

    def forward(self, x, flag):
        out = torch.empty_like(x)
        n = x.numel()
        ramp[(triton.cdiv(n, 64),)](x, out, n, 1.0, BLOCK=64)
        if flag.any().item():  # BRANCH-HALF
            return out.half()
        return out


class NegativeItem(torch.nn.Module):
    """A branch on an .item() that may be negative."""

    def forward(self, x, t):
        out = torch.empty_like(x)
        n = x.numel()
        v = 1.0
        if t.max().item() >= 2:  # BRANCH-NEG
            v = 2.0
        ramp[(triton.cdiv(n, 64),)](x, out, n, v, BLOCK=64)
        return out


class IntAsDtype(torch.nn.Module):
    """A module that reads a value with int() and also uses ``int`` as a dtype."""

    def forward(self, lengths):
        total = int(lengths.sum())  # INT-DTYPE
        steps = torch.arange(3, dtype=int, device=lengths.device)
        out = torch.empty(total, device=lengths.device)
        ramp[(triton.cdiv(total, 64),)](lengths, out, total, 3.0, BLOCK=64)
        return out, steps


class ColumnsKept(torch.nn.Module):
    """A boolean index on dim 1: the count is the result's dim 1."""

    def forward(self, x, keep):
        kept = x[:, keep > 1]
        picked = kept.sum(0)
        out = torch.empty(kept.shape[1], device=x.device)  # the graph computes the count here
        n = picked.numel()
        add_scalar[(triton.cdiv(n, 64),)](picked, out, n, 2, BLOCK=64)
        return out


class ToList(torch.nn.Module):
    """Chunk indices from ``.tolist()`` (as varlen library code makes them): one arange per
    length, their total the kernel's size."""

    def forward(self, x, lengths):
        idx = torch.cat([torch.arange(n, device=x.device) for n in lengths.tolist()])  # TOLIST
        total = idx.shape[0]
        out = torch.empty(total, device=x.device)
        ramp[(triton.cdiv(total, 64),)](x, out, total, 3.0, BLOCK=64)
        return out + idx


class Equal(torch.nn.Module):
    """``torch.equal`` chooses the constant the kernel adds."""

    def forward(self, x, a, b):
        out = torch.empty_like(x)
        n = x.numel()
        if torch.equal(a, b):  # BRANCH-EQUAL
            ramp[(triton.cdiv(n, 64),)](x, out, n, 1.0, BLOCK=64)
        else:
            ramp[(triton.cdiv(n, 64),)](x, out, n, 2.0, BLOCK=64)
        return out


@triton.jit
def segment_sums(x_ptr, cu_ptr, out_ptr, BLOCK: tl.constexpr):
    i = tl.program_id(0)
    bos = tl.load(cu_ptr + i)
    eos = tl.load(cu_ptr + i + 1)
    o = tl.arange(0, BLOCK)
    tl.store(out_ptr + i, tl.sum(tl.load(x_ptr + bos + o, mask=o < eos - bos, other=0.0)))


class LongestSegmentBlock(torch.nn.Module):
    """Varlen library style: the block size is the longest segment's, rounded up to a power
    of two (a constexpr computed from a tensor value)."""

    def forward(self, x, cu):
        max_len = (cu[1:] - cu[:-1]).max().item()
        out = torch.empty(cu.shape[0] - 1, device=x.device)
        segment_sums[(cu.shape[0] - 1,)](x, cu, out, BLOCK=triton.next_power_of_2(max_len))  # BLOCK-FROM-VALUE
        return out


class SegmentSums(torch.nn.Module):
    """Per-segment sums over slices whose bounds come from ``.tolist()`` (torch names the slice
    lengths and offsets with new sizes), then a kernel."""

    def forward(self, x, cu):
        bounds = cu.tolist()
        sums = torch.stack([x[a:b].sum() for a, b in zip(bounds[:-1], bounds[1:])])
        out = torch.empty_like(sums)
        ramp[(1,)](sums, out, sums.numel(), 0.0, BLOCK=16)
        return out + sums


class SegmentLaunches(torch.nn.Module):
    """One launch per segment on a slice whose bounds come from ``.tolist()``."""

    def forward(self, x, cu):
        out = torch.zeros_like(x)
        bounds = cu.tolist()
        for a, b in zip(bounds[:-1], bounds[1:]):
            ramp[(triton.cdiv(b - a, 16),)](x[a:b], out[a:b], b - a, 1.0, BLOCK=16)  # SLICE-LAUNCH
        return out


class TiledSum(torch.nn.Module):
    """``x`` tiled twice plus ``y`` (``y``'s length is twice ``x``'s), then a kernel."""

    def forward(self, x, y):
        z = x.repeat(2) + y
        out = torch.empty_like(z)
        ramp[(triton.cdiv(z.numel(), 64),)](z, out, z.numel(), 1.0, BLOCK=64)
        return out


@triton.jit
def copy_block(x_ptr, y_ptr, n, BD: tl.constexpr):
    o = tl.program_id(0) * BD + tl.arange(0, BD)
    tl.store(y_ptr + o, tl.load(x_ptr + o, mask=o < n), mask=o < n)


class RowBlock(torch.nn.Module):
    """A block size computed from sizes that is the same for every size (the row width)."""

    def forward(self, x):
        b, s = x.shape[:2]
        y = torch.empty_like(x)
        copy_block[(b * s,)](x, y, x.numel(), BD=triton.next_power_of_2(x.numel() // (b * s)))
        return y


@triton.jit
def shift_or_copy(x_ptr, y_ptr, n, IS_ONE: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + o, mask=o < n, other=0.0)
    if IS_ONE:
        v = v * 2.0
    else:
        v = v + 1.0
    tl.store(y_ptr + o, v, mask=o < n)


class DecodeFlag(torch.nn.Module):
    """fla token-shift style: a constexpr truth value computed from a value (one-token
    segments take another path inside the kernel)."""

    def forward(self, x, cu):
        longest = (cu[1:] - cu[:-1]).max().item()
        y = torch.empty_like(x)
        shift_or_copy[(1,)](x, y, x.shape[0], IS_ONE=longest == 1, BLOCK=64)  # FLAG-FROM-VALUE
        return y


class SegmentIds(torch.nn.Module):
    """fla's prepare_chunk_indices style: the segment id of every position, from int32 lengths
    (``repeat_interleave`` of the counts alone, in their dtype), added to x's rows by a kernel."""

    def forward(self, x, lengths):
        ids = torch.repeat_interleave(lengths)
        picked = x[ids].contiguous()
        out = torch.empty_like(picked)
        n = picked.numel()
        add_scalar[(triton.cdiv(n, 64),)](picked, out, n, 2, BLOCK=64)
        return out, ids


class PaddedBuffer(torch.nn.Module):
    """A buffer sized by a value (torch's strides read ``Max(1, u0)``) filled by a kernel."""

    def forward(self, x, count):
        m = count.max().item()
        out = torch.zeros(2, m, 4, device=x.device)
        ramp[(triton.cdiv(out.numel(), 64),)](x, out, out.numel(), 0.5, BLOCK=64)
        return out


class TileTable(torch.nn.Module):
    """liger fused-MoE style: a [4, cdiv(n, 512)] table filled by a kernel; at n <= 512 it is one
    column, and torch gives it strides (1, 1)."""

    def forward(self, x):
        table = torch.empty(4, triton.cdiv(x.shape[0], 512), device=x.device)
        ramp[(triton.cdiv(table.numel(), 64),)](x, table, table.numel(), 0.25, BLOCK=64)
        return table
