"""Liger-Kernel: `liger_kernel.transformers.functional.liger_cross_entropy` (mean reduction,
ignore_index -100), through Liger's own host wrapper (`cross_entropy_forward`). The host code
reads VALUES: `n_non_ignore = (target != ignore_index).sum().item()` is a kernel scalar (the
mean's divisor), and two `assert`s on `(target * target_mask).max() < V` and `.min() >= 0`
branch on target's values. (tests/corpus/liger_cross_entropy.py launches the same kernel
without the wrapper, because of those reads.)"""

import torch
from liger_kernel.transformers.functional import liger_cross_entropy

library = "liger-kernel"  # written against liger_kernel 0.8.5
library_module = "liger_kernel"
library_env = {}

IGNORE_INDEX = -100


class Model(torch.nn.Module):
    def forward(self, logits, target):
        return liger_cross_entropy(logits, target, ignore_index=IGNORE_INDEX, reduction="mean")


def _make_inputs(rows=8, vocab=40, ignored=(1, 5)):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g)
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[list(ignored)] = IGNORE_INDEX
    return (logits, target)


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, reduction="mean",
                                             ignore_index=IGNORE_INDEX)


model = Model()
example_inputs = _make_inputs()
extra_examples = [_make_inputs(ignored=()), _make_inputs(ignored=(0, 2, 3, 4, 6, 7))]
_rows = torch.export.Dim("rows", min=2, max=4096)
dynamic_shapes = {"logits": {0: _rows}, "target": {0: _rows}}
tolerance = (1e-5, 1e-5)
