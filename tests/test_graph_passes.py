"""Graph optimizations of the lowered ONNX graph (issue 26, kernel_lens.onnx.graph_passes): each
pass rewrites what it should, leaves alone what it must not, and the rewritten graph computes what
the original did (ONNX Runtime's CPU EP runs both); the choice of passes reaches the lowering
through the IR (optimize= / --opt-level)."""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as oir
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens.errors import InputError, PostconditionError
from kernel_lens.frontends.capture.recorder import capture
from kernel_lens.onnx import graph_passes as gp
from kernel_lens.onnx.lower import lower_to_onnx, lowering_key

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
    matmul = next(n for n in fused.graph.node if n.op_type == "MatMul")
    assert split.name.endswith(".fused_split") and matmul.name and matmul.name != split.name  # named for dump-ir
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
         mask_rows=1, mask_heads=1, attention_name="", **attributes):
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
        inputs.append(helper.make_tensor_value_info("mask", kind, [1, mask_heads, mask_rows, seq]))
        att_inputs.append("mask")
    nodes.append(helper.make_node("Attention", att_inputs, ["y"], is_causal=causal, name=attention_name,
                                  **attributes))
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


@pytest.mark.parametrize("batch", ["B", 2])
def test_the_shapes_the_fold_declares_agree_with_onnx_shape_inference(batch):
    # the folded query is [batch, kv_heads, groups*L, head]: what the pass writes into value_info
    # must agree with what ONNX infers (a wrong dim is an error under strict inference)
    folded, timings = _optimize(_gqa(batch=batch, length=1), ["gqa_without_expand"])
    assert timings[0].rewrites == 1
    onnx.shape_inference.infer_shapes(folded, strict_mode=True)
    fold = next(n for n in folded.graph.node if n.op_type == "Reshape" and "fold_groups" in n.name)
    declared = next(v for v in folded.graph.value_info if v.name == fold.output[0])
    dims = [d.dim_param or d.dim_value for d in declared.type.tensor_type.shape.dim]
    assert dims == [batch, 2, 3, 8], dims


def test_one_mask_row_for_many_query_rows_is_expanded_to_the_folded_rows():
    # the model's own graph would not run on ORT (it wants a row per query row), so the fold is
    # checked by its structure: the one row expanded to G*L rows at run time
    folded, timings = _optimize(_gqa(length="L", mask_rows=1), ["gqa_without_expand"])
    assert timings[0].rewrites == 1 and _ops(folded)["Expand"] == 1 and _ops(folded)["Shape"] == 2
    # and it computes attention with that row for every query row: the same as the model given
    # the row repeated L times (which ORT runs)
    for length in (2, 3):
        feeds = _gqa_feeds(length=length, mask_rows=1)
        repeated = dict(feeds, mask=np.repeat(feeds["mask"], length, axis=2))
        (want,), (got,) = _run(_gqa(length="L", mask_rows=length), repeated), _run(folded, feeds)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


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


def _run_pass(monkeypatch, name: str, run) -> None:
    """A graph pass named ``name`` whose ``run(model)`` is ``run``, registered and run alone over
    the sibling-MatMul graph (the checks between passes are what these tests are about)."""
    monkeypatch.setitem(gp.PASSES, name, type(name, (gp.GraphPass,), {"name": name,
                                                                    "run": lambda self, model: run(model)}))
    gp.GraphPassManager([name]).run_on(oir.serde.deserialize_model(_siblings()))


def test_a_pass_that_breaks_the_graph_is_named(monkeypatch):
    def breaks(model):
        model.graph.remove(next(iter(model.graph)))  # its output is still read
        return 1

    with pytest.raises(PostconditionError, match=r"after graph pass 'breaks': node .* reads 'm0' before it is defined"):
        _run_pass(monkeypatch, "breaks", breaks)


def test_each_pass_is_dumped_after_it_runs():
    seen = []
    graph = oir.serde.deserialize_model(_gqa())
    gp.GraphPassManager(["fuse_sibling_matmuls", "gqa_without_expand"]).run_on(
        graph, dump=lambda name, model: seen.append((name, sum(1 for _ in model.graph))))
    assert [name for name, _ in seen] == ["fuse_sibling_matmuls", "gqa_without_expand"]
    assert seen[1][1] != seen[0][1]  # the dump sees the model as that pass left it


# ----------------------------------------------------------------------------- issue 39's pins


def test_a_pass_that_breaks_the_graph_is_refused_even_when_it_reports_no_rewrite(monkeypatch):
    def quiet(model):
        model.graph.remove(next(iter(model.graph)))  # the first MatMul; its output is read
        return 0

    with pytest.raises(PostconditionError, match=r"after graph pass 'quiet'"):
        _run_pass(monkeypatch, "quiet", quiet)


def test_a_pass_that_leaves_a_graph_output_without_a_producer_is_refused(monkeypatch):
    def drops_an_output(model):  # the Relu making graph output y0: nothing else reads it
        model.graph.remove(next(n for n in model.graph if n.op_type == "Relu"))
        return 0

    with pytest.raises(PostconditionError, match=r"graph output 'y0' is no longer produced"):
        _run_pass(monkeypatch, "drops_an_output", drops_an_output)


def test_a_pass_that_defines_a_name_twice_is_refused(monkeypatch):
    def renames(model):
        relus = [n for n in model.graph if n.op_type == "Relu"]
        relus[1].outputs[0].name = relus[0].outputs[0].name
        return 1

    with pytest.raises(PostconditionError, match=r"value name 'y0' is defined more than once"):
        _run_pass(monkeypatch, "renames", renames)


