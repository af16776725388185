"""flashnn: `flashnn.LayernormDquant` (layer norm fused with dynamic per-token int8
quantization; returns int8 values and the [tokens, 1] scale)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.norm = flashnn.LayernormDquant(hidden, eps=1e-5)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden, generator=g))
            self.norm.bias.copy_(0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return self.norm(x)


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g),)


def reference(x):
    norm = torch.nn.functional.layer_norm(x, (x.shape[-1],), model.norm.weight.detach(),
                                          model.norm.bias.detach(), 1e-5)
    scale = norm.abs().amax(-1, keepdim=True) / 127.0
    return torch.trunc(norm / scale + 0.5).to(torch.int8), scale  # the kernel's (v + 0.5).to(int8)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (1e-5, 1)
