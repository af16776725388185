"""1-D elementwise add launched with a callable grid.

Covers case 1: a 1-D elementwise kernel whose grid is a ``lambda meta: ...`` that reads the
``BLOCK_SIZE`` meta-parameter.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(axis=0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + y, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        n_elements = out.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        add_kernel[grid](x, y, out, n_elements, BLOCK_SIZE=128)
        return out


def _make_inputs(n=1000):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, y):
    return x + y


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
dynamic_shapes = {"x": {0: _n}, "y": {0: _n}}
expected_roles = {"add_kernel": {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
