"""An ``@triton.autotune`` kernel with three configs keyed on the problem size.

Covers case 6: ``BLOCK_SIZE`` is chosen by the autotuner (the caller does not pass it), so the grid
must be a callable that reads ``meta["BLOCK_SIZE"]``.
"""

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 32}, num_warps=1),
        triton.Config({"BLOCK_SIZE": 64}, num_warps=2),
        triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
    ],
    key=["n_elements"],
)
@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = x + alpha * y."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    y = tl.load(y_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x + alpha * y, mask=mask)


class Model(torch.nn.Module):
    alpha = 0.5

    def forward(self, x, y):
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        scaled_add_kernel[grid](x, y, out, self.alpha, n_elements)
        return out


def _make_inputs(n=500):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, y):
    return x + Model.alpha * y


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
dynamic_shapes = {"x": {0: _n}, "y": {0: _n}}
expected_roles = {"scaled_add_kernel": {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
