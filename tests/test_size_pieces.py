"""Python branches on sizes split the declared range into pieces, one graph each, dispatched by
size at run time (frontends/trace/size_pieces.py, onnx/pieces.py): where each condition holds is found
exactly, each piece is traced at a size inside it, the ONNX graph chooses with If, the runtime's
call signature picks the same piece, and the CPU host runs the combined graph in ONNX Runtime
with reference kernels at sizes in every piece."""

from __future__ import annotations

import json

import numpy as np
import pytest
import sympy
import torch
import triton
from hypothesis import given, settings, strategies as st
from onnx import TensorProto, helper
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import ValueRanges

import kernel_lens as kl
from kernel_lens.errors import IRError, TraceError
from kernel_lens.frontends.trace import size_functions as sf
from kernel_lens.frontends.trace.size_pieces import narrowed, resized_inputs
from kernel_lens.ir import GraphIR, evaluate, parse
from kernel_lens.onnx import lower_to_onnx
from kernel_lens.runtime.signature import CallSignature
from kernel_lens.summary import summarize

from conftest import CORPUS, load_module, with_reference_kernels

corpus = load_module(CORPUS / "size_branches.py")


@pytest.fixture(scope="module")
def compiled():
    inputs = tuple(t.clone() for t in corpus.example_inputs)
    return kl.compile(corpus.model, inputs, dynamic_shapes=corpus.dynamic_shapes, arch=90)


def test_each_branch_of_the_range_is_a_piece_with_its_own_graph(compiled):
    ir = compiled.ir
    boxes = [box.ranges for piece in ir.pieces for box in piece.when]
    rows = sorted({tuple(b["rows"]) for b in boxes})
    n = sorted({tuple(b["n"]) for b in boxes})
    assert rows == [(2, 47), (48, 48), (49, 1024)] and n == [(2, 64), (65, 4096)]
    assert len(ir.pieces) == 6 and not ir.launches and not ir.kernels
    assert (ir.symbols["rows"].min, ir.symbols["rows"].max) == (2, 1024)
    assert (ir.symbols["n"].min, ir.symbols["n"].max) == (2, 4096)
    for piece in ir.pieces:
        (box,) = piece.when
        g = piece.graph
        assert ("rows" in g.symbols) == (box.ranges["rows"] != (48, 48))  # one size: static
        sums = [launch for launch in g.launches if g.kernels[launch.kernel].name == "block_sums_kernel"]
        (launch,) = sums
        grid = launch.grid[0]
        assert grid == "1" if box.ranges["n"] == (2, 64) else \
            all(evaluate(parse(grid, ["n"]), {"n": n}) == triton.cdiv(n, 64) for n in (65, 100, 4096))
        block = g.kernels[g.launches[0].kernel].param("BLOCK").constexpr_value
        assert block == (16 if box.ranges["rows"] == (48, 48) else 32)
    ids = [kid for p in ir.pieces for kid in p.graph.kernels]
    assert len(ids) == len(set(ids)) == 18  # unique across pieces: one library holds them all
    assert GraphIR.from_json(ir.to_json()) == ir
    assert ir.piece_for({"rows": 48, "n": 65}) is ir.pieces[3].graph
    text = summarize(ir)
    assert "piece 2: rows in [48, 48], n in [2, 64]" in text and text.count("body:") == 6


