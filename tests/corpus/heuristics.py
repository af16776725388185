"""A ``@triton.heuristics`` kernel whose constexpr is computed from the launch arguments.

Covers case 7: ``EVEN_N`` is computed from the args dict (``n_elements % BLOCK_SIZE == 0``) and
selects an unmasked fast path. The example input (512 elements) takes the unmasked branch; other
lengths take the masked one.
"""

import torch
import triton
import triton.language as tl


@triton.heuristics({"EVEN_N": lambda args: args["n_elements"] % args["BLOCK_SIZE"] == 0})
@triton.jit
def leaky_relu_kernel(
    x_ptr, out_ptr, n_elements, negative_slope, BLOCK_SIZE: tl.constexpr, EVEN_N: tl.constexpr
):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN_N:
        x = tl.load(x_ptr + offsets)
        tl.store(out_ptr + offsets, tl.where(x > 0, x, x * negative_slope))
    else:
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.where(x > 0, x, x * negative_slope), mask=mask)


class Model(torch.nn.Module):
    negative_slope = 0.01

    def forward(self, x):
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        leaky_relu_kernel[grid](x, out, n_elements, self.negative_slope, BLOCK_SIZE=128)
        return out


def _make_inputs(n=512):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g),)


def reference(x):
    return torch.nn.functional.leaky_relu(x, Model.negative_slope)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=1 << 20)}}
expected_roles = {"leaky_relu_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
