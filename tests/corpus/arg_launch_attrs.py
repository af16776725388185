"""Triton's launch options that change how a kernel is launched, not what it computes:
``launch_pdl=True`` (programmatic dependent launch: the launch may begin before the one before it
on the stream has finished; the kernel's ``gdc_wait()`` waits for that one's writes) with
``gdc_launch_dependents()``, and ``launch_cooperative_grid=True`` (every program resident at
once). The second PDL launch reads what the cooperative launch just wrote: without its wait,
or launched without the attribute's ordering, it would read stale values on a GPU."""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait


@triton.jit
def affine_kernel(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # nothing read before the wait
    gdc_wait()
    x = tl.load(x_ptr + offs, mask=offs < n)
    gdc_launch_dependents()
    tl.store(out_ptr + offs, x * scale + shift, mask=offs < n)


@triton.jit
def mul_kernel(a_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    a = tl.load(a_ptr + offs, mask=offs < n)
    b = tl.load(b_ptr + offs, mask=offs < n)
    tl.store(out_ptr + offs, a * b, mask=offs < n)


class Model(torch.nn.Module):
    def forward(self, x):
        n = x.numel()
        grid = (triton.cdiv(n, 128),)
        y, z, w = torch.empty_like(x), torch.empty_like(x), torch.empty_like(x)
        affine_kernel[grid](x, y, n, 2.0, 1.0, BLOCK=128, launch_pdl=True)
        mul_kernel[grid](y, x, z, n, BLOCK=128, launch_cooperative_grid=True)
        affine_kernel[grid](z, w, n, 0.5, -3.0, BLOCK=128, launch_pdl=True)
        return y, w


def _make_inputs(n=1000):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g),)


def reference(x):
    y = x * 2.0 + 1.0
    return y, (y * x) * 0.5 - 3.0


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=1 << 16)}}
expected_roles = {"affine_kernel": {"x_ptr": "input", "out_ptr": "output"},
                  "mul_kernel": {"a_ptr": "input", "b_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-6, 1e-6)
