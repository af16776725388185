"""Liger-Kernel RMSNorm, unchanged: ``LigerRMSNormFunction.apply`` (Llama casting mode).

Liger's kernel calls ``rsqrt`` from ``triton.language.extra.libdevice`` and casts its float
``eps`` with ``eps.to(tl.float32)``; on a CPU-only host both need capture's interpreter support
(libdevice evaluated on the CPU, float scalars typed fp32 as Triton's JIT types them). The hidden
size (96) is not a power of two, so the row block is masked; with a block <= 256 Liger picks its
row kernel only for fewer than 32768 rows, which the dynamic dims' ranges keep.
"""

import torch
from liger_kernel.ops.rms_norm import LigerRMSNormFunction


class Model(torch.nn.Module):
    def __init__(self, hidden=96, eps=1e-6):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.eps = eps

    def forward(self, x):
        return LigerRMSNormFunction.apply(x, self.weight, self.eps)


def _make_inputs(batch=2, seq=8, hidden=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    x32 = x.float()
    rstd = torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + model.eps)
    return (x32 * rstd).to(x.dtype) * model.weight.detach()


model = Model()
example_inputs = _make_inputs()
# hidden is static (it matches the weight and picks the constexpr block).
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=8), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {
    "_rms_norm_forward_kernel": {"Y_ptr": "output", "X_ptr": "input", "W_ptr": "input",
                                 "RSTD_ptr": "output"},
}
tolerance = (1e-5, 1e-5)
