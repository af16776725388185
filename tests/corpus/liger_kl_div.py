"""Liger-Kernel KL divergence, unchanged: ``LigerKLDivLossFunction.apply`` ("batchmean").

The kernel writes per-row losses (a float ``eps`` clamps the target); the batch mean is torch
ops after the launch (sum, divide by the dynamic row count).
"""

import torch
from liger_kernel.ops.kl_div import LigerKLDivLossFunction


class Model(torch.nn.Module):
    def forward(self, log_pred, target):
        return LigerKLDivLossFunction.apply(log_pred, target, "batchmean", False, 1e-10)


def _make_inputs(rows=6, vocab=40):
    g = torch.Generator().manual_seed(0)
    log_pred = torch.randn(rows, vocab, generator=g).log_softmax(-1)
    target = torch.randn(rows, vocab, generator=g).softmax(-1)
    return (log_pred, target)


def reference(log_pred, target):
    return torch.nn.functional.kl_div(log_pred, target, reduction="batchmean")


model = Model()
example_inputs = _make_inputs()
_rows = torch.export.Dim("rows", min=2, max=4096)
dynamic_shapes = {"log_pred": {0: _rows}, "target": {0: _rows}}
expected_roles = {
    "_kldiv_kernel_forward": {"y_ptr": "input", "gt_ptr": "input", "loss_ptr": "output"},
}
tolerance = (1e-5, 1e-6)
