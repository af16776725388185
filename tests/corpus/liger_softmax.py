"""Liger-Kernel softmax over the last dim, unchanged: ``LigerSoftmaxFunction.apply``.

Rows of 40 fit one block, so Liger launches its single-block kernel (one program per row).
"""

import torch
from liger_kernel.ops.softmax import LigerSoftmaxFunction


class Model(torch.nn.Module):
    def forward(self, x):
        return LigerSoftmaxFunction.apply(x)


def _make_inputs(batch=3, seq=5, n=40):
    g = torch.Generator().manual_seed(0)
    return (4 * torch.randn(batch, seq, n, generator=g),)


def reference(x):
    return torch.softmax(x, dim=-1)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {"_softmax_single_block_forward_kernel": {"Y_ptr": "output", "X_ptr": "input"}}
tolerance = (1e-5, 1e-6)
