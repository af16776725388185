"""PyTorch's opaque-op pattern: ``torch.library.custom_op`` (with ``register_fake``) whose body
launches a Triton kernel with a plain ``kernel[grid](...)`` (row-wise ``x - max(x)``)."""

import torch
import triton
import triton.language as tl

library = "torch"  # torch.library, torch >= 2.4
library_module = "torch"
library_env = {}


@triton.jit
def sub_rowmax_kernel(x_ptr, out_ptr, D, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_D)
    mask = offs < D
    x = tl.load(x_ptr + row * D + offs, mask=mask, other=-float("inf"))
    tl.store(out_ptr + row * D + offs, x - tl.max(x, 0), mask=mask)


@torch.library.custom_op("kl_conformance::sub_rowmax", mutates_args=())
def sub_rowmax(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    out = torch.empty_like(x)
    D = x.shape[-1]
    sub_rowmax_kernel[(x.numel() // D,)](x, out, D, BLOCK_D=triton.next_power_of_2(D))
    return out


@sub_rowmax.register_fake
def _(x):
    return torch.empty_like(x)


class Model(torch.nn.Module):
    def forward(self, x):
        return sub_rowmax(x)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    return x - x.amax(-1, keepdim=True)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-6, 1e-6)
