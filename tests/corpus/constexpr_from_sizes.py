"""Constexprs computed from a dynamic size in the host code, as libraries do: ``NB =
triton.cdiv(n, 65536)`` is constant (1) over the declared range, proven by interval evaluation;
``BLOCK = min(triton.next_power_of_2(n), 64)`` takes six values (2 ... 64), so the kernel gets
one binary per value and the launch code picks it from ``n`` at run time. The grid
``cdiv(n, BLOCK)`` uses the same size function, written exactly as a step function of ``n``."""

import torch
import triton
import triton.language as tl


@triton.jit
def blocked_scale_kernel(x_ptr, out_ptr, n, NB: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * (NB + 1) + BLOCK, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.shape[0]
        nb = triton.cdiv(n, 65536)
        block = min(triton.next_power_of_2(n), 64)
        blocked_scale_kernel[(triton.cdiv(n, block),)](x, out, n, NB=nb, BLOCK=block)
        return out


def _make_inputs(n=100):
    return (torch.randn(n, generator=torch.Generator().manual_seed(0)),)


def reference(x):
    n = x.shape[0]
    return x * 2 + min(triton.next_power_of_2(n), 64)


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=60000)
dynamic_shapes = {"x": {0: _n}}
expected_roles = {"blocked_scale_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-6, 1e-6)
