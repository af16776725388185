"""A ``@triton.jit`` function passed as an argument, as libraries let the caller choose an
activation: an annotated ``ACT: tl.constexpr`` and an unannotated parameter (Triton's binder
makes a JITFunction argument a constexpr), two launches with different activations of which one
calls a helper of its own."""

import torch
import triton
import triton.language as tl


@triton.jit
def _sigmoid(x):
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def silu(x):
    return x * _sigmoid(x)


@triton.jit
def leaky_relu(x):
    return tl.where(x >= 0, x, 0.01 * x)


@triton.jit
def act_kernel(x_ptr, out_ptr, n, ACT: tl.constexpr, post, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, post(ACT(x)), mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        n = x.numel()
        a, b = torch.empty_like(x), torch.empty_like(x)
        grid = (triton.cdiv(n, 64),)
        act_kernel[grid](x, a, n, ACT=silu, post=leaky_relu, BLOCK=64)
        act_kernel[grid](x, b, n, ACT=leaky_relu, post=silu, BLOCK=64)
        return a, b


def _make_inputs(n=300):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g),)


def _silu(x):
    return x * (1.0 / (1.0 + torch.exp(-x)))


def _leaky(x):
    return torch.where(x >= 0, x, 0.01 * x)


def reference(x):
    return _leaky(_silu(x)), _silu(_leaky(x))


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=1 << 20)}}
expected_roles = {"act_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-6, 1e-6)
