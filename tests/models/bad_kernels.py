"""Models that kernel_lens must refuse, each with a clear, typed error."""

import torch
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def negate_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ValueDependentGrid(torch.nn.Module):
    """The grid depends on tensor values."""

    def forward(self, x):
        out = torch.zeros_like(x)
        blocks = int((x > 0).sum().item()) // 16 + 1
        copy_kernel[(blocks,)](x, out, x.numel(), BLOCK=16)
        return out


class ValueDependentBranch(torch.nn.Module):
    """Python control flow picks the kernel from tensor values."""

    def forward(self, x):
        out = torch.empty_like(x)
        kernel = copy_kernel if x.sum() > 0 else negate_kernel
        kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
        return out


class ListArgument(torch.nn.Module):
    """A list where Triton's JIT takes tuples (its binder refuses lists)."""

    def forward(self, x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, [x.numel(), 1], BLOCK=16)
        return out


class TorchDtypeArgument(torch.nn.Module):
    """A torch.dtype where Triton's JIT takes a triton.language dtype as a constexpr."""

    def forward(self, x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, torch.float32, BLOCK=16)
        return out


class ObjectConstexpr(torch.nn.Module):
    """A constexpr whose value (a plain Python function) no deployable binary can hold."""

    def forward(self, x):
        out = torch.empty_like(x)
        copy_kernel[(1,)](x, out, x.numel(), BLOCK=lambda: 16)
        return out


class Copy(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 16),)](x, out, x.numel(), BLOCK=16)
        return out


class NoKernel(torch.nn.Module):
    def forward(self, x):
        return x * 2
