"""conch-triton-kernels: `conch.ops.quantization.gemm.mixed_precision_gemm` (GemLite-derived
W4A16 GEMM: fp16 activations x int4 weights packed 8 per int32 along K, per-group (64) fp16
scales, symmetric with bias 8; tl.dtype constexprs for input/output/acc/meta dtypes)."""

import torch
from conch.ops.quantization.gemm import mixed_precision_gemm

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

K, N, GROUP, BITS, BIAS = 128, 64, 64, 4, 8


def _pack(q):  # [K, N] ints in [0, 16) -> [K // 8, N] int32, element k at bits 4 * (k % 8)
    per = 32 // BITS
    q = q.to(torch.int64).view(K // per, per, N)
    packed = torch.zeros(K // per, N, dtype=torch.int64)
    for i in range(per):
        packed |= q[:, i, :] << (BITS * i)
    packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed)
    return packed.to(torch.int32)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        q = torch.randint(0, 2 ** BITS, (K, N), generator=g)
        self.register_buffer("w_q", q)
        self.register_buffer("w_packed", _pack(q))
        self.register_buffer("scales", (0.01 + 0.02 * torch.rand(K // GROUP, N, generator=g)).half())

    def forward(self, x):
        return mixed_precision_gemm(x, self.w_packed, self.scales, None, BITS, BIAS, GROUP)


def _make_inputs(m=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, K, generator=g).half(),)


def reference(x):
    w = (model.w_q.float() - BIAS) * model.scales.float().repeat_interleave(GROUP, 0)
    return (x.float() @ w).half()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("m", min=2, max=4096)}}
tolerance = (1e-2, 1e-2)
