"""The attention layout rewrite (onnx/rewrites.py): same results as the graph it replaces, in
ONNX Runtime, and it fires only where its preconditions hold."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kernel_lens.onnx.lower import optimize
from kernel_lens.onnx.rewrites import MS_DOMAIN, for_onnxruntime

BSNH = [0, 2, 1, 3]


def _attention_model(nq=4, nk=4, h=8, masked=False, causal=True, heads_static=True,
                     dtype=TensorProto.FLOAT, kv_len="s"):
    """y = transpose(Attention(q^T, k^T, v^T[, mask]))^T on (batch, seq, heads, dim) inputs."""
    heads_q = nq if heads_static else "nq"
    heads_k = nk if heads_static else "nk"
    ins = [helper.make_tensor_value_info("q", dtype, ["b", "s", heads_q, h]),
           helper.make_tensor_value_info("k", dtype, ["b", kv_len, heads_k, h]),
           helper.make_tensor_value_info("v", dtype, ["b", kv_len, heads_k, h])]
    nodes = [helper.make_node("Transpose", [x], [x + "_t"], perm=BSNH) for x in "qkv"]
    att_in = ["q_t", "k_t", "v_t"]
    if masked:
        ins.append(helper.make_tensor_value_info("mask", dtype, ["b", 1, "s", kv_len]))
        att_in.append("mask")
    nodes += [helper.make_node("Attention", att_in, ["a"], is_causal=int(causal)),
              helper.make_node("Transpose", ["a"], ["y"], perm=BSNH)]
    graph = helper.make_graph(nodes, "g", ins,
                              [helper.make_tensor_value_info("y", dtype, ["b", "s", heads_q, h])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(nq, nk, h, masked, b=2, s=7, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal((b, s, nq, h)).astype(dtype),
             "k": rng.standard_normal((b, s, nk, h)).astype(dtype),
             "v": rng.standard_normal((b, s, nk, h)).astype(dtype)}
    if masked:
        feeds["mask"] = rng.standard_normal((b, 1, s, s)).astype(dtype)
    return feeds


def _ops(model):
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("nq,nk,masked,causal", [(4, 4, False, True), (4, 4, True, False),
                                                 (4, 2, False, True), (6, 3, True, False)])
def test_attention_reads_the_model_layout_with_the_same_results(nq, nk, masked, causal):
    model = _attention_model(nq, nk, masked=masked, causal=causal)
    rewritten = optimize(model)
    assert "Transpose" not in _ops(rewritten)  # the input transposes and the pair around the output
    (att,) = [n for n in rewritten.graph.node if n.op_type == "Attention"]
    attrs = {a.name: a.i for a in att.attribute}
    assert (attrs["q_num_heads"], attrs["kv_num_heads"], attrs["is_causal"]) == (nq, nk, int(causal))
    for s in (1, 7, 33):
        feeds = _feeds(nq, nk, 8, masked, s=s, seed=s)
        np.testing.assert_allclose(_run(rewritten, feeds), _run(model, feeds), rtol=1e-6, atol=1e-6)


def test_dynamic_head_count_is_left_alone():
    # q_num_heads must be an attribute: with a symbolic head count the 4-D form stays
    rewritten = optimize(_attention_model(heads_static=False))
    assert _ops(rewritten).count("Transpose") == 4
    (att,) = [n for n in rewritten.graph.node if n.op_type == "Attention"]
    assert "q_num_heads" not in {a.name for a in att.attribute}


def test_other_permutations_are_left_alone():
    model = _attention_model()
    for node in model.graph.node[:3]:
        node.attribute[0].ints[:] = [0, 1, 2, 3]  # no-op transposes: not the pattern
    rewritten = optimize(model)
    (att,) = [n for n in rewritten.graph.node if n.op_type == "Attention"]
    assert "q_num_heads" not in {a.name for a in att.attribute}
    onnx.checker.check_model(rewritten)


# --- the ORT target's rule: fp16 attention as com.microsoft.MultiHeadAttention ---------------

@pytest.mark.parametrize("causal", [True, False])
def test_fp16_attention_becomes_multi_head_attention_for_ort_with_the_same_results(causal):
    base = optimize(_attention_model(4, 4, h=8, causal=causal, dtype=TensorProto.FLOAT16))
    model = for_onnxruntime(base)
    (mha,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert mha.domain == MS_DOMAIN and "Attention" not in _ops(model)
    assert {a.name: a.i for a in mha.attribute} == {"num_heads": 4, "unidirectional": int(causal)}
    assert {o.domain: o.version for o in model.opset_import}[MS_DOMAIN] == 1
    onnx.checker.check_model(model)
    for s in (1, 7, 33):
        feeds = _feeds(4, 4, 8, False, s=s, seed=s, dtype=np.float16)
        np.testing.assert_allclose(_run(model, feeds).astype(np.float32),
                                   _run(base, feeds).astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("case", ["fp32", "masked", "grouped", "causal_other_length"])
def test_ort_rule_leaves_attention_it_cannot_match_exactly(case):
    kw = {"fp32": dict(dtype=TensorProto.FLOAT),
          "masked": dict(dtype=TensorProto.FLOAT16, masked=True, causal=False),
          "grouped": dict(dtype=TensorProto.FLOAT16, nq=4, nk=2),
          # ONNX aligns the causal mask at the top left, MultiHeadAttention at the bottom right
          "causal_other_length": dict(dtype=TensorProto.FLOAT16, kv_len="l")}[case]
    base = optimize(_attention_model(**kw))
    model = for_onnxruntime(base)
    assert model is base  # nothing matched: the very same model
    assert "Attention" in _ops(model) and "MultiHeadAttention" not in _ops(model)


def test_ort_rule_keeps_an_explicit_scale():
    base = optimize(_attention_model(dtype=TensorProto.FLOAT16))
    (att,) = [n for n in base.graph.node if n.op_type == "Attention"]
    att.attribute.append(helper.make_attribute("scale", 0.25))
    model = for_onnxruntime(base)
    (mha,) = [n for n in model.graph.node if n.op_type == "MultiHeadAttention"]
    assert {a.name: a for a in mha.attribute}["scale"].f == 0.25
    feeds = _feeds(4, 4, 8, False, dtype=np.float16)
    np.testing.assert_allclose(_run(model, feeds).astype(np.float32),
                               _run(base, feeds).astype(np.float32), rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("attribute, value", [("softcap", 30.0), ("qk_matmul_output_mode", 1),
                                              ("softmax_precision", 1)])
def test_ort_rule_refuses_an_attention_attribute_it_cannot_express(attribute, value):
    # MultiHeadAttention has no softcap, QK output mode or softmax precision
    base = optimize(_attention_model(dtype=TensorProto.FLOAT16))
    (att,) = [n for n in base.graph.node if n.op_type == "Attention"]
    att.attribute.append(helper.make_attribute(attribute, value))
    model = for_onnxruntime(base)
    assert model is base and "MultiHeadAttention" not in _ops(model)


def test_ort_rule_refuses_a_value_head_size_other_than_the_querys():
    base = optimize(_attention_model(dtype=TensorProto.FLOAT16))
    v = next(i for i in base.graph.input if i.name == "v")
    v.type.tensor_type.shape.dim[3].dim_value = 16  # q and k: 8
    for node in base.graph.node:  # the reshape merging v's (heads, head size) says so too
        if node.op_type == "Reshape" and node.input[0] == "v":
            shape = next((t for t in base.graph.initializer if t.name == node.input[1]), None)
            if shape is not None:
                values = onnx.numpy_helper.to_array(shape).copy()
                values[-1] = 4 * 16 if values[-1] > 0 else values[-1]
                shape.CopyFrom(onnx.numpy_helper.from_array(values, shape.name))
    model = for_onnxruntime(base)
    assert model is base and "MultiHeadAttention" not in _ops(model)
