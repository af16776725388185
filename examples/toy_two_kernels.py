"""Toy model: two Triton kernels in a row on a 1-D tensor of dynamic length.

    s   = x + y                      (add_kernel)
    out = relu(s * scale)            (scale_relu_kernel, consumes add_kernel's output)
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


@triton.jit
def scale_relu_kernel(x_ptr, out_ptr, scale, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, tl.maximum(x * scale, 0.0), mask=mask)


class ToyModel(torch.nn.Module):
    def __init__(self, scale=2.0):
        super().__init__()
        self.scale = scale

    def forward(self, x, y):
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        summed = torch.empty_like(x)
        add_kernel[grid](x, y, summed, n_elements, BLOCK_SIZE=256)
        out = torch.empty_like(summed)
        scale_relu_kernel[grid](summed, out, self.scale, n_elements, BLOCK_SIZE=256)
        return out


def _make_inputs(n=1000):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, y):
    return torch.relu((x + y) * model.scale)


model = ToyModel()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
dynamic_shapes = {"x": {0: _n}, "y": {0: _n}}
expected_roles = {
    "add_kernel": {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output"},
    "scale_relu_kernel": {"x_ptr": "input", "out_ptr": "output"},
}
tolerance = (0.0, 0.0)
