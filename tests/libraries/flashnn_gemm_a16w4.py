"""flashnn: `flashnn.GemmWeightOnly` with int4 weights (W4A16: two signed int4 per int8 along N,
low nibble first, [N / 2, K] storage, per-channel fp16 scales)."""

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
        w4 = torch.randint(-8, 8, (N, K), generator=g)  # signed int4 values, [N, K]
        self.register_buffer("w4", w4)
        packed = (w4[0::2] & 0xF) | ((w4[1::2] & 0xF) << 4)  # column 2j low, 2j + 1 high
        self.register_buffer("w_packed", torch.where(packed > 127, packed - 256, packed).to(torch.int8))
        self.register_buffer("scale", (0.01 + 0.02 * torch.rand(N, generator=g)).half())

    def forward(self, x):
        return self.gemm(x, self.w_packed, self.scale)


def _make_inputs(m=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(m, K, generator=g).half(),)


def reference(x):
    return (x.float() @ (model.w4.float() * model.scale.float()[:, None]).T).half()


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("m", min=2, max=4096)}}
tolerance = (1e-2, 1e-2)
