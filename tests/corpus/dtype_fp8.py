"""fp8 (e4m3) dequantization with a per-tensor scale.

Covers case 8 (fp8): a ``torch.float8_e4m3fn`` input is converted to fp32 inside the kernel and
multiplied by a scale that is read from a one-element fp32 tensor.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def dequant_fp8_kernel(x_ptr, scale_ptr, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    scale = tl.load(scale_ptr)
    tl.store(out_ptr + offsets, x * scale, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x_fp8, scale):
        out = torch.empty(x_fp8.shape, device=x_fp8.device, dtype=torch.float32)
        n_elements = x_fp8.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        dequant_fp8_kernel[grid](x_fp8, scale, out, n_elements, BLOCK_SIZE=128)
        return out


def _make_inputs(rows=8, cols=48):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(rows, cols, generator=g) * 4
    return x.to(torch.float8_e4m3fn), torch.tensor([0.125])


def reference(x_fp8, scale):
    return x_fp8.float() * scale


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x_fp8": {
        0: torch.export.Dim("rows", min=2, max=4096),
        1: torch.export.Dim("cols", min=2, max=4096),
    },
    "scale": None,
}
expected_roles = {
    "dequant_fp8_kernel": {"x_ptr": "input", "scale_ptr": "input", "out_ptr": "output"}
}
tolerance = (0.0, 0.0)