def test_attention_whose_mask_differs_per_query_head_is_left_alone():
    # folding moves query heads into rows: a per-head mask would be applied to the wrong heads
    model = _gqa(mask_heads=6)
    same, timings = _optimize(model, ["gqa_without_expand"])
    assert timings[0].rewrites == 0 and _ops(same)["Expand"] == 2 and _ops(same)["Attention"] == 1


def test_a_folded_attention_keeps_every_attribute_of_the_original():
    model = _gqa(mask=None, scale=0.3, softmax_precision=1)
    folded, timings = _optimize(model, ["gqa_without_expand"])
    assert timings[0].rewrites == 1
    attention = next(n for n in folded.graph.node if n.op_type == "Attention")
    kept = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    assert kept["scale"] == pytest.approx(0.3) and kept["softmax_precision"] == 1
    feeds = _gqa_feeds(mask=None)
    (want,), (got,) = _run(model, feeds), _run(folded, feeds)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)  # -O1 == -O0 at a non-default scale
    default = _run(_gqa(mask=None), feeds)[0]
    assert not np.allclose(default, want, atol=1e-3)  # the scale matters for these inputs


def test_two_unnamed_attention_nodes_give_unique_names():
    # legal ONNX: nodes need no names; the values a pass makes for each must still be unique
    base = _gqa(mask="bool")
    graph = base.graph
    second = onnx.ModelProto.FromString(base.SerializeToString())
    for node in second.graph.node:
        node.input[:] = [n if n in ("q", "k", "v", "mask", "axes", "tail5", "tail4") else f"b_{n}"
                         for n in node.input]
        node.output[:] = [f"b_{n}" for n in node.output]
    graph.node.extend(second.graph.node)
    graph.value_info.extend(helper.make_tensor_value_info(f"b_{v.name}", v.type.tensor_type.elem_type,
                                                          [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim])
                            for v in second.graph.value_info)
    graph.output.append(helper.make_tensor_value_info("b_y", TensorProto.FLOAT, ["B", 6, 1, 8]))
    folded, timings = _optimize(base, ["gqa_without_expand"])
    assert timings[0].rewrites == 2
    names = [o for n in folded.graph.node for o in n.output] + [i.name for i in folded.graph.initializer]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    feeds = _gqa_feeds()
    want, got = _run(base, feeds), _run(folded, feeds)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def _sibling_pieces_ir():
    from conftest import ROOT, load_module

    never_wrong = load_module(ROOT / "tests" / "models" / "never_wrong.py")
    dims = {"x": {0: torch.export.Dim("rows", min=1, max=64)}}
    compiled = kl.compile(never_wrong.SiblingMatMuls(), never_wrong._x(4), dynamic_shapes=dims, arch=90)
    return never_wrong, compiled


def test_a_model_split_by_size_gets_the_graph_passes_in_every_piece():
    never_wrong, compiled = _sibling_pieces_ir()
    ir = compiled.ir
    assert len(ir.pieces) == 2 and ir.graph_passes == ["fuse_sibling_matmuls", "gqa_without_expand"]
    model = lower_to_onnx(ir)
    branches = [a.g for n in model.graph.node if n.op_type == "If" for a in n.attribute
                if a.name == "then_branch"]
    assert len(branches) == 2
    for branch in branches:  # each piece's two sibling MatMuls fused into one, then a Split
        ops = collections.Counter(n.op_type for n in branch.node)
        assert ops["MatMul"] == 1 and ops["Split"] == 1, ops
    unoptimized = lower_to_onnx(ir.model_copy(update={"graph_passes": []}))
    for branch in [a.g for n in unoptimized.graph.node if n.op_type == "If" for a in n.attribute
                   if a.name == "then_branch"]:
        assert collections.Counter(n.op_type for n in branch.node)["MatMul"] == 2
    for rows in (1, 2, 5):  # and the fused graph computes the model (CPU evaluation against eager)
        x = never_wrong._x(rows)[0]
        want = capture(never_wrong.SiblingMatMuls(), (x.clone(),), 90).outputs
        torch.testing.assert_close(compiled.run(x.clone()), want, rtol=1e-5, atol=1e-5)


def test_the_graph_passes_and_their_code_key_the_cached_lowering(monkeypatch):
    _, compiled = _sibling_pieces_ir()
    ir = compiled.ir
    key = lowering_key(ir, 23)
    assert lowering_key(ir, 23) == key
    assert lowering_key(ir.model_copy(update={"graph_passes": ["gqa_without_expand"]}), 23) != key
    assert lowering_key(ir, 18) != key
    real = Path.read_bytes

    def edited(path):  # the graph passes' code changed
        data = real(path)
        return data + b"\n# edited" if path.name == "graph_passes.py" else data
    monkeypatch.setattr(Path, "read_bytes", edited)
    assert lowering_key(ir, 23) != key


@pytest.mark.parametrize("library", ["torch", "onnxscript", "onnx"])
def test_the_versions_of_the_libraries_a_lowering_calls_key_the_cached_lowering(library, monkeypatch):
    """torchlib's functions come from onnxscript and torch, the model from onnx: another version
    of any of them lowers afresh instead of reusing an entry it might have lowered otherwise."""
    import onnx

    import kernel_lens.onnx.lower as lower

    _, compiled = _sibling_pieces_ir()
    key = lowering_key(compiled.ir, 23)
    if library == "torch":
        monkeypatch.setattr(torch, "__version__", torch.__version__ + "+other")
    elif library == "onnx":
        monkeypatch.setattr(onnx, "__version__", onnx.__version__ + ".1")
    else:
        real = lower.dist_version
        monkeypatch.setattr(lower, "dist_version", lambda d: real(d) + ".1" if d == library else real(d))
    assert lowering_key(compiled.ir, 23) != key
