"""An in-place kernel on a tensor created inside forward.

Covers case 17 (intermediate): ``y = x.clone()`` and then ``scale_shift_inplace_kernel`` reads and
writes ``y`` (``y.mul_(alpha).add_(beta)`` written as a Triton kernel). The model input is not
modified.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_shift_inplace_kernel(x_ptr, alpha, beta, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(x_ptr + offsets, x * alpha + beta, mask=mask)


class Model(torch.nn.Module):
    alpha, beta = 1.5, -0.25

    def forward(self, x):
        y = x.clone()
        n_elements = y.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        scale_shift_inplace_kernel[grid](y, self.alpha, self.beta, n_elements, BLOCK_SIZE=128)
        return y


def _make_inputs(rows=6, cols=50):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g),)


def reference(x):
    return x * Model.alpha + Model.beta


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("rows", min=2, max=4096), 1: torch.export.Dim("cols", min=2, max=4096)}
}
expected_roles = {"scale_shift_inplace_kernel": {"x_ptr": "inplace"}}
tolerance = (1e-6, 1e-6)
