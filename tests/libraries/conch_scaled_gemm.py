"""conch-triton-kernels: `conch.ops.quantization.gemm.scaled_gemm` (W8A8 int8 GEMM with int32
accumulation, per-token activation scales and per-channel weight scales, fp16 output)."""

import torch
from conch.ops.quantization.gemm import scaled_gemm

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

K, N = 64, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.register_buffer("b", torch.randint(-127, 128, (K, N), generator=g).to(torch.int8))
        self.register_buffer("scale_b", 0.001 + 0.002 * torch.rand(N, 1, generator=g))

    def forward(self, a, scale_a):
        return scaled_gemm(a, self.b, scale_a, self.scale_b, torch.float16)


def _make_inputs(m=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(-127, 128, (m, K), generator=g).to(torch.int8),
            0.001 + 0.002 * torch.rand(m, 1, generator=g))


def reference(a, scale_a):
    acc = (a.double() @ model.b.double()).float()
    return (acc * (scale_a * model.scale_b.T)).half()


model = Model()
example_inputs = _make_inputs()
_m = torch.export.Dim("m", min=2, max=4096)
dynamic_shapes = {"a": {0: _m}, "scale_a": {0: _m}}
tolerance = (1e-3, 1e-3)
