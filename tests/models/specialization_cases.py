"""Models whose launches make specialization assumptions provable or not."""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, stride, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs * stride, tl.load(x_ptr + offs * stride, mask=mask) * 3.0, mask=mask)


class Scale(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        scale_kernel[(triton.cdiv(n, 64),)](x, out, n, x.stride(-1), BLOCK=64)
        return out


unbounded = torch.export.Dim("n", min=2)  # no max: n may exceed int32
sixteens = torch.export.Dim("k", min=1, max=1024)
