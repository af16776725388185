"""Liger-Kernel GroupNorm, unchanged: ``LigerGroupNormFunction.apply``.

A 2-D grid (batch, groups); the kernel takes ``rsqrt`` from ``triton.language.extra.libdevice``
and a float ``eps``. The channels-per-group x length size picks a constexpr block, so only the
batch is dynamic.
"""

import torch
from liger_kernel.ops.group_norm import LigerGroupNormFunction


class Model(torch.nn.Module):
    def __init__(self, channels=8, groups=4, eps=1e-5):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(channels, generator=g))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(channels, generator=g))
        self.channels, self.groups, self.eps = channels, groups, eps

    def forward(self, x):
        return LigerGroupNormFunction.apply(x, self.weight, self.bias, self.channels, self.groups,
                                            self.eps)


def _make_inputs(batch=3, channels=8, length=12):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, channels, length, generator=g),)


def reference(x):
    return torch.nn.functional.group_norm(x, model.groups, model.weight.detach(),
                                          model.bias.detach(), model.eps)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=256)}}
expected_roles = {
    "_group_norm_forward_kernel": {"Y_ptr": "output", "X_ptr": "input", "Mean_ptr": "output",
                                   "RSTD_ptr": "output", "W_ptr": "input", "B_ptr": "input"},
}
tolerance = (1e-5, 1e-5)
