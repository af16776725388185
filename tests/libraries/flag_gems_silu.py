"""flag-gems: `flag_gems.ops.silu` (pointwise_dynamic)."""

import torch
import flag_gems

library = "flag-gems"  # written against flag_gems 5.0.2
library_module = "flag_gems"
# flag_gems probes the vendor at import (nvidia-smi & co.; none here) and opens a tuning database
# named after torch.cuda.get_device_name(): pick the vendor and an in-memory database instead.
library_env = {"GEMS_VENDOR": "nvidia", "FLAGGEMS_DB_URL": "sqlite://"}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.weight = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))
        self.bias = torch.nn.Parameter(0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return flag_gems.ops.silu(x)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    w, b = model.weight.detach(), model.bias.detach()  # noqa: F841
    return torch.nn.functional.silu(x)


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"x": {0: _b, 1: _s}}
tolerance = (1e-5, 1e-5)
