"""SwiGLU on a packed ``[gate | up]`` projection: ``out = silu(gate) * up``.

Covers case 13. The input is the (tokens, 2 * I) output of a fused gate/up projection; each
program handles one row and one block of the I output columns (2-D grid).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def swiglu_kernel(x_ptr, out_ptr, n_cols, stride_x, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x_row = x_ptr + row * stride_x
    gate = tl.load(x_row + cols, mask=mask).to(tl.float32)
    up = tl.load(x_row + n_cols + cols, mask=mask).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        n_rows = x.shape[0]
        n_cols = x.shape[1] // 2
        out = torch.empty((n_rows, n_cols), device=x.device, dtype=x.dtype)
        grid = lambda meta: (n_rows, triton.cdiv(n_cols, meta["BLOCK_N"]))
        swiglu_kernel[grid](x, out, n_cols, x.stride(0), out.stride(0), BLOCK_N=64)
        return out


def _make_inputs(tokens=10, intermediate=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, 2 * intermediate, generator=g),)


def reference(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (torch.nn.functional.silu(gate) * up).to(x.dtype)


model = Model()
example_inputs = _make_inputs()
_intermediate = torch.export.Dim("intermediate", min=2, max=16384)
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096), 1: 2 * _intermediate}}
expected_roles = {"swiglu_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-5, 1e-6)
