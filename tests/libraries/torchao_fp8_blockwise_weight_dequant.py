"""torchao: `torchao.kernel.blockwise_quantization.fp8_blockwise_weight_dequant` (float8_e4m3fn
weight times its per-128x128-block scale)."""

import torch
from torchao.kernel.blockwise_quantization import fp8_blockwise_weight_dequant

library = "torchao"  # written against torchao 0.18.0
library_module = "torchao"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, q, s):
        return fp8_blockwise_weight_dequant(q, s, block_size=128)


def _make_inputs(rows=256, cols=256):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(rows, cols, generator=g).mul(50).to(torch.float8_e4m3fn)
    s = torch.rand(rows // 128, cols // 128, generator=g) + 0.5
    return (q, s)


def reference(q, s):
    return q.float() * s.repeat_interleave(128, 0).repeat_interleave(128, 1)


model = Model()
example_inputs = _make_inputs()
_k = torch.export.Dim("k", min=2, max=32)
dynamic_shapes = {"q": {0: 128 * _k}, "s": {0: _k}}
tolerance = (1e-6, 1e-6)
