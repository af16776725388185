"""PyTorch's documented pattern for Triton kernels in exportable models:
``torch.library.triton_op`` + ``torch.library.wrap_triton`` (a fused ``x * sigmoid(y) + 1``)."""

import torch
import triton
import triton.language as tl

library = "torch"  # torch.library, torch >= 2.6
library_module = "torch"
library_env = {}


@triton.jit
def gated_add_one_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x * tl.sigmoid(y) + 1.0, mask=mask)


@torch.library.triton_op("kl_conformance::gated_add_one", mutates_args=())
def gated_add_one(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    torch.library.wrap_triton(gated_add_one_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


class Model(torch.nn.Module):
    def forward(self, x, y):
        return gated_add_one(x, y)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g), torch.randn(batch, seq, hidden, generator=g))


def reference(x, y):
    return x * torch.sigmoid(y) + 1.0


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _b, 1: _s}, "y": {0: _b, 1: _s}}
tolerance = (1e-5, 1e-5)
