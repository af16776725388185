"""Half-precision tensors: one kernel specialized for fp16 and for bf16.

Covers case 8 (fp16, bf16): ``axpby_kernel`` loads 16-bit values, computes in fp32 and stores in
the output's element type. It is launched once with fp16 tensors and once with bf16 tensors.

Note: Triton's interpreter truncates fp32 -> bf16 (hardware rounds to nearest), so the bf16
result may differ from torch by one bf16 ulp; ``tolerance`` allows for that.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def axpby_kernel(x_ptr, y_ptr, out_ptr, alpha, beta, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = alpha * x + beta * y, computed in fp32."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask).to(tl.float32)
    y = tl.load(y_ptr + offsets, mask=mask).to(tl.float32)
    out = alpha * x + beta * y
    tl.store(out_ptr + offsets, out.to(out_ptr.dtype.element_ty), mask=mask)


def axpby(x, y, alpha, beta):
    out = torch.empty_like(x)
    n_elements = x.numel()
    grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
    axpby_kernel[grid](x, y, out, alpha, beta, n_elements, BLOCK_SIZE=128)
    return out


class Model(torch.nn.Module):
    alpha, beta = 0.75, -1.5

    def forward(self, x16, y16, xbf, ybf):
        return axpby(x16, y16, self.alpha, self.beta), axpby(xbf, ybf, self.alpha, self.beta)


def _make_inputs(n=400, m=260):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(n, generator=g).half(),
        torch.randn(n, generator=g).half(),
        torch.randn(m, generator=g).bfloat16(),
        torch.randn(m, generator=g).bfloat16(),
    )


def reference(x16, y16, xbf, ybf):
    def axpby(x, y):
        return (Model.alpha * x.float() + Model.beta * y.float()).to(x.dtype)

    return axpby(x16, y16), axpby(xbf, ybf)


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
_m = torch.export.Dim("m", min=2, max=1 << 20)
dynamic_shapes = {"x16": {0: _n}, "y16": {0: _n}, "xbf": {0: _m}, "ybf": {0: _m}}
expected_roles = {"axpby_kernel": {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-2, 1e-2)
