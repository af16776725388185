"""Rewrite rules run after constant folding (onnxscript's pattern rewriter).

One rule of kernel_lens's own, for the layout torch's exporter gives attention: a model that
keeps (batch, seq, heads, head_dim) tensors and calls ``scaled_dot_product_attention`` on their
``transpose(1, 2)`` lowers to ``Attention(Transpose(q), Transpose(k), Transpose(v))`` on 4-D
(batch, heads, seq, head_dim) inputs. ONNX ``Attention`` also takes that data as 3-D
(batch, seq, heads*head_dim) with ``q_num_heads``/``kv_num_heads``, the layout ORT's fused
CUDA kernels read directly, so the rule feeds it the un-transposed tensors through free
reshapes: the three input transposes go, and with them ORT's own transposes back
(``TransposeQKV``/``TransposeCtx``). The result is transposed to the 4-D layout, which onnxscript's
``transpose_transpose`` rule then cancels against the model's own ``transpose(1, 2)`` back.
Same operator, same inputs in another layout: the same results.
"""

from __future__ import annotations

from typing import Any

BSNH = [0, 2, 1, 3]  # (batch, seq, heads, dim) <-> (batch, heads, seq, dim): its own inverse


def _static_dims(value: Any) -> list[int] | None:
    """The value's (heads, head_dim) when it is 4-D and both are static, else None."""
    shape = value.shape
    if shape is None or len(shape) != 4 or not all(isinstance(d, int) for d in shape[2:]):
        return None
    return [shape[2], shape[3]]


def _rules():
    # lazy: onnxscript takes ~0.3 s to import; a cached lowering never builds the rules
    from onnxscript.rewriter import RewriteRuleSet
    from onnxscript.rewriter._basics import MatchResult
    from onnxscript.rewriter._rewrite_rule import RewriteRuleClassBase
    from onnxscript.rewriter.rules.common import (no_op_transpose_rule, reshape_reshape_rule,
                                                  transpose_transpose_rule)

    class AttentionOnSeqMajorInputs(RewriteRuleClassBase):
        """``Attention(Transpose(q), Transpose(k), Transpose(v)[, mask])`` on (b, s, n, h)
        tensors -> ``Transpose(Reshape(Attention(q', k', v'[, mask], q_num_heads, kv_num_heads)))``
        with q', k', v' the (b, s, n*h) reshapes of q, k, v."""

        def __init__(self, masked: bool):
            super().__init__(f"AttentionOnSeqMajorInputs{'Masked' if masked else ''}")
            self.masked = masked

        def pattern(self, op, q, k, v, mask):
            t = [op.Transpose(x, perm=BSNH) for x in (q, k, v)]
            return op.Attention(*t, *([mask] if self.masked else []), _allow_other_attributes=True,
                                _outputs=["y"])

        def check(self, context, q, k, v, mask, y, **_) -> MatchResult:
            result = MatchResult()
            node = y.producer()
            attrs = node.attributes
            if "q_num_heads" in attrs or "kv_num_heads" in attrs:
                return result.fail("already 3-D")
            if any(o.uses() for o in node.outputs[1:]):
                return result.fail("present key/value or QK output used")
            if attrs.get("qk_matmul_output_mode") is not None and attrs["qk_matmul_output_mode"].as_int():
                return result.fail("QK output mode")
            dims = [_static_dims(x) for x in (q, k, v)]
            if None in dims:
                return result.fail("heads and head size must be static")
            (nq, hq), (nk, hk), (nv, _) = dims
            if nk != nv or hq != hk or nq % nk:
                return result.fail("head counts or sizes do not match")
            return result

        def rewrite(self, op, q, k, v, mask, y, **_):
            node = y.producer()
            (nq, _), (nk, _), (_, hv) = (_static_dims(x) for x in (q, k, v))
            attrs = {name: attr for name, attr in node.attributes.items()}
            flat = op.Constant(value_ints=[0, 0, -1])
            ins = [op.Reshape(x, flat) for x in (q, k, v)] + ([mask] if self.masked else [])
            out = op.Attention(*ins, q_num_heads=nq, kv_num_heads=nk, **attrs)
            return op.Transpose(op.Reshape(out, op.Constant(value_ints=[0, 0, nq, hv])), perm=BSNH)

    return RewriteRuleSet([AttentionOnSeqMajorInputs.rule(False), AttentionOnSeqMajorInputs.rule(True),
                           transpose_transpose_rule, no_op_transpose_rule, reshape_reshape_rule])


def apply(model: Any) -> int:
    """Apply the rules to the onnx_ir ``model`` in place; the number of rewrites."""
    return _rules().apply_to_model(model)
