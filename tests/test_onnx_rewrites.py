"""The attention layout rewrite (onnx/rewrites.py): same results as the graph it replaces, in
ONNX Runtime, and it fires only where its preconditions hold."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kernel_lens.onnx.lower import optimize

BSNH = [0, 2, 1, 3]


def _attention_model(nq=4, nk=4, h=8, masked=False, causal=True, heads_static=True):
    """y = transpose(Attention(q^T, k^T, v^T[, mask]))^T on (batch, seq, heads, dim) inputs."""
    heads_q = nq if heads_static else "nq"
    heads_k = nk if heads_static else "nk"
    ins = [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["b", "s", heads_q, h]),
           helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", "s", heads_k, h]),
           helper.make_tensor_value_info("v", TensorProto.FLOAT, ["b", "s", heads_k, h])]
    nodes = [helper.make_node("Transpose", [x], [x + "_t"], perm=BSNH) for x in "qkv"]
    att_in = ["q_t", "k_t", "v_t"]
    if masked:
        ins.append(helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["b", 1, "s", "s"]))
        att_in.append("mask")
    nodes += [helper.make_node("Attention", att_in, ["a"], is_causal=int(causal)),
              helper.make_node("Transpose", ["a"], ["y"], perm=BSNH)]
    graph = helper.make_graph(nodes, "g", ins,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["b", "s", heads_q, h])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    model.ir_version = 10
    return model


def _run(model, feeds):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)[0]


def _feeds(nq, nk, h, masked, b=2, s=7, seed=0):
    rng = np.random.default_rng(seed)
    feeds = {"q": rng.standard_normal((b, s, nq, h), dtype=np.float32),
             "k": rng.standard_normal((b, s, nk, h), dtype=np.float32),
             "v": rng.standard_normal((b, s, nk, h), dtype=np.float32)}
    if masked:
        feeds["mask"] = rng.standard_normal((b, 1, s, s), dtype=np.float32)
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
