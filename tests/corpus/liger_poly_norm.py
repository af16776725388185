"""Liger-Kernel PolyNorm, unchanged: ``LigerPolyNormFunction.apply``.

``y = w0 * norm(x^3) + w1 * norm(x^2) + w2 * norm(x) + b`` with ``norm(u) = u * rsqrt(mean(u^2) +
eps)``; three libdevice ``rsqrt`` calls per row, weights and bias read as scalars from memory.
"""

import torch
from liger_kernel.ops.poly_norm import LigerPolyNormFunction


class Model(torch.nn.Module):
    def __init__(self, eps=1e-6):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor([0.3, 0.5, 1.2]))
        self.bias = torch.nn.Parameter(torch.tensor([0.1]))
        self.eps = eps

    def forward(self, x):
        return LigerPolyNormFunction.apply(x, self.weight, self.bias, self.eps)


def _make_inputs(batch=2, seq=6, hidden=80):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    def norm(u):
        return u * torch.rsqrt(u.pow(2).mean(dim=-1, keepdim=True) + model.eps)

    w, b = model.weight.detach(), model.bias.detach()
    return w[0] * norm(x ** 3) + w[1] * norm(x ** 2) + w[2] * norm(x) + b


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {
    "_poly_norm_forward_kernel": {"Y_ptr": "output", "X_ptr": "input", "W_ptr": "input",
                                  "B_ptr": "input", "RSTD_ptr": "output"},
}
tolerance = (1e-5, 1e-5)
