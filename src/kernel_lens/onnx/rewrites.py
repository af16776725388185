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

import onnx
import onnx_ir as oir

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


# --- ONNX Runtime only ----------------------------------------------------------------------
# ORT 1.31's CUDA kernel for ONNX Attention runs fp16 attention with ORT's own flash kernel; its
# contrib operator com.microsoft.MultiHeadAttention runs the same attention with cuDNN's fused
# SDPA kernel, the one torch's scaled_dot_product_attention picks on sm_90. Measured on the H200
# (benchmarks/bench_block_lowering.py, LLaMA block at 2048 tokens, fp16, causal, 32 heads of
# 128): 0.083 ms against 0.173 ms, outputs bit-identical to eager's. The rule below spells the
# 3-D Attention that :func:`apply` makes as MultiHeadAttention where the two mean the same thing;
# only the ORT target applies it (TensorRT's parser knows no com.microsoft operators).
MS_DOMAIN = "com.microsoft"


def _is_causal(attrs: Any) -> bool:
    return attrs.get("is_causal") is not None and attrs["is_causal"].as_int() == 1


def _ort_rules():
    # lazy: onnxscript takes ~0.3 s to import
    from onnxscript.rewriter import RewriteRuleSet
    from onnxscript.rewriter._basics import MatchResult
    from onnxscript.rewriter._rewrite_rule import RewriteRuleClassBase

    class MultiHeadAttentionForOrt(RewriteRuleClassBase):
        """``Attention(Reshape(q), Reshape(k), Reshape(v), q_num_heads=n, kv_num_heads=n)`` on
        fp16 (b, s, n, h) tensors flattened to (b, s, n*h), no mask, no past, no QK output, no
        softcap -> ``com.microsoft.MultiHeadAttention(..., num_heads=n, unidirectional=is_causal)``.
        Causal only where q and k provably have the same length (ONNX's causal mask is aligned
        at the top left, MultiHeadAttention's at the bottom right; they agree when the lengths
        are equal)."""

        def __init__(self):
            super().__init__("MultiHeadAttentionForOrt")

        def pattern(self, op, q, k, v, sq, sk, sv):
            return op.Attention(op.Reshape(q, sq), op.Reshape(k, sk), op.Reshape(v, sv),
                                _allow_other_attributes=True, _outputs=["y"])

        def check(self, context, q, k, v, sq, sk, sv, y, **_) -> MatchResult:
            result = MatchResult()
            node = y.producer()
            attrs = node.attributes
            if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
                return result.fail("present key/value or QK output used")
            n, kv = attrs.get("q_num_heads"), attrs.get("kv_num_heads")
            if n is None or kv is None or n.as_int() != kv.as_int():
                return result.fail("not 3-D, or grouped-query attention")
            if (attrs.get("softcap") is not None and attrs["softcap"].as_float() != 0.0) \
                    or (attrs.get("qk_matmul_output_mode") is not None
                        and attrs["qk_matmul_output_mode"].as_int()) \
                    or attrs.get("softmax_precision") is not None:
                return result.fail("softcap, QK output mode or softmax precision")
            if any(x.dtype != oir.DataType.FLOAT16 for x in (q, k, v)):
                return result.fail("measured faster for fp16 only")
            shapes = [x.shape for x in (q, k, v)]
            if any(s is None or len(s) != 4 or not all(isinstance(d, int) for d in s[2:]) for s in shapes):
                return result.fail("heads and head size must be static")
            if len({(s[2], s[3]) for s in shapes}) != 1 or shapes[0][2] != n.as_int():
                return result.fail("q, k and v must share heads and head size")
            for shape, flat in zip(shapes, (sq, sk, sv)):
                value = flat.const_value
                want = [[0, 0, -1], [0, 0, shape[2] * shape[3]]]
                if value is None or value.numpy().tolist() not in want:
                    return result.fail("the reshapes must merge (heads, head size) only")
            if _is_causal(attrs) and not (shapes[0][1] == shapes[1][1] and shapes[0][0] == shapes[1][0]):
                return result.fail("causal with q and k lengths not provably equal")
            return result

        def rewrite(self, op, q, k, v, sq, sk, sv, y, **_):
            attrs = y.producer().attributes
            extra = {"scale": attrs["scale"].as_float()} if attrs.get("scale") is not None else {}
            return op.MultiHeadAttention(op.Reshape(q, sq), op.Reshape(k, sk), op.Reshape(v, sv),
                                         num_heads=attrs["q_num_heads"].as_int(),
                                         unidirectional=int(_is_causal(attrs)), _domain=MS_DOMAIN,
                                         **extra)

    return RewriteRuleSet([MultiHeadAttentionForOrt.rule()])


def for_onnxruntime(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with the ORT-only rule applied: a new model importing the com.microsoft opset
    when the rule fired (``model`` is left as it was), else ``model`` itself."""
    graph = oir.serde.deserialize_model(model)
    if not _ort_rules().apply_to_model(graph):
        return model
    graph.opset_imports.setdefault(MS_DOMAIN, 1)
    out = oir.serde.serialize_model(graph)
    out.ir_version = model.ir_version
    return out
