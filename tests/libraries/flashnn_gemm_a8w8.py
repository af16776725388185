"""flashnn: `flashnn.GemmA8W8` (int8 x int8^T GEMM with int32 accumulation, fp16 per-row
activation and per-column weight scales; single-config autotune built per call, META grid)."""

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
        self.gemm = flashnn.GemmA8W8(out_ty=torch.float16)
        self.register_buffer("w", torch.randint(-127, 128, (N, K), generator=g).to(torch.int8))
        self.register_buffer("alpha_col", (0.001 + 0.002 * torch.rand(1, N, generator=g)).half())

    def forward(self, a, alpha_row):
        return self.gemm(a, self.w, alpha_row, self.alpha_col)


def _make_inputs(m=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randint(-127, 128, (m, K), generator=g).to(torch.int8),
            (0.001 + 0.002 * torch.rand(m, 1, generator=g)).half())


def reference(a, alpha_row):
    acc = (a.double() @ model.w.double().T).float()
    return (acc * (alpha_row.float() * model.alpha_col.float())).half()


model = Model()
example_inputs = _make_inputs()
_m = torch.export.Dim("m", min=2, max=4096)
dynamic_shapes = {"a": {0: _m}, "alpha_row": {0: _m}}
tolerance = (1e-2, 1e-2)
