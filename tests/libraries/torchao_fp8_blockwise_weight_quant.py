"""torchao: `torchao.kernel.blockwise_quantization.fp8_blockwise_weight_quant` (128x128
weight blocks to float8_e4m3fn; 2-D grid over both dims)."""

import torch
from torchao.kernel.blockwise_quantization import fp8_blockwise_weight_quant

library = "torchao"  # written against torchao 0.18.0
library_module = "torchao"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, w):
        y, s = fp8_blockwise_weight_quant(w, block_size=128)
        return y.float(), s


def _make_inputs(rows=256, cols=256):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g),)


def reference(w):
    M, N = w.shape
    wb = w.reshape(M // 128, 128, N // 128, 128)
    s = wb.abs().amax((1, 3)) / 448.0
    y = (wb / s[:, None, :, None]).to(torch.float8_e4m3fn).float().reshape(M, N)
    return y, s


model = Model()
example_inputs = _make_inputs()
# both dims must stay multiples of 128 (asserted by the op): a dim 128*k
_k = torch.export.Dim("k", min=2, max=32)
dynamic_shapes = {"w": {0: 128 * _k}}
tolerance = (0.07, 1e-5)
