"""A kernel that updates a MODEL INPUT in place.

Covers case 17 (input mutation): ``axpy_inplace_kernel`` computes ``y += alpha * x`` directly in
the caller's ``y``; forward returns the mutated ``y``. Because calling the model mutates its
first argument, pass clones of ``example_inputs`` when running it more than once.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def axpy_inplace_kernel(y_ptr, x_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(y_ptr + offsets, y + alpha * x, mask=mask)


class Model(torch.nn.Module):
    alpha = 0.25

    def forward(self, y, x):
        n_elements = y.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        axpy_inplace_kernel[grid](y, x, self.alpha, n_elements, BLOCK_SIZE=128)
        return y


def _make_inputs(n=600):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(y, x):
    """The value ``model(y, x)`` returns (computed without mutating ``y``)."""
    return y + Model.alpha * x


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
dynamic_shapes = {"y": {0: _n}, "x": {0: _n}}
expected_roles = {"axpy_inplace_kernel": {"y_ptr": "inplace", "x_ptr": "input"}}
tolerance = (1e-6, 1e-6)
