"""conch-triton-kernels: `conch.ops.quantization.bitsandbytes.functional.quantize_4bit` (bitsandbytes NF4
blockwise quantization, blocksize 64: per-block absmax, nearest NF4 code by a chain of scalar
`if`/`return`s in a @triton.jit helper, two codes packed per uint8)."""

import torch
from conch.ops.quantization.bitsandbytes.functional import quantize_4bit

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

BLOCK = 64
# midpoints between consecutive NF4 codes, as in the kernel's comparisons
THRESHOLDS = torch.tensor([-0.8480964004993439, -0.6106329262256622, -0.4599952697753906,
                           -0.33967943489551544, -0.23460740596055984, -0.13791173323988914,
                           -0.045525018125772476, 0.03979014977812767, 0.1202552504837513,
                           0.2035212516784668, 0.2920137718319893, 0.3893125355243683,
                           0.5016634166240692, 0.6427869200706482, 0.8614784181118011])


class Model(torch.nn.Module):
    def forward(self, x):
        packed, state = quantize_4bit(x, blocksize=BLOCK, quant_type="nf4")
        return packed, state.absmax


def _make_inputs(blocks=4):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(blocks * BLOCK, generator=g),)


def reference(x):
    blocks = x.view(-1, BLOCK)
    absmax = blocks.abs().amax(dim=1)
    codes = torch.bucketize((blocks * (1.0 / absmax[:, None])).flatten(), THRESHOLDS).view(-1, 2)
    packed = ((codes[:, 0] << 4) | codes[:, 1]).to(torch.uint8).view(-1, 1)
    return packed, absmax


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: 64 * torch.export.Dim("blocks", min=2, max=512)}}
tolerance = (0, 1e-6)
