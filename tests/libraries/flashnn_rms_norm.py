"""flashnn: `flashnn.RMSNorm` (its Triton backend: a single-config `triton.autotune` wrapper built
anew around `_rms_norm_kernel` on every call)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.norm = flashnn.RMSNorm(hidden, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(1)))

    def forward(self, x):
        return self.norm(x)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return x * rstd * model.norm.weight.detach()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
