"""torchao: `torchao.kernel.blockwise_quantization.fp8_blockwise_act_quant` (DeepSeek-V3 style
1x128 activation quantization to float8_e4m3fn, one scale per block; returns (y, s)). The
kernel is defined inside `_build_triton_impls()`, only when `torch.utils._triton.has_triton()`."""

import torch
from torchao.kernel.blockwise_quantization import fp8_blockwise_act_quant

library = "torchao"  # written against torchao 0.18.0
library_module = "torchao"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x):
        y, s = fp8_blockwise_act_quant(x, block_size=128)
        return y.float(), s


def _make_inputs(rows=4, hidden=256):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, hidden, generator=g),)


def reference(x):
    xb = x.reshape(*x.shape[:-1], -1, 128)
    s = xb.abs().amax(-1) / 448.0
    y = (xb / s[..., None]).to(torch.float8_e4m3fn).float().reshape(x.shape)
    return y, s


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=2, max=4096)}}
tolerance = (0.07, 1e-5)  # one e4m3 ulp (interpreter casts may round differently)