def test_the_onnx_graph_chooses_the_piece_by_size(compiled):
    import onnxruntime as ort

    def impls(name):
        def scale(read, write):
            return [helper.make_node("Constant", [], ["two"], value=helper.make_tensor("t", TensorProto.FLOAT, [], [2.0])),
                    helper.make_node("Mul", [read["x_ptr"], "two"], [write["out_ptr"]])]

        def sums(read, write):  # out[b] = sum of x[64 b : 64 b + 64]
            c = lambda n, v: helper.make_node("Constant", [], [n], value=helper.make_tensor(n, TensorProto.INT64, [1], [v]))
            return [helper.make_node("Shape", [read["x_ptr"]], ["n"]), c("c63", 63), c("c64", 64), c("zero", 0),
                    helper.make_node("Add", ["n", "c63"], ["n63"]), helper.make_node("Div", ["n63", "c64"], ["nb"]),
                    helper.make_node("Mul", ["nb", "c64"], ["padded"]), helper.make_node("Sub", ["padded", "n"], ["pad"]),
                    helper.make_node("Concat", ["zero", "pad"], ["pads"], axis=0),
                    helper.make_node("Pad", [read["x_ptr"], "pads"], ["xp"]),
                    helper.make_node("Concat", ["nb", "c64"], ["shape2"], axis=0),
                    helper.make_node("Reshape", ["xp", "shape2"], ["x2"]), c("ax", 1),
                    helper.make_node("ReduceSum", ["x2", "ax"], [write["out_ptr"]], keepdims=0)]

        def copy(read, write):  # out = x * (n - 1)
            return [helper.make_node("Shape", [read["x_ptr"]], ["n"]),
                    helper.make_node("Constant", [], ["one"], value=helper.make_tensor("o", TensorProto.INT64, [1], [1])),
                    helper.make_node("Sub", ["n", "one"], ["s"]), helper.make_node("Cast", ["s"], ["sf"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", [read["x_ptr"], "sf"], [write["out_ptr"]])]
        return {"scale_rows_kernel": scale, "block_sums_kernel": sums, "stride_copy_kernel": copy}[name]

    ir = compiled.ir
    model = lower_to_onnx(ir)
    ifs = [n for n in model.graph.node if n.op_type == "If"]
    assert len(ifs) == len(ir.pieces)  # one If per piece, at the top level (TensorRT's rules):
    assert not [n for i in ifs for a in i.attribute for n in _all(a.g) if n.op_type == "If"]  # none nested
    assert not [n for i in ifs for a in i.attribute for n in a.g.node  # no branch reads another's
                if set(n.input) & {o for j in ifs for o in j.output}]  # output
    producers = {o: n.op_type for n in model.graph.node for o in n.output}
    assert {producers[o.name] for o in model.graph.output} == {"Reshape"}
    launches = [n for n in _all(model.graph) if n.domain == "kernel_lens"]
    assert sorted(a.i for n in launches for a in n.attribute if a.name == "launch") == list(range(18))
    model = with_reference_kernels(ir, model, {k: impls(k) for k in
                                               ("scale_rows_kernel", "block_sums_kernel", "stride_copy_kernel")})
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    signature = CallSignature(ir, device_type="cpu")
    for rows, n in [(40, 100), (48, 30), (47, 64), (49, 65), (2, 2), (1024, 4096), (48, 4096)]:
        x, v = corpus._make_inputs(rows=rows, n=n)
        got = session.run(None, {"x": x.numpy(), "v": v.numpy()})
        for g, want in zip(got, corpus.reference(x, v)):
            np.testing.assert_allclose(g, want.numpy(), rtol=1e-5, atol=1e-5)
        values = signature.symbol_values((x, v))
        assert signature.output_shapes(values) == [tuple(g.shape) for g in got]
        assert ir.pieces[values.piece].graph is ir.piece_for({"rows": rows, "n": n})


def _all(graph):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from _all(g)


class _Weighted(torch.nn.Module):
    """A weight every piece uses, and a branch on one size."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(24, generator=torch.Generator().manual_seed(2)))

    def forward(self, x):
        y = torch.empty_like(x)
        corpus.scale_rows_kernel[(x.shape[0],)](x * self.w, y, x.shape[1], 3.0,
                                                BLOCK=8 if x.shape[0] > 100 else 32)
        return y


def test_weights_shared_by_the_pieces_are_kept_once():
    rows = torch.export.Dim("rows", min=2, max=300)
    ir = kl.compile(_Weighted(), (torch.randn(20, 24),), dynamic_shapes=({0: rows},), arch=90).ir
    assert len(ir.pieces) == 2 and list(ir.constants) == ["p_w"]
    assert all(not p.graph.constants and "p_w" in p.graph.values for p in ir.pieces)
    model = lower_to_onnx(ir)
    assert [i.name for i in model.graph.initializer] == ["w_p_w"]  # once, at the top level


class _ManyBranches(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.shape[0]
        block = 16 if n in (10, 20, 30, 40, 50) else 32
        corpus.scale_rows_kernel[(n,)](x, y, x.shape[1], 1.0, BLOCK=block)
        return y


def test_more_pieces_than_the_cap_is_one_typed_line():
    rows = torch.export.Dim("rows", min=2, max=64)
    with pytest.raises(TraceError, match=r"more than 8 pieces.*narrow the Dim ranges") as info:
        kl.lift(_ManyBranches(), (torch.randn(12, 8),), dynamic_shapes=({0: rows},), arch=90)
    assert "\n" not in str(info.value)


class _ThreePieces(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        n = x.shape[0]
        block = 16 if n == 10 else 32  # pieces [2, 9], [10], [11, 64]
        corpus.scale_rows_kernel[(n,)](x, y, x.shape[1], 1.0, BLOCK=block)
        return y


def test_exactly_the_cap_of_pieces_compiles_and_proving_the_ends_builds_no_binary(monkeypatch, caplog):
    """MAX_PIECES pieces are allowed (one more is refused); the traces that prove each piece's
    ends are compared, not compiled: no kernel is AOT-compiled once the proofs start."""
    import logging

    from kernel_lens.frontends.trace import size_pieces

    monkeypatch.setattr(size_pieces, "MAX_PIECES", 3)
    rows = torch.export.Dim("rows", min=2, max=64)
    with caplog.at_level(logging.INFO, logger="kernel_lens.progress"):
        ir = kl.lift(_ThreePieces(), (torch.randn(12, 8),), dynamic_shapes=({0: rows},), arch=90)
    assert [b.ranges["rows"] for p in ir.pieces for b in p.when] == [(2, 9), (10, 10), (11, 64)]
    stages = [r.getMessage() for r in caplog.records if r.getMessage().endswith(" ...")]
    proofs = [i for i, m in enumerate(stages) if m.startswith("prove piece")]
    assert proofs and any(m.startswith("aot ") for m in stages[:proofs[0]])
    assert not [m for m in stages[proofs[0]:] if m.startswith("aot ")], stages
    monkeypatch.setattr(size_pieces, "MAX_PIECES", 2)
    with pytest.raises(TraceError, match="more than 2 pieces"):
        kl.lift(_ThreePieces(), (torch.randn(12, 8),), dynamic_shapes=({0: rows},), arch=90)


def test_a_pieced_ir_is_validated():
    ir = kl.lift(_Weighted(), (torch.randn(20, 24),), dynamic_shapes=({0: torch.export.Dim("rows", min=2, max=300)},),
                 arch=90)
    data = ir.model_dump(mode="json")
    data["launches"] = data["pieces"][0]["graph"]["launches"]
    with pytest.raises(IRError, match="keeps its ops, launches and kernels in the pieces"):
        GraphIR.from_json(json.dumps(data))
    data = ir.model_dump(mode="json")
    g0, g1 = data["pieces"][0]["graph"], data["pieces"][1]["graph"]
    kid = next(iter(g0["kernels"]))
    g1["kernels"] = {kid: {**next(iter(g1["kernels"].values())), "id": kid}}
    for launch in g1["launches"]:
        launch["kernel"] = kid
        for case in launch["dispatch"]:
            case["kernel"] = kid
    with pytest.raises(IRError, match="unique across pieces"):
        GraphIR.from_json(json.dumps(data))


def test_inputs_resize_along_a_dim_and_every_dim_tied_to_it():
    x = torch.arange(12.0).reshape(3, 4)
    idx = torch.tensor([0, 1, 2])
    rows = torch.export.Dim("rows", min=2, max=100)
    spec = {"x": {0: rows}, "idx": {0: rows}, "y": {0: 2 * rows}}
    y = torch.arange(6.0)
    out = resized_inputs((x, idx, y), spec, ["x", "idx", "y"], {(0, 0): 7})
    assert out[0].shape == (7, 4) and out[1].tolist() == [0, 1, 2, 0, 1, 2, 0] and out[2].shape == (14,)
    assert torch.equal(out[0][3:6], x)  # the example's rows, tiled
    small = resized_inputs((x, idx, y), spec, ["x", "idx", "y"], {(0, 0): 2})
    assert small[0].shape == (2, 4) and small[2].shape == (4,)
    narrow = narrowed(spec, ["x", "idx", "y"], {(0, 0): (5, 9)})
    assert narrow["x"][0] is narrow["idx"][0] and (narrow["x"][0].min, narrow["x"][0].max) == (5, 9)
    assert narrow["y"][0].root is narrow["x"][0]  # a derived Dim follows its root
    static = narrowed(spec, ["x", "idx", "y"], {(0, 0): (5, 5)})
    assert static["x"][0] is torch.export.Dim.STATIC and static["y"][0] is torch.export.Dim.STATIC
    auto = narrowed(({0: torch.export.Dim.AUTO},), ["x"], {(0, 0): (3, 8)})
    assert (auto[0][0].__name__, auto[0][0].min, auto[0][0].max) == ("x_0", 3, 8)


_s = sympy.Symbol("s", integer=True, positive=True)


@settings(max_examples=60, deadline=None)
@given(kind=st.sampled_from(["ne", "le", "floordiv", "and", "or"]), a=st.integers(2, 300),
       b=st.integers(1, 70), lo=st.integers(2, 40), width=st.integers(0, 400))
def test_truth_pieces_are_exact(kind, a, b, lo, width):
    cond = {"ne": sympy.Ne(_s, a), "le": _s <= a, "floordiv": sympy.Ne(FloorDiv(_s + b - 1, b), 2),
            "and": sympy.And(_s > b, _s < a), "or": sympy.Or(sympy.Eq(_s, a), _s < b)}[kind]
    hi = lo + width
    parts = sf.truth_pieces(cond, {_s: ValueRanges(lo, hi)})
    assert parts[0][1] == lo and parts[-1][2] == hi
    for (_, _, end), (_, start, _) in zip(parts, parts[1:]):
        assert start == end + 1
    for holds, p, q in parts:
        for v in {p, q, (p + q) // 2}:
            assert bool(cond.subs(_s, v)) == holds, (cond, v)
    for (h1, _, _), (h2, _, _) in zip(parts, parts[1:]):
        assert h1 != h2  # pieces are maximal


def test_truth_pieces_refuse_several_sizes_and_too_many_changes():
    t = sympy.Symbol("t", integer=True, positive=True)
    with pytest.raises(Exception, match="depends on 2 sizes"):
        sf.truth_pieces(_s < t, {_s: ValueRanges(2, 9), t: ValueRanges(2, 9)})
    with pytest.raises(Exception, match="changes truth more than"):
        sf.truth_pieces(sympy.Eq(_s % 2, 0), {_s: ValueRanges(2, 1000)})
    assert triton.cdiv(100, 64) == 2  # the corpus's fast path is for n <= 64 only


# --- issue 42 item 3: a piece table is checked when it is loaded --------------------------------
def _with_boxes(compiled, change) -> str:
    import json

    doc = json.loads(compiled.ir.to_json())
    change(doc["pieces"])
    return json.dumps(doc)


@pytest.mark.parametrize("change, match", [
    # rows 2..47 overlaps the piece of rows 48: run() would take the first, the ONNX graph both
    (lambda p: p[0]["when"][0]["ranges"].update(rows=[2, 48]), r"pieces 0 and 2 overlap \(both serve {'n': 2, 'rows': 48}\)"),
    # rows 2..40: sizes 41..47 with n <= 64 are served by no piece
    (lambda p: p[0]["when"][0]["ranges"].update(rows=[2, 40]),
     r"leave sizes of the declared ranges \(n in \[2, 4096\], rows in \[2, 1024\]\) in no piece"),
    (lambda p: p[1]["when"][0]["ranges"].update(rows=[47, 2]), r"piece 1: rows in \[47, 2\] is empty"),
    (lambda p: p[5]["when"][0]["ranges"].update(n=[65, 2 ** 62]), r"piece 5: n in \[65, 4611686018427387904\] "
                                                                   r"is empty or outside the declared range \[2, 4096\]"),
    (lambda p: p[4]["when"][0]["ranges"].update(rows=[0, 1024]), r"piece 4: rows in \[0, 1024\] is empty or outside"),
    (lambda p: p[0]["when"].append({"ranges": {"n": [2, 3]}}), "pieces 0 and 0 overlap"),
])
def test_a_piece_table_that_overlaps_leaves_gaps_or_leaves_the_ranges_is_refused(compiled, change, match):
    with pytest.raises(IRError, match=match):
        GraphIR.from_json(_with_boxes(compiled, change))


def test_a_piece_table_tiling_the_ranges_in_another_order_or_split_differently_loads(compiled):
    def regroup(pieces):
        pieces.reverse()  # another order: each size is still in exactly one box
        pieces[0]["when"] = [{"ranges": {"rows": [49, 500], "n": [65, 4096]}},
                             {"ranges": {"rows": [501, 1024], "n": [65, 4096]}}]
    ir = GraphIR.from_json(_with_boxes(compiled, regroup))
    assert ir.piece_for({"rows": 700, "n": 100}) is ir.pieces[0].graph
    assert ir.piece_for({"rows": 2, "n": 2}) is ir.pieces[-1].graph
