"""Liger-Kernel DyT (dynamic tanh, ``gamma * tanh(alpha * x) + beta``), unchanged:
``LigerDyTFunction.apply``.

The kernel is ``@triton.autotune``d over ``BLOCK_N`` (on a CPU-only host capture takes the first
config) with the feature size ``N`` a constexpr autotune key, and calls ``tanh`` from
``triton.language.extra.libdevice``. Its grid is a lambda over the config: (cdiv(N, BLOCK_N), rows).
"""

import torch
from liger_kernel.ops.dyt import LigerDyTFunction


class Model(torch.nn.Module):
    def __init__(self, hidden=96):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.alpha = torch.nn.Parameter(torch.tensor([0.7]))
        self.gamma = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.beta = torch.nn.Parameter(0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return LigerDyTFunction.apply(x, self.alpha, self.gamma, self.beta)


def _make_inputs(batch=2, seq=6, hidden=96):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    return (model.gamma.detach() * torch.tanh(model.alpha.detach() * x.float())
            + model.beta.detach()).to(x.dtype)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {
    "x": {0: torch.export.Dim("batch", min=2, max=64), 1: torch.export.Dim("seq", min=2, max=2048)}
}
expected_roles = {
    "_dyt_fwd_kernel": {"X": "input", "Y": "output", "Alpha": "input", "Gamma": "input",
                        "Beta": "input"},
}
tolerance = (1e-5, 1e-5)
