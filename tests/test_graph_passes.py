"""Graph optimizations of the lowered ONNX graph (issue 26, kernel_lens.onnx.graph_passes): each
pass rewrites what it should, leaves alone what it must not, and the rewritten graph computes what
the original did (ONNX Runtime's CPU EP runs both); the choice of passes reaches the lowering
through the IR (optimize= / --opt-level)."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import onnx_ir as oir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from kernel_lens.errors import InputError, PostconditionError
from kernel_lens.onnx import graph_passes as gp

OPSET = 23


def _model(nodes, inputs, outputs, initializers=(), value_info=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers), value_info=list(value_info))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=10)


def _optimize(model: onnx.ModelProto, names) -> tuple[onnx.ModelProto, list[gp.GraphPassTiming]]:
    graph = oir.serde.deserialize_model(model)
    timings = gp.GraphPassManager(names).run_on(graph)
    out = oir.serde.serialize_model(graph)
    onnx.checker.check_model(out)
    return out, timings


def _run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def _ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


# ----------------------------------------------------------------------------- sibling GEMMs


def _siblings(widths=(64, 16, 16), k=32, graph_output_direct=False):
    """x [B, 1, K] times one weight per width (q/k/v-like), each product through a Relu (or,
    with ``graph_output_direct``, the first product a graph output itself)."""
    rng = np.random.default_rng(0)
    weights = [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [k, n], rng.standard_normal((k, n)).astype(np.float32).ravel())
               for i, n in enumerate(widths)]
    nodes, outputs = [], []
    for i, n in enumerate(widths):
        nodes.append(helper.make_node("MatMul", ["x", f"w{i}"], [f"m{i}"], name=f"mm{i}"))
        if graph_output_direct and i == 0:
            outputs.append(helper.make_tensor_value_info(f"m{i}", TensorProto.FLOAT, ["B", 1, n]))
            continue
        nodes.append(helper.make_node("Relu", [f"m{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, ["B", 1, n]))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 1, k])
    info = [helper.make_tensor_value_info(f"m{i}", TensorProto.FLOAT, ["B", 1, n]) for i, n in enumerate(widths)]
    return _model(nodes, [x], outputs, weights, info)


def test_sibling_matmuls_become_one_matmul_and_a_split_with_the_same_results():
    model = _siblings()
    fused, timings = _optimize(model, ["fuse_sibling_matmuls"])
    assert _ops(fused)["MatMul"] == 1 and _ops(fused)["Split"] == 1
    assert [(t.name, t.rewrites) for t in timings] == [("fuse_sibling_matmuls", 1)]
    (w,) = [t for t in fused.graph.initializer if t.dims == [32, 96]]  # the weights side by side
    assert {t.name for t in fused.graph.initializer} == {w.name, *{t.name for t in fused.graph.initializer
                                                                    if t.data_type == TensorProto.INT64}}
    split = next(n for n in fused.graph.node if n.op_type == "Split")
    assert list(split.output) == ["m0", "m1", "m2"]  # the products keep their names
    x = np.random.default_rng(1).standard_normal((3, 1, 32)).astype(np.float32)
    for a, b in zip(_run(model, {"x": x}), _run(fused, {"x": x})):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_matmuls_that_must_not_fuse_are_left_alone():
    # a product that is a graph output keeps its node; the other two still fuse
    fused, _ = _optimize(_siblings(graph_output_direct=True), ["fuse_sibling_matmuls"])
    assert _ops(fused)["MatMul"] == 2 and _ops(fused)["Split"] == 1
    # different depths K: no siblings
    rng = np.random.default_rng(0)
    w0 = helper.make_tensor("w0", TensorProto.FLOAT, [8, 4], rng.standard_normal(32).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["x", "w0"], ["a"]), helper.make_node("MatMul", ["x", "w1"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
                           helper.make_tensor_value_info("w1", TensorProto.FLOAT, [8, 4])],  # not constant
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])], [w0])
    same, timings = _optimize(model, ["fuse_sibling_matmuls"])
    assert _ops(same)["MatMul"] == 2 and timings[0].rewrites == 0


# ----------------------------------------------------------------------------- grouped-query attention


def _gqa(batch="B", length=1, kv_heads=2, groups=3, seq=10, head=8, mask="bool", causal=0,
         mask_rows=1):
    """Attention over K/V caches repeated with repeat_kv's Unsqueeze -> Expand -> Reshape, the
    way the lowering spells it (the target shapes computed at run time from the batch)."""
    heads = kv_heads * groups
    nodes = [helper.make_node("Shape", ["k"], ["kshape"], start=0, end=1)]
    inits = [helper.make_tensor("axes", TensorProto.INT64, [1], [2]),
             helper.make_tensor("tail5", TensorProto.INT64, [4], [kv_heads, groups, seq, head]),
             helper.make_tensor("tail4", TensorProto.INT64, [3], [heads, seq, head])]
    nodes += [helper.make_node("Concat", ["kshape", "tail5"], ["s5"], axis=0),
              helper.make_node("Concat", ["kshape", "tail4"], ["s4"], axis=0)]
    info = []
    for c in "kv":
        nodes += [helper.make_node("Unsqueeze", [c, "axes"], [f"{c}u"]),
                  helper.make_node("Expand", [f"{c}u", "s5"], [f"{c}e"]),
                  helper.make_node("Reshape", [f"{c}e", "s4"], [f"{c}r"])]
        info += [helper.make_tensor_value_info(f"{c}u", TensorProto.FLOAT, [batch, kv_heads, 1, seq, head]),
                 helper.make_tensor_value_info(f"{c}e", TensorProto.FLOAT, [batch, kv_heads, groups, seq, head]),
                 helper.make_tensor_value_info(f"{c}r", TensorProto.FLOAT, [batch, heads, seq, head])]
    inputs = [helper.make_tensor_value_info("q", TensorProto.FLOAT, [batch, heads, length, head]),
              helper.make_tensor_value_info("k", TensorProto.FLOAT, [batch, kv_heads, seq, head]),
              helper.make_tensor_value_info("v", TensorProto.FLOAT, [batch, kv_heads, seq, head])]
    att_inputs = ["q", "kr", "vr"]
    if mask:
        kind = TensorProto.BOOL if mask == "bool" else TensorProto.FLOAT
        inputs.append(helper.make_tensor_value_info("mask", kind, [1, 1, mask_rows, seq]))
        att_inputs.append("mask")
    nodes.append(helper.make_node("Attention", att_inputs, ["y"], is_causal=causal))
    out = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, heads, length, head])]
    return _model(nodes, inputs, out, inits, info)


def _gqa_feeds(batch=2, length=1, kv_heads=2, groups=3, seq=10, head=8, mask="bool", mask_rows=1):
    rng = np.random.default_rng(7)
    feeds = {"q": rng.standard_normal((batch, kv_heads * groups, length, head)).astype(np.float32),
             "k": rng.standard_normal((batch, kv_heads, seq, head)).astype(np.float32),
             "v": rng.standard_normal((batch, kv_heads, seq, head)).astype(np.float32)}
    visible = np.arange(seq)[None, :] <= np.arange(mask_rows)[:, None] + 5  # a row per query row
    if mask == "bool":
        feeds["mask"] = visible.reshape(1, 1, mask_rows, seq)
    elif mask == "float":
        feeds["mask"] = np.where(visible, 0.0, -np.inf).astype(np.float32).reshape(1, 1, mask_rows, seq)
    return feeds


@pytest.mark.parametrize("mask", ["bool", "float", None])
@pytest.mark.parametrize("length", [1, 2, "L"])
def test_grouped_query_attention_reads_the_kv_heads_without_expanding_them(mask, length):
    # decode (one query row, one mask row) and prefill (a mask row per query row, static or not)
    rows = 1 if length == 1 else length
    model = _gqa(mask=mask, length=length, mask_rows=rows)
    folded, timings = _optimize(model, ["gqa_without_expand"])
    assert timings[0].rewrites == 1
    # K/V are read as they are; the mask's rows are repeated by an Expand (never a Tile: ORT's
    # CUDA EP has no bool Tile, and one CPU node keeps the session out of CUDA graphs)
    assert _ops(folded)["Tile"] == 0
    expands = [n for n in folded.graph.node if n.op_type == "Expand"]
    assert len(expands) == (1 if mask else 0)
    assert all("mask" in n.output[0] for n in expands)
    attention = next(n for n in folded.graph.node if n.op_type == "Attention")
    assert list(attention.input[1:3]) == ["k", "v"]  # the caches as they are
    assert [o.name for o in folded.graph.output] == ["y"]
    n = 1 if length == 1 else 2
    feeds = _gqa_feeds(mask=mask, length=n, mask_rows=n)
    (want,), (got,) = _run(model, feeds), _run(folded, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_one_mask_row_for_many_query_rows_is_expanded_to_the_folded_rows():
    # the model's own graph would not run on ORT (it wants a row per query row), so the fold is
    # checked by its structure: the one row expanded to G*L rows at run time
    folded, timings = _optimize(_gqa(length="L", mask_rows=1), ["gqa_without_expand"])
    assert timings[0].rewrites == 1 and _ops(folded)["Expand"] == 1 and _ops(folded)["Shape"] == 2


@pytest.mark.parametrize("case", [dict(causal=1), dict(mask_rows=3, length=2)])
def test_attention_the_fold_would_change_is_left_alone(case):
    # causal masks move with the folded rows; a mask whose rows are neither 1 nor the query length
    model = _gqa(**case)
    same, timings = _optimize(model, ["gqa_without_expand"])
    assert timings[0].rewrites == 0 and _ops(same)["Expand"] == 2


# ----------------------------------------------------------------------------- choosing and running


def test_levels_and_names_resolve_and_bad_ones_are_refused():
    assert gp.resolve(0) == []
    assert gp.resolve(None) == gp.resolve(gp.DEFAULT_LEVEL) == ["fuse_sibling_matmuls", "gqa_without_expand"]
    assert gp.resolve(["gqa_without_expand"]) == ["gqa_without_expand"]
    with pytest.raises(InputError, match=r"optimize=7: the levels are 0, 1"):
        gp.resolve(7)
    with pytest.raises(InputError, match=r"graph pass 'fuse_gemms', which does not exist; graph passes: "
                                         r"fuse_sibling_matmuls, gqa_without_expand"):
        gp.resolve(["fuse_gemms"])
    with pytest.raises(InputError, match="named twice"):
        gp.resolve(["gqa_without_expand", "gqa_without_expand"])
    with pytest.raises(InputError, match="give a level"):
        gp.resolve(True)


def test_a_pass_that_breaks_the_graph_is_named(monkeypatch):
    class Breaks(gp.GraphPass):
        name = "breaks"

        def run(self, model):
            node = next(iter(model.graph))
            model.graph.remove(node)  # its output is still read
            return 1

    monkeypatch.setitem(gp.PASSES, "breaks", Breaks)
    graph = oir.serde.deserialize_model(_siblings())
    with pytest.raises(PostconditionError, match=r"after graph pass 'breaks': node .* reads 'm0' before it is defined"):
        gp.GraphPassManager(["breaks"]).run_on(graph)


def test_each_pass_is_dumped_after_it_runs():
    seen = []
    graph = oir.serde.deserialize_model(_gqa())
    gp.GraphPassManager(["fuse_sibling_matmuls", "gqa_without_expand"]).run_on(
        graph, dump=lambda name, model: seen.append((name, sum(1 for _ in model.graph))))
    assert [name for name, _ in seen] == ["fuse_sibling_matmuls", "gqa_without_expand"]
    assert seen[1][1] != seen[0][1]  # the dump sees the model as that pass left it
