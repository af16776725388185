"""flashnn: `flashnn.GemmWeightOnly` with int8 weights and per-channel fp16 scales (W8A16:
fp16 activations x int8 [N, K] weights, split-K grid from the autotune config)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}

K, N = 64, 64


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.gemm = flashnn.GemmWeightOnly(out_ty=torch.float16)
        self.register_buffer("w", torch.randint(-127, 128, (N, K), generator=g).to(torch.int8))
        self.register_buffer("scale", (0.001 + 0.002 * torch.rand(N, generator=g)).half())

    def forward(self, x):
        return self.gemm(x, self.w, self.scale)


def _make_inputs(m=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, K, generator=g).half(),)


def reference(x):
    return (x.float() @ (model.w.float() * model.scale.float()[:, None]).T).half()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("m", min=2, max=4096)}}
tolerance = (1e-2, 1e-2)
