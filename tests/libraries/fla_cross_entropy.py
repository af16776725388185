"""fla-core: `fla.modules.fused_cross_entropy.cross_entropy_loss` (per-row loss and z-loss;
the `FusedCrossEntropyLoss` module asserts CUDA tensors, so its functional form is used)."""

import torch
from fla.modules.fused_cross_entropy import cross_entropy_loss

library = "fla-core"  # written against fla-core 0.6.0
library_module = "fla"
library_env = {}


class Model(torch.nn.Module):
    def forward(self, logits, target):
        loss, _z = cross_entropy_loss(logits, target)
        return loss


def _make_inputs(rows=8, vocab=128):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, vocab, generator=g), torch.randint(0, vocab, (rows,), generator=g))


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, reduction="none")


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("rows", min=2, max=4096)
dynamic_shapes = {"logits": {0: _n}, "target": {0: _n}}
tolerance = (1e-5, 1e-5)
