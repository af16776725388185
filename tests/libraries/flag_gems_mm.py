"""flag-gems: `flag_gems.ops.mm` (LibTuner-autotuned matmul over [M, K] x [K, N])."""

import torch
import flag_gems

library = "flag-gems"  # written against flag_gems 5.0.2
library_module = "flag_gems"
# flag_gems probes the vendor at import (nvidia-smi & co.; none here) and opens a tuning database
# named after torch.cuda.get_device_name(): pick the vendor and an in-memory database instead.
library_env = {"GEMS_VENDOR": "nvidia", "FLAGGEMS_DB_URL": "sqlite://"}


class Model(torch.nn.Module):
    def __init__(self, k=32, n=48):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(torch.randn(k, n, generator=g) / k ** 0.5)

    def forward(self, x):
        return flag_gems.ops.mm(x, self.weight)


def _make_inputs(m=16, k=32):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, k, generator=g),)


def reference(x):
    return x @ model.weight.detach()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("m", min=2, max=4096)}}
tolerance = (1e-4, 1e-4)
