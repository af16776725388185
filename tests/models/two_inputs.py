"""Two inputs of equal size at trace time, and a grid derived from the second input."""

import torch
import triton
import triton.language as tl


@triton.jit
def fill_kernel(y_ptr, out_ptr, m, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < m
    tl.store(out_ptr + offs, tl.load(y_ptr + offs, mask=mask) + 1.0, mask=mask)


class SecondInputGrid(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(y)
        m = y.shape[0]
        fill_kernel[lambda meta: (triton.cdiv(m, meta["BLOCK"]),)](y, out, m, BLOCK=32)
        return out + x.sum()
