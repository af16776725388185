"""RMSNorm: one program per row, a learned weight vector and an ``eps`` scalar.

Covers case 12. The weight is an ``nn.Parameter`` (initialised deterministically), so it reaches
the kernel as a parameter rather than a model input. The hidden size (80) is not a power of two,
so the row block is masked.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, out_ptr, n_cols, eps, stride_x, stride_out, BLOCK_N: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    rstd = tl.rsqrt(mean_square + eps)
    w = tl.load(w_ptr + cols, mask=mask).to(tl.float32)
    out = x * rstd * w
    tl.store(out_ptr + row * stride_out + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


class Model(torch.nn.Module):
    def __init__(self, hidden=80, eps=1e-6):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.eps = eps

    def forward(self, x):
        hidden = x.shape[-1]
        x2d = x.reshape(-1, hidden)
        out = torch.empty_like(x2d)
        n_rows = x2d.shape[0]
        rmsnorm_kernel[(n_rows,)](
            x2d, self.weight, out, hidden, self.eps, x2d.stride(0), out.stride(0),
            BLOCK_N=triton.next_power_of_2(hidden),
        )
        return out.reshape(x.shape)


def _make_inputs(batch=2, seq=8, hidden=80):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + model.eps)
    return (x32 * rstd * model.weight.detach().float()).to(x.dtype)


model = Model()
example_inputs = _make_inputs()
# The hidden size is static (it matches the weight and picks the power-of-two row block).
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {"rmsnorm_kernel": {"x_ptr": "input", "w_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-5, 1e-5)
