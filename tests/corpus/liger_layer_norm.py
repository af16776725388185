"""Liger-Kernel LayerNorm, unchanged: ``LigerLayerNormFunction.apply``.

The kernel takes ``rsqrt`` from ``triton.language.extra.libdevice`` (evaluated on the CPU during
capture) and a float ``eps``; it also stores each row's mean and rstd for the backward.
"""

import torch
from liger_kernel.ops.layer_norm import LigerLayerNormFunction


class Model(torch.nn.Module):
    def __init__(self, hidden=80, eps=1e-5):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(hidden, generator=g))
        self.eps = eps

    def forward(self, x):
        return LigerLayerNormFunction.apply(x, self.weight, self.bias, self.eps)


def _make_inputs(batch=2, seq=8, hidden=80):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], model.weight.detach(),
                                          model.bias.detach(), model.eps)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {
    "_layer_norm_forward_kernel": {"Y_ptr": "output", "X_ptr": "input", "W_ptr": "input",
                                   "B_ptr": "input", "Mean_ptr": "output", "RSTD_ptr": "output"},
}
tolerance = (1e-5, 1e-5)
