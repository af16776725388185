"""conch-triton-kernels: `conch.ops.quantization.bitsandbytes.functional.dequantize_4bit` (bitsandbytes NF4
blockwise dequantization, blocksize 64, two codes per uint8, high nibble first; the kernel walks
each block element by element in a `range()` over a runtime size)."""

import torch
from conch.ops.quantization.bitsandbytes.functional import dequantize_4bit

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

BLOCK = 64
NF4 = torch.tensor([-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
                    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
                    0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
                    0.33791524171829224, 0.44070982933044434, 0.5626170039176941,
                    0.7229568362236023, 1.0])


class Model(torch.nn.Module):
    def forward(self, packed, absmax):
        out = torch.empty(packed.shape[0] * 2, dtype=torch.float32, device=packed.device)
        return dequantize_4bit(packed, absmax=absmax, out=out, blocksize=BLOCK, quant_type="nf4")


def _make_inputs(blocks=4):
    g = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (blocks * BLOCK // 2, 1), generator=g).to(torch.uint8)
    absmax = 0.5 + torch.rand(blocks, generator=g)
    return (packed, absmax)


def reference(packed, absmax):
    p = packed.flatten().to(torch.int64)
    codes = torch.stack((p >> 4, p & 15), dim=1).flatten()
    return NF4[codes] * absmax.repeat_interleave(BLOCK)


model = Model()
example_inputs = _make_inputs()
_b = torch.export.Dim("blocks", min=2, max=512)
dynamic_shapes = {"packed": {0: 32 * _b}, "absmax": {0: _b}}
tolerance = (1e-6, 1e-6)
