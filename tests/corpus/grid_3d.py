"""A batched per-head row op on a 3-D grid ``(B, H, cdiv(N, BLOCK))``.

Covers case 10 (3-D grid): ``out[b, h, :] = softcap(x[b, h, :]) * head_scale[h]`` with the rational
soft-cap ``softcap(v) = cap * v / (cap + |v|)``; the three program ids map to batch, head and a
block of the row.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def head_softcap_kernel(
    x_ptr, head_scale_ptr, out_ptr, N, cap,
    stride_xb, stride_xh, stride_ob, stride_oh,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    cols = tl.program_id(2) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + b * stride_xb + h * stride_xh + cols, mask=mask)
    scale = tl.load(head_scale_ptr + h)
    out = cap * x / (cap + tl.abs(x)) * scale
    tl.store(out_ptr + b * stride_ob + h * stride_oh + cols, out, mask=mask)


class Model(torch.nn.Module):
    cap = 5.0

    def forward(self, x, head_scale):
        B, H, N = x.shape
        out = torch.empty_like(x)
        grid = lambda meta: (B, H, triton.cdiv(N, meta["BLOCK_N"]))
        head_softcap_kernel[grid](
            x, head_scale, out, N, self.cap,
            x.stride(0), x.stride(1), out.stride(0), out.stride(1),
            BLOCK_N=32,
        )
        return out


def _make_inputs(batch=2, heads=3, n=40):
    g = torch.Generator().manual_seed(0)
    return torch.randn(batch, heads, n, generator=g) * 4, torch.rand(heads, generator=g) + 0.5


def reference(x, head_scale):
    return Model.cap * x / (Model.cap + x.abs()) * head_scale[:, None]


model = Model()
example_inputs = _make_inputs()
_heads = torch.export.Dim("heads", min=2, max=256)
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: _heads, 2: torch.export.Dim("n", min=2, max=4096)},
    "head_scale": {0: _heads},
}
expected_roles = {
    "head_softcap_kernel": {"x_ptr": "input", "head_scale_ptr": "input", "out_ptr": "output"}
}
tolerance = (1e-6, 1e-6)
