"""fla-core: `fla.ops.utils.unpack_sequence(x, cu_seqlens, padding_side='right')` (packed tokens
[total, D] unpacked into a right-padded zero-filled batch [N, S, D]). With no desired_shape the
host code reads VALUES: `S = prepare_lens(cu_seqlens).max().item()` (the longest sequence) sizes
the output [len(cu_seqlens) - 1, S, D], the grid `ND * S * B` and the kernel scalar S, and
`D = y.numel() // (B * S)` is computed from that value. cu_seqlens (int64) is an input.
`BD = min(next_power_of_2(D), 4096)` is 32 for every S (one binary); the zero-filled output's
torch strides read `32*Max(1, S)`, dense for every S."""

import torch
from fla.ops.utils import unpack_sequence

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, x, cu_seqlens):
        return unpack_sequence(x, cu_seqlens, padding_side="right")


def _make_inputs(lens=(3, 7, 6), dim=32):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(sum(lens), dim, generator=gen)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int64)
    return (x, cu)


def reference(x, cu_seqlens):
    bounds = cu_seqlens.tolist()
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:])]
    out = x.new_zeros(len(lens), max(lens), x.shape[1])
    for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
        out[i, :b - a] = x[a:b]
    return out


model = Model()
example_inputs = _make_inputs()
extra_examples = [_make_inputs(lens=(16, 0, 0)), _make_inputs(lens=(5, 6, 5))]
dynamic_shapes = {"x": {0: torch.export.Dim("tokens", min=2, max=4096)}, "cu_seqlens": None}
tolerance = (0.0, 0.0)
