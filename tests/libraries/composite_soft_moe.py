"""Composite: a mixture-of-experts FFN with a dense (soft) router, chaining library ops: flashnn's
layer_norm_dquant-free path is avoided; the router is torch softmax, each expert is
conch's silu_and_mul between two flashnn int8 weight-only GEMMs (GemmWeightOnly), and the experts'
outputs are combined by the router weights in torch, then fla's rms_norm on the result."""

import torch
import flashnn
from conch.ops.activation.silu_and_mul import silu_and_mul
from fla.modules import RMSNorm

library = "conch-triton-kernels+flashnn+fla-core"  # conch 1.3, flashnn 0.1.1, fla-core 0.6.0
library_module = "flashnn"
library_env = {}

HIDDEN, FFN, EXPERTS = 64, 64, 4


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.router = torch.nn.Parameter((torch.randn(EXPERTS, HIDDEN, generator=g) / HIDDEN ** 0.5).half())
        self.gemm = flashnn.GemmWeightOnly(out_ty=torch.float16)
        self.register_buffer("up", torch.randint(-127, 128, (EXPERTS, 2 * FFN, HIDDEN), generator=g).to(torch.int8))
        self.register_buffer("up_scale", (0.0005 + 0.001 * torch.rand(EXPERTS, 2 * FFN, generator=g)).half())
        self.register_buffer("down", torch.randint(-127, 128, (EXPERTS, HIDDEN, FFN), generator=g).to(torch.int8))
        self.register_buffer("down_scale", (0.0005 + 0.001 * torch.rand(EXPERTS, HIDDEN, generator=g)).half())
        self.norm = RMSNorm(HIDDEN, eps=1e-5).half()

    def forward(self, x):
        weights = torch.softmax((x @ self.router.T).float(), dim=-1).half()
        out = torch.zeros_like(x)
        for e in range(EXPERTS):
            h = silu_and_mul(self.gemm(x, self.up[e], self.up_scale[e]))
            out = out + weights[:, e:e + 1] * self.gemm(h, self.down[e], self.down_scale[e])
        return self.norm(out)


def _make_inputs(tokens=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(tokens, HIDDEN, generator=g).half(),)


def reference(x):
    m = model
    weights = torch.softmax((x @ m.router.T).float(), dim=-1).half()
    out = torch.zeros_like(x)
    for e in range(EXPERTS):
        up = (x.float() @ (m.up[e].float() * m.up_scale[e].float()[:, None]).T).half().float()
        h = (torch.nn.functional.silu(up[:, :FFN]) * up[:, FFN:]).half()
        down = (h.float() @ (m.down[e].float() * m.down_scale[e].float()[:, None]).T).half()
        out = out + weights[:, e:e + 1] * down
    o = out.float()
    return (o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * m.norm.weight.float()).half()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=512)}}
tolerance = (3e-2, 3e-2)
