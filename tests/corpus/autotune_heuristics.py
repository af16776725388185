"""``@triton.autotune`` stacked on ``@triton.heuristics`` (the flash-attention pattern).

Covers cases 6 and 7 together: the autotuner picks ``BLOCK_SIZE``, then the heuristic computes
``EVEN_N`` from the chosen ``BLOCK_SIZE`` and ``n_elements``.
"""

import torch
import triton
import triton.language as tl


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 64}), triton.Config({"BLOCK_SIZE": 128})],
    key=["n_elements"],
)
@triton.heuristics({"EVEN_N": lambda args: args["n_elements"] % args["BLOCK_SIZE"] == 0})
@triton.jit
def clamp_kernel(x_ptr, out_ptr, lo, hi, n_elements, BLOCK_SIZE: tl.constexpr, EVEN_N: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    if EVEN_N:
        x = tl.load(x_ptr + offsets)
        tl.store(out_ptr + offsets, tl.clamp(x, lo, hi))
    else:
        mask = offsets < n_elements
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, tl.clamp(x, lo, hi), mask=mask)


class Model(torch.nn.Module):
    lo, hi = -0.5, 1.0

    def forward(self, x):
        out = torch.empty_like(x)
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        clamp_kernel[grid](x, out, self.lo, self.hi, n_elements)
        return out


def _make_inputs(n=700):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, generator=g),)


def reference(x):
    return x.clamp(Model.lo, Model.hi)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=1 << 20)}}
expected_roles = {"clamp_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
