"""flashnn: `flashnn.LayerNorm` (its Triton backend allocates its mean/rstd buffers with
`device="cuda"`, whatever the input's device)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self, hidden=64):
        super().__init__()
        self.norm = flashnn.LayerNorm(hidden, eps=1e-5)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            self.norm.weight.copy_(1.0 + 0.1 * torch.randn(hidden, generator=g))
            self.norm.bias.copy_(0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return self.norm(x)


def _make_inputs(batch=2, seq=8, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, hidden, generator=g),)


def reference(x):
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), model.norm.weight.detach(),
                                          model.norm.bias.detach(), 1e-5)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("batch", min=2, max=8),
                        1: torch.export.Dim("seq", min=2, max=2048)}}
tolerance = (1e-5, 1e-5)
