"""Which written inputs the runtime may bind as their own output buffer (onnx/aliasing.py): the
graph rules on hand-built graphs, and ONNX Runtime (CPU) giving the same results with the output
bound to the input's buffer as with a buffer of its own, for every graph the rules accept."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from kernel_lens.onnx import DOMAIN
from kernel_lens.onnx.aliasing import in_place_inputs

F = TensorProto.FLOAT
SHAPE = [4, 3]


def _model(nodes, outputs, *, extra_inputs=(), ranks=None) -> onnx.ModelProto:
    inputs = [helper.make_tensor_value_info("x", F, SHAPE)]
    inputs += [helper.make_tensor_value_info(n, F, s) for n, s in extra_inputs]
    outs = [helper.make_tensor_value_info(n, F, [None] * (ranks or {}).get(n, 2)) for n in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, initializer=[
        helper.make_tensor("idx", TensorProto.INT64, [1, 1], [2]),
        helper.make_tensor("one", F, [], [1.0]),
        helper.make_tensor("s0", TensorProto.INT64, [1], [0]),
        helper.make_tensor("s2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("s3", TensorProto.INT64, [1], [3]),
        helper.make_tensor("s4", TensorProto.INT64, [1], [4]),
        helper.make_tensor("ax", TensorProto.INT64, [1], [0]),
    ])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18),
                                                   helper.make_opsetid(DOMAIN, 1)],
                             ir_version=10)  # what every ONNX Runtime of the GPU host reads


def _row(name="row"):  # a [1, 3] update computed from nothing the graph writes
    return helper.make_node("ConstantOfShape", ["shape13"], [name],
                            value=helper.make_tensor("v", F, [1], [7.0]))


_SHAPE13 = helper.make_node("Constant", [], ["shape13"], value=helper.make_tensor("s", TensorProto.INT64, [2], [1, 3]))

SAFE = {
    "scatter_only": [_SHAPE13, _row(), helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
                     helper.make_node("Identity", ["mutated_x"], ["output_0"])],
    "shape_read_after": [_SHAPE13, _row(), helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
                         helper.make_node("Shape", ["x"], ["shp"]),
                         helper.make_node("Cast", ["shp"], ["output_0"], to=F)],
    "reader_before_writer": [helper.make_node("ReduceSum", ["x", "ax"], ["row"], keepdims=1),
                             helper.make_node("Add", ["row", "one"], ["row1"]),
                             helper.make_node("ScatterND", ["x", "idx", "row1"], ["mutated_x"]),
                             helper.make_node("Identity", ["row1"], ["output_0"])],
    "splice_of_slices": [_SHAPE13, _row(),
                         helper.make_node("Slice", ["x", "s0", "s2", "ax"], ["before"]),
                         helper.make_node("Slice", ["x", "s3", "s4", "ax"], ["after"]),
                         helper.make_node("Concat", ["before", "row", "after"], ["mutated_x"], axis=0),
                         helper.make_node("Identity", ["mutated_x"], ["output_0"])],
}
UNSAFE = {
    "reader_not_before_writer": [_SHAPE13, _row(), helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
                                 helper.make_node("Neg", ["x"], ["output_0"])],
    "writer_not_in_place": [helper.make_node("Add", ["x", "one"], ["mutated_x"]),
                            helper.make_node("Identity", ["mutated_x"], ["output_0"])],
    "scatter_updates_from_x": [helper.make_node("Slice", ["x", "s0", "s2", "ax"], ["two"]),
                               helper.make_node("ScatterND", ["x", "idx", "x"], ["mutated_x"]),
                               helper.make_node("Identity", ["two"], ["output_0"])],
}


@pytest.mark.parametrize("name", sorted(SAFE))
def test_graphs_that_read_nothing_stale_are_in_place(name):
    assert in_place_inputs(_model(SAFE[name], ["output_0", "mutated_x"])) == {"x"}


@pytest.mark.parametrize("name", sorted(UNSAFE))
def test_graphs_that_could_read_overwritten_contents_are_not(name):
    assert in_place_inputs(_model(UNSAFE[name], ["output_0", "mutated_x"])) == set()


def test_a_subgraph_reading_the_input_is_not_in_place():
    then = helper.make_graph([helper.make_node("Neg", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", F, SHAPE)])
    other = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", F, SHAPE)])
    nodes = [_SHAPE13, _row(),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("b", TensorProto.BOOL, [], [True])),
             helper.make_node("If", ["c"], ["output_0"], then_branch=then, else_branch=other),
             helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"])]
    assert in_place_inputs(_model(nodes, ["output_0", "mutated_x"])) == set()


def test_a_kernel_lens_launch_writer_is_in_place_and_a_later_reader_is_not():
    launch = helper.make_node("k", ["x"], ["mutated_x"], domain=DOMAIN, launch=0)
    model = _model([launch, helper.make_node("Identity", ["mutated_x"], ["output_0"])],
                   ["output_0", "mutated_x"])
    assert in_place_inputs(model) == {"x"}
    late = _model([launch, helper.make_node("Neg", ["x"], ["output_0"])], ["output_0", "mutated_x"])
    assert in_place_inputs(late) == set()


def test_an_input_without_a_mutated_output_is_not_reported():
    model = _model([helper.make_node("Neg", ["x"], ["output_0"])], ["output_0"])
    assert in_place_inputs(model) == set()


def _run(model: onnx.ModelProto, x: np.ndarray, alias: bool) -> tuple[np.ndarray, np.ndarray]:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    x = x.copy()
    binding = session.io_binding()
    binding.bind_input("x", "cpu", 0, np.float32, list(x.shape), x.ctypes.data)
    mutated = x if alias else np.empty_like(x)
    binding.bind_output("output_0")
    binding.bind_output("mutated_x", "cpu", 0, np.float32, list(x.shape), mutated.ctypes.data)
    session.run_with_iobinding(binding)
    out = binding.copy_outputs_to_cpu()[0]  # in the order bound: output_0
    return out, mutated.copy()


@pytest.mark.parametrize("name", sorted(SAFE))
def test_onnxruntime_gives_the_same_results_with_the_output_bound_to_the_input(name):
    model = _model(SAFE[name], ["output_0", "mutated_x"],
                   ranks={"output_0": 1} if name == "shape_read_after" else None)
    onnx.checker.check_model(model)
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    copied = _run(model, x, alias=False)
    aliased = _run(model, x, alias=True)
    assert np.array_equal(copied[0], aliased[0]) and np.array_equal(copied[1], aliased[1])
    assert not np.array_equal(copied[1], x)  # the graph does write x


def _nested_reader(read: str) -> onnx.ModelProto:
    """An If whose else branch holds another If whose then branch reads ``read``."""
    deep = helper.make_graph([helper.make_node("Neg", [read], ["d"])], "deep", [],
                             [helper.make_tensor_value_info("d", F, SHAPE)])
    shallow = helper.make_graph([helper.make_node("Identity", ["one2"], ["s"])], "shallow", [],
                                [helper.make_tensor_value_info("s", F, SHAPE)])
    inner_if = helper.make_node("If", ["c"], ["i"], then_branch=deep, else_branch=shallow)
    outer_else = helper.make_graph([inner_if], "outer_else", [],
                                   [helper.make_tensor_value_info("i", F, SHAPE)])
    outer_then = helper.make_graph([helper.make_node("Identity", ["one2"], ["o"])], "outer_then", [],
                                   [helper.make_tensor_value_info("o", F, SHAPE)])
    nodes = [_SHAPE13, _row(),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("b", TensorProto.BOOL, [], [False])),
             helper.make_node("Constant", [], ["shape43"], value=helper.make_tensor("s", TensorProto.INT64, [2], SHAPE)),
             helper.make_node("ConstantOfShape", ["shape43"], ["one2"], value=helper.make_tensor("v", F, [1], [1.0])),
             helper.make_node("If", ["c"], ["output_0"], then_branch=outer_then, else_branch=outer_else),
             helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"])]
    return _model(nodes, ["output_0", "mutated_x"])


def test_a_reader_two_subgraph_levels_deep_is_found():
    assert in_place_inputs(_nested_reader("x")) == set()
    assert in_place_inputs(_nested_reader("one2")) == {"x"}  # the same graph reading another tensor


_SHAPE43 = helper.make_node("Constant", [], ["shape43"], value=helper.make_tensor("s", TensorProto.INT64, [2], SHAPE))
VIEW_HAZARDS = {
    # a Reshape view of x, read before the writer (to make the update) and again after it
    "view_read_after_writer": [_SHAPE43, helper.make_node("Reshape", ["x", "shape43"], ["v"]),
                               helper.make_node("ReduceSum", ["v", "ax"], ["row"], keepdims=1),
                               helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
                               helper.make_node("Add", ["v", "mutated_x"], ["output_0"])],
    # a chain of views (Identity of a Flatten... of x) read after the writer
    "view_chain_read_after_writer": [_SHAPE43, helper.make_node("Identity", ["x"], ["v0"]),
                                     helper.make_node("Reshape", ["v0", "shape43"], ["v"]),
                                     helper.make_node("ReduceSum", ["v", "ax"], ["row"], keepdims=1),
                                     helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
                                     helper.make_node("Add", ["v", "mutated_x"], ["output_0"])],
    # a view of x that is itself a graph output: the caller reads it after the run
    "view_is_an_output": [_SHAPE13, _row(), helper.make_node("Identity", ["x"], ["output_0"]),
                          helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"])],
}


@pytest.mark.parametrize("name", sorted(VIEW_HAZARDS))
def test_a_view_of_the_input_read_after_the_writer_keeps_it_out_of_place(name):
    """ONNX Runtime's Reshape/Identity/... return the input's own buffer: reading such a view after
    the writer reads the new contents when the output is bound to the input."""
    model = _model(VIEW_HAZARDS[name], ["output_0", "mutated_x"])
    onnx.checker.check_model(model)
    assert in_place_inputs(model) == set()
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    copied, aliased = _run(model, x, alias=False), _run(model, x, alias=True)
    if name == "view_read_after_writer":  # what the rule prevents, shown on ONNX Runtime's CPU EP
        assert not np.array_equal(copied[0], aliased[0]), "ONNX Runtime no longer aliases the view"


def test_a_view_read_only_before_the_writer_stays_in_place():
    nodes = [_SHAPE43, helper.make_node("Reshape", ["x", "shape43"], ["v"]),
             helper.make_node("ReduceSum", ["v", "ax"], ["row"], keepdims=1),
             helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
             helper.make_node("Identity", ["row"], ["output_0"])]
    model = _model(nodes, ["output_0", "mutated_x"])
    assert in_place_inputs(model) == {"x"}
    x = np.arange(12, dtype=np.float32).reshape(SHAPE)
    copied, aliased = _run(model, x, alias=False), _run(model, x, alias=True)
    assert np.array_equal(copied[0], aliased[0]) and np.array_equal(copied[1], aliased[1])
