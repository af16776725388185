"""Liger-Kernel fused residual add + RMSNorm, unchanged: ``LigerFusedAddRMSNormFunction.apply``.

Returns the normalized sum and the sum itself (the next residual); the kernel takes ``rsqrt`` from
``triton.language.extra.libdevice`` and float ``eps``/``offset`` scalars cast with ``.to()``.
"""

import torch
from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction


class Model(torch.nn.Module):
    def __init__(self, hidden=96, eps=1e-6):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.eps = eps

    def forward(self, x, residual):
        return LigerFusedAddRMSNormFunction.apply(x, residual, self.weight, self.eps)


def _make_inputs(batch=2, seq=8, hidden=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),
            torch.randn(batch, seq, hidden, generator=g))


def reference(x, residual):
    s = x + residual
    rstd = torch.rsqrt(s.float().pow(2).mean(dim=-1, keepdim=True) + model.eps)
    return (s.float() * rstd).to(x.dtype) * model.weight.detach(), s


model = Model()
example_inputs = _make_inputs()
_batch = torch.export.Dim("batch", min=2, max=64)
_seq = torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _batch, 1: _seq}, "residual": {0: _batch, 1: _seq}}
expected_roles = {
    "_fused_add_rms_norm_forward_kernel": {"Y_ptr": "output", "S_ptr": "output", "X_ptr": "input",
                                           "R_ptr": "input", "W_ptr": "input",
                                           "RSTD_ptr": "output"},
}
tolerance = (1e-5, 1e-5)
