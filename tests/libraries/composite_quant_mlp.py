"""Composite: a quantized LLaMA-style MLP block chaining library ops, as a deployment runs it:
conch's rms_norm, conch's W4A16 mixed_precision_gemm for the fused gate+up projection, conch's
silu_and_mul, flashnn's int8 weight-only GEMM (GemmWeightOnly) for the down projection, and the
residual add in torch."""

import torch
import flashnn
from conch.ops.activation.silu_and_mul import silu_and_mul
from conch.ops.normalization.rms_norm import rms_norm
from conch.ops.quantization.gemm import mixed_precision_gemm

library = "conch-triton-kernels+flashnn"  # written against conch-triton-kernels 1.3, flashnn 0.1.1
library_module = "conch"
library_env = {}

HIDDEN, FFN, GROUP, BITS, BIAS = 128, 128, 64, 4, 8


def _pack(q):  # [K, N] ints in [0, 16) -> [K // 8, N] int32, element k at bits 4 * (k % 8)
    per = 32 // BITS
    k, n = q.shape
    q = q.to(torch.int64).view(k // per, per, n)
    packed = torch.zeros(k // per, n, dtype=torch.int64)
    for i in range(per):
        packed |= q[:, i, :] << (BITS * i)
    return torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.norm = torch.nn.Parameter((1.0 + 0.1 * torch.randn(HIDDEN, generator=g)).half())
        q = torch.randint(0, 2 ** BITS, (HIDDEN, 2 * FFN), generator=g)
        self.register_buffer("gate_up_q", q)
        self.register_buffer("gate_up", _pack(q))
        self.register_buffer("gate_up_scales",
                             (0.01 + 0.02 * torch.rand(HIDDEN // GROUP, 2 * FFN, generator=g)).half())
        self.down_gemm = flashnn.GemmWeightOnly(out_ty=torch.float16)
        self.register_buffer("down", torch.randint(-127, 128, (HIDDEN, FFN), generator=g).to(torch.int8))
        self.register_buffer("down_scale", (0.0005 + 0.001 * torch.rand(HIDDEN, generator=g)).half())

    def forward(self, x):
        h = rms_norm(x, self.norm, 1e-6)
        gate_up = mixed_precision_gemm(h, self.gate_up, self.gate_up_scales, None, BITS, BIAS, GROUP)
        act = silu_and_mul(gate_up)
        return x + self.down_gemm(act, self.down, self.down_scale)


def _make_inputs(tokens=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, HIDDEN, generator=g).half(),)


def reference(x):
    xf = x.float()
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * model.norm.float()).half()
    w = (model.gate_up_q.float() - BIAS) * model.gate_up_scales.float().repeat_interleave(GROUP, 0)
    gu = (h.float() @ w).half().float()
    act = (torch.nn.functional.silu(gu[:, :FFN]) * gu[:, FFN:]).half()
    down = (act.float() @ (model.down.float() * model.down_scale.float()[:, None]).T).half()
    return x + down


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=512)}}
tolerance = (3e-2, 3e-2)
