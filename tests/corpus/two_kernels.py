"""Two different kernels in one forward; the second consumes the first's output.

Covers case 4: ``bias_add_kernel`` (row-major 2-D tensor plus a per-column bias, addressed with
flat offsets) followed by ``gelu_kernel`` (tanh-approximated GELU) on its result.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def bias_add_kernel(x_ptr, bias_ptr, out_ptr, n_elements, n_cols, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    bias = tl.load(bias_ptr + offsets % n_cols, mask=mask)
    tl.store(out_ptr + offsets, x + bias, mask=mask)


@triton.jit
def gelu_kernel(x_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    # 0.5 * (1 + tanh(z)) == sigmoid(2 * z), with z = sqrt(2 / pi) * (x + 0.044715 * x^3)
    z = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    tl.store(out_ptr + offsets, x * tl.sigmoid(2.0 * z), mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, bias):
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        biased = torch.empty_like(x)
        bias_add_kernel[grid](x, bias, biased, n_elements, x.shape[1], BLOCK_SIZE=128)
        out = torch.empty_like(biased)
        gelu_kernel[grid](biased, out, n_elements, BLOCK_SIZE=128)
        return out


def _make_inputs(rows=12, cols=40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)


def reference(x, bias):
    return torch.nn.functional.gelu(x + bias, approximate="tanh")


model = Model()
example_inputs = _make_inputs()
_rows = torch.export.Dim("rows", min=2, max=4096)
_cols = torch.export.Dim("cols", min=2, max=4096)
dynamic_shapes = {"x": {0: _rows, 1: _cols}, "bias": {0: _cols}}
expected_roles = {
    "bias_add_kernel": {"x_ptr": "input", "bias_ptr": "input", "out_ptr": "output"},
    "gelu_kernel": {"x_ptr": "input", "out_ptr": "output"},
}
tolerance = (1e-5, 1e-6)
