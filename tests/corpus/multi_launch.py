"""One kernel launched three times in a forward, with different scalars and block sizes.

Covers case 3: the same ``scale_kernel`` is launched with ``alpha`` = 2.0, 0.5 and -3.0, on
tensors of different lengths (so ``n_elements`` differs) and with two ``BLOCK_SIZE``
specializations. The launches go through a small Python wrapper, as users usually write them.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * alpha, mask=mask)


def scale(x, alpha, block_size=128):
    out = torch.empty_like(x)
    n_elements = x.numel()
    scale_kernel[(triton.cdiv(n_elements, block_size),)](
        x, out, alpha, n_elements, BLOCK_SIZE=block_size
    )
    return out


class Model(torch.nn.Module):
    def forward(self, x, y):
        doubled = scale(x, 2.0)
        restored = scale(doubled, 0.5, block_size=64)
        return restored, scale(y, -3.0)


def _make_inputs(n=1000, m=300):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(m, generator=g)


def reference(x, y):
    return (x * 2.0) * 0.5, y * -3.0


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("n", min=2, max=1 << 20)},
    "y": {0: torch.export.Dim("m", min=2, max=1 << 20)},
}
expected_roles = {"scale_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
