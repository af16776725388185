"""Fused cross-entropy: per-row ``logsumexp(logits) - logits[target]``.

Covers case 15: fp32 logits (rows, vocab), int64 targets (rows,), fp32 per-row loss (rows,).
One program per row walks the vocabulary in ``BLOCK_V`` chunks with an online logsumexp, so the
vocabulary size can be dynamic, then gathers the target logit with an int64 index.
"""

import torch
import triton
import triton.language as tl


@triton.jit
def cross_entropy_kernel(logits_ptr, targets_ptr, loss_ptr, n_cols, stride_row, BLOCK_V: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = logits_ptr + row * stride_row

    running_max = float("-inf")
    running_sum = 0.0
    for start in range(0, n_cols, BLOCK_V):
        cols = start + tl.arange(0, BLOCK_V)
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(running_max, tl.max(x, axis=0))
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(tl.exp(x - new_max), axis=0)
        running_max = new_max
    lse = running_max + tl.log(running_sum)

    target = tl.load(targets_ptr + row)
    target_logit = tl.load(row_ptr + target).to(tl.float32)
    tl.store(loss_ptr + row, lse - target_logit)


class Model(torch.nn.Module):
    def forward(self, logits, targets):
        n_rows, n_cols = logits.shape
        loss = torch.empty(n_rows, device=logits.device, dtype=torch.float32)
        cross_entropy_kernel[(n_rows,)](logits, targets, loss, n_cols, logits.stride(0), BLOCK_V=64)
        return loss


def _make_inputs(rows=8, vocab=150):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g) * 3
    targets = torch.randint(0, vocab, (rows,), generator=g, dtype=torch.int64)
    return logits, targets


def reference(logits, targets):
    return torch.nn.functional.cross_entropy(logits.float(), targets, reduction="none")


model = Model()
example_inputs = _make_inputs()
_rows = torch.export.Dim("rows", min=2, max=4096)
dynamic_shapes = {
    "logits": {0: _rows, 1: torch.export.Dim("vocab", min=2, max=1 << 18)},
    "targets": {0: _rows},
}
expected_roles = {
    "cross_entropy_kernel": {"logits_ptr": "input", "targets_ptr": "input", "loss_ptr": "output"}
}
tolerance = (1e-5, 1e-5)
