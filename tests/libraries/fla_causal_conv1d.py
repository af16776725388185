"""fla-core: `fla.modules.ShortConvolution` (depthwise causal conv1d, kernel 4, SiLU, Triton
backend)."""

import torch
from fla.modules import ShortConvolution

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64, kernel=4):
        super().__init__()
        torch.manual_seed(1)
        self.conv = ShortConvolution(hidden, kernel, bias=True, activation="silu", backend="triton")

    def forward(self, x):
        y, _state = self.conv(x)
        return y


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    c = model.conv
    T = x.shape[1]
    y = torch.nn.functional.conv1d(x.transpose(1, 2), c.weight.detach(), c.bias.detach(),
                                   padding=c.weight.shape[-1] - 1, groups=x.shape[-1])[..., :T]
    return torch.nn.functional.silu(y).transpose(1, 2)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
