"""flashnn: `flashnn.LogitsProcessor("REPETITION")` (repetition penalty applied in place to the
logits of each request at the token ids it has seen; the ids are reached through a tensor of raw
int64 addresses, one per request, which the kernel casts with `.to(tl.pointer_type(tl.int64))`,
as flashnn's callers build it from `data_ptr()`). The model penalizes a clone of its logits."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}

VOCAB, MAX_IDS = 512, 32


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proc = flashnn.LogitsProcessor("REPETITION")

    def forward(self, scores, penalty, ids, ids_length):
        scores = scores.clone()
        rows = torch.arange(ids.shape[0], device=ids.device)
        ids_ptr = ids.data_ptr() + rows * (ids.stride(0) * ids.element_size())
        self.proc(scores, penalty, ids_ptr, ids_length, MAX_IDS)
        return scores


def _make_inputs(batch=4):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(batch, VOCAB, generator=g)
    penalty = 1.0 + torch.rand(batch, generator=g)
    ids = torch.randint(0, VOCAB, (batch, MAX_IDS), generator=g)
    ids_length = torch.randint(1, MAX_IDS + 1, (batch,), generator=g, dtype=torch.int32)
    return (scores, penalty, ids, ids_length)


def reference(scores, penalty, ids, ids_length):
    out = scores.clone()
    for b in range(scores.shape[0]):
        i = ids[b, : int(ids_length[b])]
        s = scores[b, i]
        out[b, i] = torch.where(s <= 0, s * penalty[b], s / penalty[b])
    return out


model = Model()
example_inputs = _make_inputs()
_b = torch.export.Dim("batch", min=2, max=256)
dynamic_shapes = {"scores": {0: _b}, "penalty": {0: _b}, "ids": {0: _b}, "ids_length": {0: _b}}
tolerance = (1e-6, 1e-6)
