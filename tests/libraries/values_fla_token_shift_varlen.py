"""fla-core: `fla.modules.token_shift.token_shift(x, cu_seqlens)` on a packed varlen batch
[1, T, D] (x[t-1] - x[t] within each sequence, zero before its start). The host code reads
VALUES: `T = torch.max(cu_seqlens.diff()).item()` (the longest sequence) is the grid's second
dim and a kernel scalar, `use_short_kernel = T <= 4096` picks the kernel, and the constexpr
`IS_DECODE = T == 1` is computed from that value. cu_seqlens (int32) is an input. kernel_lens
compiles the example's truth value and checks it at run time (extra_examples trace the other)."""

import torch
from fla.modules.token_shift import token_shift

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, cu_seqlens):
        return token_shift(x, cu_seqlens)


def _make_inputs(lens=(3, 6, 5), hidden=32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, sum(lens), hidden, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    return (x, cu)


def reference(x, cu_seqlens):
    out = torch.empty_like(x)
    bounds = cu_seqlens.tolist()
    for bos, eos in zip(bounds[:-1], bounds[1:]):
        seq = x[:, bos:eos]
        out[:, bos:eos] = torch.nn.functional.pad(seq, (0, 0, 1, -1)) - seq
    return out


model = Model()
example_inputs = _make_inputs()
# the same 14 tokens: the longest sequence 6 (example), 12, and 1 (IS_DECODE: every sequence one
# token long, needs as many sequences as tokens: another cu_seqlens length, not an extra here)
extra_examples = [_make_inputs(lens=(1, 1, 12)), _make_inputs(lens=(5, 5, 4))]
dynamic_shapes = {"x": {1: torch.export.Dim("tokens", min=2, max=2048)}, "cu_seqlens": None}
tolerance = (1e-6, 1e-6)
