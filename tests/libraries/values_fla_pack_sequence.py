"""fla-core: `fla.ops.utils.pack_sequence(x, cu_seqlens, padding_side='left')` (a left-padded
batch [B, S, D] packed into [total, D]). The host code reads a VALUE: the output is
`torch.empty(cu_seqlens[-1].item(), D)`, so its length is the last cu_seqlens entry (each row's
kernel program reads bos/eos from cu_seqlens). cu_seqlens (int32) is an input."""

import torch
from fla.ops.utils import pack_sequence

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, cu_seqlens):
        return pack_sequence(x, cu_seqlens, padding_side="left")


def _make_inputs(lens=(3, 8, 5), seq=8, dim=32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(len(lens), seq, dim, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return (x, cu)


def reference(x, cu_seqlens):
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
    S = x.shape[1]
    return torch.cat([x[b, S - n:] for b, n in enumerate(lens)], 0)


model = Model()
example_inputs = _make_inputs()
extra_examples = [_make_inputs(lens=(8, 8, 8)), _make_inputs(lens=(1, 2, 1))]
# static shapes: with x's seq dim dynamic, kernel_lens refuses BD = min(next_power_of_2(D), 4096),
# D = x.numel() // (B * S), as a DynamicConstexprError (although it is 32 over the whole range)
dynamic_shapes = None
tolerance = (0.0, 0.0)
