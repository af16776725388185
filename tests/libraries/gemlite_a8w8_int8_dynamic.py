"""gemlite: `gemlite.helper.A8W8_int8_dynamic().from_linear(...)` (dynamic per-token int8
activation quantization by a Triton kernel, then an int8 x int8 GEMM with int32 accumulation)."""

import sys

import torch
import gemlite
from gemlite.helper import A8W8_int8_dynamic

library = "gemlite"  # written against gemlite 0.6.0.post2
library_module = "gemlite"
library_env = {}

# gemlite buckets the token count for its autotuner through a Python list indexed by the count
# (utils.get_closest_m), which pins the count to one value under torch.export; its own setting
# for exact autotune keys (the documented max-autotune switch) keeps it symbolic. The kernel
# choice by count (GEMV / GEMV_SPLITK / GEMM_SPLITK / GEMM) then splits the range into pieces.
gemlite.core.set_autotune_setting(lambda M: M)
# gemlite 0.6.0.post2's setting rebinds `triton_kernels.utils.get_closest_m` only; its kernel
# and quantization modules took the name by `from .utils import ...` at import, so the case
# applies it there too (as a user of that version must for max-autotune to take effect).
for _mod in [m for n, m in sys.modules.items() if n.startswith("gemlite.")]:
    if hasattr(_mod, "get_closest_m"):
        _mod.get_closest_m = gemlite.triton_kernels.utils.get_closest_m

IN, OUT = 256, 256


def _linear():
    g = torch.Generator().manual_seed(1)
    lin = torch.nn.Linear(IN, OUT, bias=True, dtype=torch.float16)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(OUT, IN, generator=g) / IN ** 0.5)
        lin.bias.copy_(0.1 * torch.randn(OUT, generator=g))
    return lin


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        lin = _linear()
        self.register_buffer("w_ref", (lambda w: (w / (w.abs().amax(1, keepdim=True) / 127)).round().clamp(-128, 127) * (w.abs().amax(1, keepdim=True) / 127))(lin.weight.detach().float()))
        self.register_buffer("b_ref", lin.bias.detach().float().clone())
        self.layer = A8W8_int8_dynamic(device="cuda:0").from_linear(lin)

    def forward(self, x):
        return self.layer(x)


def reference(x):
    s = x.float().abs().amax(1, keepdim=True) / 127
    xq = (x.float() / s).round().clamp(-128, 127) * s  # dynamic per-token int8
    return (xq @ model.w_ref.T + model.b_ref).half()


def _make_inputs(tokens=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, IN, generator=g).half(),)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (2e-2, 2e-2)
