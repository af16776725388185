"""flashnn: `flashnn.DynamicQuantize` (per-token dynamic int8 quantization of fp16 activations:
int8(x * 127 / max|x| +- 0.5), fp16 scales; the kernel takes the token count M and the padded
hidden size N as constexprs, and reduces with a @triton.jit combine function)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.quant = flashnn.DynamicQuantize()

    def forward(self, x):
        return self.quant(x)


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g).half(),)


def reference(x):
    absmax = x.float().abs().amax(-1, keepdim=True)
    v = x.float() * (127.0 / absmax)
    q = torch.trunc(v + torch.where(v > 0, 0.5, -0.5)).to(torch.int8)
    return q, (absmax / 127.0).squeeze(-1).half()


model = Model()
example_inputs = _make_inputs()
# the kernel takes the token count as a constexpr: one binary per count, 64 at most (2..65)
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=65)}}
tolerance = (1e-3, 1)
