"""torchao: `torchao.kernel.blockwise_quantization.blockwise_fp8_gemm` (a
`torch.library.custom_op` "ao::blockwise_fp8_gemm" whose body launches an autotuned (48 configs)
fp8 GEMM with per-block scales; bf16 output). Inputs are quantized outside the model so the
case exercises the GEMM alone."""

import torch
from torchao.kernel.blockwise_quantization import blockwise_fp8_gemm

library = "torchao"  # written against torchao 0.18.0
library_module = "torchao"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, a, a_s, b, b_s):
        return blockwise_fp8_gemm(a, a_s, b, b_s, block_size=128)


def _make_inputs(m=16, k=128, n=128):
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).mul(20).to(torch.float8_e4m3fn)
    a_s = torch.rand(m, k // 128, generator=g) + 0.5
    b = torch.randn(n, k, generator=g).mul(20).to(torch.float8_e4m3fn)
    b_s = torch.rand(n // 128, k // 128, generator=g) + 0.5
    return (a, a_s, b, b_s)


def reference(a, a_s, b, b_s):
    af = a.float() * a_s.repeat_interleave(128, 1)
    bf = b.float() * b_s.repeat_interleave(128, 0).repeat_interleave(128, 1)
    return (af @ bf.T).to(torch.bfloat16)


model = Model()
example_inputs = _make_inputs()
_m = torch.export.Dim("m", min=2, max=4096)
dynamic_shapes = {"a": {0: _m}, "a_s": {0: _m}, "b": None, "b_s": None}
tolerance = (1e-2, 1e-2)
