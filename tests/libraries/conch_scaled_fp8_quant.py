"""conch-triton-kernels: `conch.ops.quantization.fp8.scaled_fp8_quant` (static per-tensor scale:
fp8_e4m3fn(clamp(x / scale)); returns (quantized, scale)). Run as is under TRITON_INTERPRET=1,
Triton 3.6's interpreter converts fp32 -> fp8e4nv wrongly just below a power of two (x / scale =
127.2 gives 64, not 128; 21 of the 1024 example elements); GPUs round to nearest, as torch does."""

import torch
from conch.ops.quantization.fp8 import scaled_fp8_quant

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.tensor([0.02]))

    def forward(self, x):
        q, _ = scaled_fp8_quant(x, self.scale)
        return q


def _make_inputs(tokens=16, hidden=64):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, hidden, generator=g),)


def reference(x):
    return (x / model.scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}}
tolerance = (0.07, 1e-3)  # one e4m3 ulp (relative 2**-3) where x / scale lands between the two
