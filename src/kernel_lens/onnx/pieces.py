"""One ONNX graph for a model split by size (``GraphIR.pieces``): a flat chain of ``If`` nodes.

Each piece is lowered as a graph of its own (its launches numbered after the earlier pieces'),
then becomes one branch of a chain of ``If`` nodes, none inside another (TensorRT-RTX's builder
fails on nested ``If``): ``r0 = If(piece 0's sizes, then=piece 0, else=<empty>)``, ``r_k =
If(piece k's sizes, then=piece k, else=r_(k-1))``, and the last piece runs when no other
matched, ``If(any other's sizes, then=r_(n-2), else=last piece)``, so sizes outside every
piece reach its launches, whose range checks refuse them. The pieces' boxes are disjoint: one
matches. A piece's sizes are its boxes, ``lo <= s <= hi`` for each symbol ``s`` read from its
input dim (``Shape``, then ``(dim - offset) / scale``). Branch bodies read the
graph inputs and the weights from the outer scope; every other name in a branch is prefixed with
``p<k>.`` (ONNX names are unique across nested graphs), weights identical across pieces are kept
once at the top level, and each branch gives the same outputs: ``output_<i>``, then
``mutated_<input>`` for every input some piece writes (``Identity`` of the input where a piece
does not write it). ONNX Runtime's CUDA EP and TensorRT both run ``If`` with a shape-derived
condition; the condition is computed by the CPU from the input shapes.
"""

from __future__ import annotations

import hashlib

import onnx
from onnx import TensorProto, helper

from ..ir import GraphIR, SizeBox
from .context import onnx_dtype, value_info


