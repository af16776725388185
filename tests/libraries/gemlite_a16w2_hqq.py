"""gemlite: `gemlite.helper.A16W2_HQQ_INT().from_weights(W_q, scales, zeros)` (HQQ 2-bit
asymmetric weights bit-packed into int32, group 64, fp16 activations)."""

import sys

import torch
import gemlite
from gemlite.helper import A16W2_HQQ_INT

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

NBITS, GROUP = 2, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        w_q = torch.randint(0, 2 ** NBITS, (OUT, IN), generator=g).to(torch.uint8)
        scales = (0.01 + 0.02 * torch.rand(OUT * IN // GROUP, 1, generator=g)).half()
        zeros = (2 ** (NBITS - 1) + torch.randn(OUT * IN // GROUP, 1, generator=g)).half()
        w = (w_q.float().view(-1, GROUP) - zeros.float()) * scales.float()
        self.register_buffer("w_ref", w.view(OUT, IN))
        self.register_buffer("b_ref", 0.1 * torch.randn(OUT, generator=g))
        self.layer = A16W2_HQQ_INT(device="cuda:0").from_weights(w_q, scales, zeros, bias=self.b_ref.half())

    def forward(self, x):
        return self.layer(x)


def reference(x):
    xq = x.float()
    return (xq @ model.w_ref.T + model.b_ref).half()


def _make_inputs(tokens=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, IN, generator=g).half(),)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (1e-2, 1e-2)
