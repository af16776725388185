"""Liger-Kernel's cross-entropy forward kernel, unchanged (``liger_cross_entropy_kernel``).

Liger's Python wrapper (``cross_entropy_forward``) asserts on tensor values and passes
``target_mask.sum().item()`` to the kernel, a data-dependent count torch.export cannot trace. This
model launches the same kernel the way the wrapper does for ``reduction="none"``, where that count
only scales the mean's gradient. The kernel writes into its logits argument (Liger stores the
gradient there and zeros ignored rows), so the model hands it a copy. The per-row losses are the
output; a row whose target is ``ignore_index`` keeps loss 0.
"""

import torch
import triton
from liger_kernel.ops.cross_entropy import MAX_FUSED_SIZE, liger_cross_entropy_kernel

IGNORE_INDEX = -100


class Model(torch.nn.Module):
    def forward(self, logits, target):
        n_rows, vocab = logits.shape
        x = logits.clone()  # the kernel writes X (gradient trick, ignored rows zeroed)
        loss = torch.zeros(n_rows, dtype=logits.dtype, device=logits.device)
        liger_cross_entropy_kernel[(n_rows,)](
            X_ptr=x, X_stride=x.stride(-2), Y_ptr=target, Y_stride=target.stride(-1),
            weight_ptr=None, loss_ptr=loss, z_loss_ptr=None, loss_stride=loss.stride(-1),
            token_accuracy_ptr=None, token_accuracy_stride=0,
            predicted_tokens_ptr=None, predicted_tokens_stride=0,
            n_cols=vocab, n_non_ignore=n_rows, sum_non_ignore_weight=n_rows, weight_sum=0.0,
            ignore_index=IGNORE_INDEX, lse_square_scale=0.0, label_smoothing=0.0, reduction="none",
            softcap=None, RETURN_Z_LOSS=False, RETURN_TOKEN_ACCURACY=False,
            RETURN_PREDICTED_TOKENS=False,
            BLOCK_SIZE=min(MAX_FUSED_SIZE, triton.next_power_of_2(vocab)),
            HAS_WEIGHT=False, HAS_SOFTCAPPING=False, HAS_GRADIENTS=False, num_warps=32,
        )
        return loss


def _make_inputs(rows=6, vocab=40):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(rows, vocab, generator=g)
    target = torch.randint(0, vocab, (rows,), generator=g)
    target[1] = IGNORE_INDEX
    return (logits, target)


def reference(logits, target):
    return torch.nn.functional.cross_entropy(logits, target, reduction="none",
                                             ignore_index=IGNORE_INDEX)


model = Model()
example_inputs = _make_inputs()
_rows = torch.export.Dim("rows", min=2, max=4096)
dynamic_shapes = {"logits": {0: _rows}, "target": {0: _rows}}
expected_roles = {
    "liger_cross_entropy_kernel": {"X_ptr": "inplace", "Y_ptr": "input", "loss_ptr": "output"},
}
tolerance = (1e-5, 1e-5)