def combine_pieces(ir: GraphIR, models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """The model choosing between ``models`` (piece ``k`` lowered alone) by the pieces' sizes."""
    inputs = set(ir.inputs)
    outputs = [f"output_{i}" for i in range(len(ir.outputs))]
    mutated = sorted({o.name for m in models for o in m.graph.output if o.name.startswith("mutated_")},
                     key=lambda n: ir.inputs.index(n.removeprefix("mutated_")))
    shared: dict[str, onnx.TensorProto] = {}
    branches = []
    for k, model in enumerate(models):
        branches.append(_branch(model.graph, k, inputs, outputs, mutated, shared))
    nodes: list = []
    conditions = [_condition(ir, piece.when, nodes, k) for k, piece in enumerate(ir.pieces[:-1])]
    final = outputs + mutated
    previous = [_empty_like(branches[0].output[i], f"pieces.init.{n}", nodes) for i, n in enumerate(final)]
    for k, condition in enumerate(conditions):  # r_k: piece k where its sizes match, else r_(k-1)
        names = [f"pieces.r{k}.{n}" for n in final]
        nodes.append(helper.make_node("If", [condition], names, name=f"size_piece_{k}",
                                      then_branch=branches[k],
                                      else_branch=_passing(previous, branches[k], f"keep_{k}")))
        previous = names
    last = len(branches) - 1
    matched = conditions[0]
    for k, condition in enumerate(conditions[1:], 1):
        matched = _node(nodes, "Or", [matched, condition], f"pieces.matched.{k}")
    nodes.append(helper.make_node("If", [matched], final, name=f"size_piece_{last}",
                                  then_branch=_passing(previous, branches[last], "matched"),
                                  else_branch=branches[last]))
    graph_inputs = [value_info(n, ir.values[n].dtype, ir.values[n].shape) for n in ir.inputs]
    graph_outputs = [_common(f, [b for b in branches], i) for i, f in enumerate(final)]
    graph = helper.make_graph(nodes, ir.name, graph_inputs, graph_outputs,
                              initializer=list(shared.values()),
                              doc_string=f"Lowered by kernel_lens from GraphIR {ir.name!r}, split by "
                                         f"size into {len(models)} pieces (If branches)")
    first = models[0]
    model = helper.make_model(graph, opset_imports=list(first.opset_import),
                              producer_name=first.producer_name,
                              producer_version=first.producer_version, doc_string=first.doc_string)
    model.ir_version = first.ir_version
    functions: dict[tuple[str, str], onnx.FunctionProto] = {}
    for m in models:
        for fn in m.functions:
            functions.setdefault((fn.domain, fn.name), fn)
    model.functions.extend(functions.values())
    return model


def _node(nodes: list, op: str, inputs: list[str], out: str, **attrs) -> str:
    nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
    return out


def _empty_like(info: onnx.ValueInfoProto, name: str, nodes: list) -> str:
    """An empty tensor of ``info``'s type and rank: the chain's value before any piece matched."""
    tensor_type = info.type.tensor_type
    rank = len(tensor_type.shape.dim)
    return _node(nodes, "Constant", [], name, value=helper.make_tensor(
        name, tensor_type.elem_type, [0] * max(rank, 1), []) if rank else helper.make_tensor(
        name, tensor_type.elem_type, [], [0]))


def _passing(values: list[str], like: onnx.GraphProto, name: str) -> onnx.GraphProto:
    """A branch giving ``values`` (outer-scope names) as they are, typed like ``like``'s outputs
    (any shape: the pieces' shapes differ)."""
    outs = []
    for value, info in zip(values, like.output):
        out = onnx.ValueInfoProto()
        out.CopyFrom(info)
        out.name = f"{name}.{value}"
        for dim in out.type.tensor_type.shape.dim:
            dim.Clear()
        outs.append(out)
    return helper.make_graph([helper.make_node("Identity", [v], [o.name]) for v, o in zip(values, outs)],
                             name, [], outs)


def _common(name: str, branches: list[onnx.GraphProto], index: int) -> onnx.ValueInfoProto:
    """A graph output's value info: dims every piece agrees on, others left unnamed."""
    infos = [b.output[index] for b in branches]
    out = onnx.ValueInfoProto()
    out.CopyFrom(infos[0])
    out.name = name
    for d, dim in enumerate(out.type.tensor_type.shape.dim):
        spellings = {i.type.tensor_type.shape.dim[d].SerializeToString() for i in infos}
        if len(spellings) > 1:
            dim.Clear()
    return out


def _branch(graph: onnx.GraphProto, k: int, inputs: set[str], outputs: list[str],
            mutated: list[str], shared: dict[str, onnx.TensorProto]) -> onnx.GraphProto:
    """Piece ``k``'s graph as a branch body: no inputs (outer scope), names prefixed, weights
    shared with other pieces hoisted, the outputs every branch gives."""
    prefix = f"p{k}."
    rename: dict[str, str] = {}
    keep = []
    for init in graph.initializer:
        digest = hashlib.sha256(init.SerializeToString()).hexdigest()
        key = f"w_{init.name}"
        same = shared.get(key)
        if same is None or _digest(same) == digest:
            hoisted = onnx.TensorProto()
            hoisted.CopyFrom(init)
            hoisted.name = key
            shared.setdefault(key, hoisted)
            rename[init.name] = key
        else:
            rename[init.name] = prefix + init.name
            kept = onnx.TensorProto()
            kept.CopyFrom(init)
            kept.name = prefix + init.name
            keep.append(kept)

    def name(n: str) -> str:
        if not n or n in inputs:
            return n
        return rename.setdefault(n, prefix + n)

    nodes = [_renamed(node, name) for node in graph.node]
    produced = {o.name: o for o in graph.output}
    outs = []
    for o in outputs:
        outs.append(_renamed_info(produced[o], name(o)))
    for m in mutated:
        if m in produced:
            outs.append(_renamed_info(produced[m], name(m)))
        else:  # this piece leaves the input as it is
            source = m.removeprefix("mutated_")
            alias = prefix + m
            nodes.append(helper.make_node("Identity", [source], [alias], name=f"{prefix}keep_{source}"))
            info = next(i for i in _inputs_info(graph) if i.name == source)
            outs.append(_renamed_info(info, alias))
    infos = [_renamed_info(v, name(v.name)) for v in graph.value_info]
    return helper.make_graph(nodes, f"piece_{k}", [], outs, initializer=keep, value_info=infos)


def _inputs_info(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    return list(graph.input)


def _digest(t: onnx.TensorProto) -> str:
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    copy.name = t.name.removeprefix("w_")
    return hashlib.sha256(copy.SerializeToString()).hexdigest()


def _renamed_info(info: onnx.ValueInfoProto, new: str) -> onnx.ValueInfoProto:
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    out.name = new
    return out


def _renamed(node: onnx.NodeProto, name) -> onnx.NodeProto:
    out = onnx.NodeProto()
    out.CopyFrom(node)
    out.name = name(node.name) if node.name else ""
    del out.input[:]
    out.input.extend(name(n) for n in node.input)
    del out.output[:]
    out.output.extend(name(n) for n in node.output)
    for attr in out.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            _rename_graph(g, name)
    return out


def _rename_graph(graph: onnx.GraphProto, name) -> None:
    """A subgraph's names renamed in place (its own inputs too: they are names of the branch)."""
    for v in [*graph.input, *graph.output, *graph.value_info]:
        v.name = name(v.name)
    for init in graph.initializer:
        init.name = name(init.name)
    for node in graph.node:
        node.CopyFrom(_renamed(node, name))


def _condition(ir: GraphIR, boxes: list[SizeBox], nodes: list, k: int) -> str:
    """A one-element bool tensor: whether the call's sizes are in any of ``boxes``."""
    def node(op: str, inputs: list[str], **attrs) -> str:
        out = f"piece{k}.{op}.{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    def const(value: int) -> str:
        out = f"piece{k}.const.{len(nodes)}"
        nodes.append(helper.make_node("Constant", [], [out], name=out,
                                      value=helper.make_tensor(out, TensorProto.INT64, [1], [value])))
        return out

    any_box = None
    for box in boxes:
        all_of = None
        for sym, (lo, hi) in box.ranges.items():
            info = ir.symbols[sym]
            dim = node("Shape", [ir.inputs[info.input]], start=info.dim, end=info.dim + 1)
            if info.offset:
                dim = node("Sub", [dim, const(info.offset)])
            if info.scale != 1:
                dim = node("Div", [dim, const(info.scale)])
            inside = node("And", [node("GreaterOrEqual", [dim, const(lo)]),
                                  node("LessOrEqual", [dim, const(hi)])])
            all_of = inside if all_of is None else node("And", [all_of, inside])
        if all_of is None:  # a box with no bounds: every size
            all_of = node("Constant", [], value=helper.make_tensor("t", TensorProto.BOOL, [1], [True]))
        any_box = all_of if any_box is None else node("Or", [any_box, all_of])
    return any_box


__all__ = ["combine_pieces", "onnx_dtype"]
