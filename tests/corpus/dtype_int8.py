"""Row-wise symmetric int8 quantization followed by dequantization.

Covers case 8 (int8): ``quantize_int8_kernel`` writes an int8 tensor and a per-row fp32 scale;
``dequantize_int8_kernel`` reads them back. One program per row (the whole row fits in a block).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def quantize_int8_kernel(x_ptr, q_ptr, scale_ptr, n_cols, stride_x, stride_q, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    scale = tl.maximum(tl.max(tl.abs(x), axis=0), 1e-12) / 127.0
    q = x / scale
    q = tl.where(q >= 0, q + 0.5, q - 0.5)  # round half away from zero; the cast truncates
    tl.store(q_ptr + row * stride_q + cols, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def dequantize_int8_kernel(q_ptr, scale_ptr, out_ptr, n_cols, stride_q, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    q = tl.load(q_ptr + row * stride_q + cols, mask=mask).to(tl.float32)
    scale = tl.load(scale_ptr + row)
    tl.store(out_ptr + row * stride_out + cols, q * scale, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        n_rows, n_cols = x.shape
        block_n = triton.next_power_of_2(n_cols)
        q = torch.empty(x.shape, device=x.device, dtype=torch.int8)
        scale = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        quantize_int8_kernel[(n_rows,)](x, q, scale, n_cols, x.stride(0), q.stride(0), BLOCK_N=block_n)
        out = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        dequantize_int8_kernel[(n_rows,)](q, scale, out, n_cols, q.stride(0), out.stride(0), BLOCK_N=block_n)
        return q, scale, out


def _make_inputs(rows=16, cols=48):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g),)


def reference(x):
    scale = x.abs().amax(dim=1).clamp_min(1e-12) / 127.0
    q = x / scale[:, None]
    q = torch.where(q >= 0, q + 0.5, q - 0.5).to(torch.int8)
    return q, scale, q.float() * scale[:, None]


model = Model()
example_inputs = _make_inputs()
# The row width is static: it picks the power-of-two block that holds a whole row.
dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=2, max=4096)}}
expected_roles = {
    "quantize_int8_kernel": {"x_ptr": "input", "q_ptr": "output", "scale_ptr": "output"},
    "dequantize_int8_kernel": {"q_ptr": "input", "scale_ptr": "input", "out_ptr": "output"},
}
tolerance = (0.0, 0.0)
