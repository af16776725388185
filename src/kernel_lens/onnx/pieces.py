"""One ONNX graph for a model split by size (``GraphIR.pieces``): one ``If`` per piece.

Each piece is lowered as a graph of its own (its launches numbered after the earlier pieces'),
then becomes the ``then`` branch of an ``If`` of its own, at the top level (none inside another,
none reading another's outputs). The graph must build with TensorRT, whose builder refuses an
``If`` inside another, a value whose shape is known only at run time (an ``If`` output whose
branches' shapes differ) read inside a conditional, and a ``Reshape`` that does not hold for
every size of the profile even in a branch not taken. So:

* piece ``k`` runs where its sizes match, ``f_k = If(c_k, then=flatten(piece k's output),
  else=<empty>)``; the last piece where no other matched, ``c_last = Not(Or(c_0, ...))``, so
  sizes outside every piece reach its launches, whose range checks refuse them. The boxes are
  disjoint: exactly one ``f_k`` is not empty;
* the output is ``Reshape(Concat(f_0, ..., f_last), S)``, ``S`` its shape computed from the
  input shapes at the top level: each piece's shape expression, chosen with ``Where(c_k, ...)``.
  The output's shape is then a function of the input shapes (no data-dependent shape for the
  caller), and its values are the matching piece's, moved, never computed on (bit-exact).

A piece's sizes are its boxes, ``lo <= s <= hi`` for each symbol ``s`` read from its input dim
(``Shape``, then ``(dim - offset) / scale``). Branch bodies read the graph inputs and the weights
from the outer scope; every other name in a branch is prefixed with ``p<k>.`` (ONNX names are
unique across nested graphs), weights identical across pieces are kept once at the top level,
and each branch gives the same outputs: ``output_<i>``, then ``mutated_<input>`` for every input
some piece writes (``Identity`` of the input where a piece does not write it). ONNX Runtime's
CUDA EP and TensorRT both run ``If`` with a shape-derived condition; the condition is computed by
the CPU from the input shapes. The price of the flat selection is one copy of each output
(``Concat``) per call.
"""

from __future__ import annotations

import hashlib

import onnx
from onnx import TensorProto, helper

from ..ir import GraphIR, SizeBox
from .context import LoweringContext, onnx_dtype, value_info


def combine_pieces(ir: GraphIR, models: list[onnx.ModelProto],
                   sizes: LoweringContext) -> onnx.ModelProto:
    """The model choosing between ``models`` (piece ``k`` lowered alone) by the pieces' sizes.
    ``sizes`` is a lowering of ``ir`` (the top level) that computes symbolic sizes."""
    outputs, mutated, shared, branches = part_bodies(ir, models)
    final = outputs + mutated
    nodes: list = []
    conditions = [_condition(ir, piece.when, nodes, k) for k, piece in enumerate(ir.pieces[:-1])]
    matched = conditions[0]
    for k, condition in enumerate(conditions[1:], 1):
        matched = _node(nodes, "Or", [matched, condition], f"pieces.matched.{k}")
    conditions.append(_node(nodes, "Not", [matched], "pieces.none_matched"))
    shapes = _shapes(ir, sizes, conditions, len(outputs), mutated)
    nodes.extend(sizes.nodes)
    flat = _node(nodes, "Constant", [], "pieces.flat",
                 value=helper.make_tensor("pieces.flat", TensorProto.INT64, [1], [-1]))
    parts: list[list[str]] = [[] for _ in final]
    for k, (condition, branch) in enumerate(zip(conditions, branches)):
        names = [f"pieces.f{k}.{n}" for n in final]
        nodes.append(helper.make_node("If", [condition], names, name=f"size_piece_{k}",
                                      then_branch=_flattened(branch, flat),
                                      else_branch=_empties(branch, f"none_{k}")))
        for part, name in zip(parts, names):
            part.append(name)
    for name, part, shape in zip(final, parts, shapes):
        joined = _node(nodes, "Concat", part, f"pieces.{name}", axis=0)
        nodes.append(helper.make_node("Reshape", [joined, shape], [name], name=f"pieces.shape.{name}"))
    graph_inputs = [value_info(n, ir.values[n].dtype, ir.values[n].shape) for n in ir.inputs]
    graph_outputs = [common_info(f, branches, i) for i, f in enumerate(final)]
    graph = helper.make_graph(nodes, ir.name, graph_inputs, graph_outputs,
                              initializer=list(shared.values()),
                              doc_string=f"Lowered by kernel_lens from GraphIR {ir.name!r}, split by "
                                         f"size into {len(models)} pieces (If branches)")
    return model_like(graph, models)


def chain_pieces(ir: GraphIR, models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """The model choosing between ``models`` by the pieces' sizes when a piece reads tensor
    values (run-time sizes, checks, value branches): its outputs' shapes may depend on values,
    which the flat selection cannot compute from the input shapes. Piece ``k`` is the ``then``
    branch of ``If(c_k)``, the next piece's ``If`` its ``else``; the last piece runs where no
    other matched. Nested ``If``s: ONNX Runtime runs them; TensorRT targets refuse models that
    read values before lowering."""
    outputs, mutated, shared, bodies = part_bodies(ir, models)
    final = outputs + mutated
    nodes: list = []
    conditions = [_condition(ir, piece.when, nodes, k) for k, piece in enumerate(ir.pieces[:-1])]

    def tried(k: int) -> onnx.GraphProto:
        """Piece ``k`` where its sizes match, else the next (the last piece: its body)."""
        if k == len(bodies) - 1:
            return bodies[k]
        names = [f"pieces.chosen{k}.{n}" for n in final]
        node = helper.make_node("If", [conditions[k]], names, name=f"size_piece_{k}",
                                then_branch=bodies[k], else_branch=tried(k + 1))
        infos = [rank_only(info, name) for info, name in zip(bodies[k].output, names)]
        return helper.make_graph([node], f"pieces_from_{k}", [], infos)

    nodes.append(helper.make_node("If", [conditions[0]], final, name="size_piece_0",
                                  then_branch=bodies[0], else_branch=tried(1)))
    graph_inputs = [value_info(n, ir.values[n].dtype, ir.values[n].shape) for n in ir.inputs]
    graph_outputs = [common_info(f, bodies, i) for i, f in enumerate(final)]
    graph = helper.make_graph(nodes, ir.name, graph_inputs, graph_outputs,
                              initializer=list(shared.values()),
                              doc_string=f"Lowered by kernel_lens from GraphIR {ir.name!r}, split by "
                                         f"size into {len(models)} pieces (nested If branches)")
    return model_like(graph, models)


def rank_only(info: onnx.ValueInfoProto, name: str) -> onnx.ValueInfoProto:
    """``info`` renamed ``name``, its type and rank kept, its dims unnamed (the branches of an
    ``If`` give other sizes: another piece's, an empty tensor)."""
    out = onnx.ValueInfoProto()
    out.CopyFrom(info)
    out.name = name
    tensor = out.type.tensor_type
    if tensor.HasField("shape"):
        for dim in tensor.shape.dim:
            dim.Clear()
    return out


def model_like(graph: onnx.GraphProto, models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """A model of ``graph`` with the first part's opsets and producer, every part's functions."""
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


def _shapes(ir: GraphIR, sizes: LoweringContext, conditions: list[str], n_outputs: int,
            mutated: list[str]) -> list[str]:
    """Each output's shape (1-D int64) at the top level: the matching piece's expression."""
    shapes = []
    for i in range(n_outputs):
        per_piece = [sizes.shape(p.graph.values[p.graph.outputs[i]]) for p in ir.pieces]
        chosen = per_piece[-1]
        for condition, shape in reversed(list(zip(conditions[:-1], per_piece[:-1]))):
            if shape != chosen:  # equal expressions share one cached tensor
                chosen = sizes.node("Where", [condition, shape, chosen])
        shapes.append(chosen)
    for name in mutated:  # an input keeps its shape
        shapes.append(sizes.node("Shape", [name.removeprefix("mutated_")]))
    return shapes


def _node(nodes: list, op: str, inputs: list[str], out: str, **attrs) -> str:
    nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
    return out


def _flattened(branch: onnx.GraphProto, flat: str) -> onnx.GraphProto:
    """``branch`` with each output reshaped to one dimension."""
    out = onnx.GraphProto()
    out.CopyFrom(branch)
    del out.output[:]
    out.value_info.extend(branch.output)  # typed: a launch node's output type is not inferred
    for info in branch.output:
        name = f"{info.name}.flat"
        out.node.append(helper.make_node("Reshape", [info.name, flat], [name], name=name))
        out.output.append(helper.make_tensor_value_info(name, info.type.tensor_type.elem_type, [None]))
    return out


def _empties(like: onnx.GraphProto, name: str) -> onnx.GraphProto:
    """A branch giving an empty 1-D tensor of each of ``like``'s output types."""
    nodes, outs = [], []
    for i, info in enumerate(like.output):
        out = f"{name}.{i}"
        elem = info.type.tensor_type.elem_type
        nodes.append(helper.make_node("Constant", [], [out], name=out,
                                      value=helper.make_tensor(out, elem, [0], [])))
        outs.append(helper.make_tensor_value_info(out, elem, [0]))
    return helper.make_graph(nodes, name, [], outs)


def common_info(name: str, branches: list[onnx.GraphProto], index: int) -> onnx.ValueInfoProto:
    """A graph output's value info: dims every piece (branch) agrees on, others left unnamed."""
    infos = [b.output[index] for b in branches]
    out = onnx.ValueInfoProto()
    out.CopyFrom(infos[0])
    out.name = name
    for d, dim in enumerate(out.type.tensor_type.shape.dim):
        spellings = {i.type.tensor_type.shape.dim[d].SerializeToString() for i in infos}
        if len(spellings) > 1:
            dim.Clear()
    return out


def part_bodies(ir: GraphIR, models: list[onnx.ModelProto], tag: str = "p"
                ) -> tuple[list[str], list[str], dict[str, onnx.TensorProto], list[onnx.GraphProto]]:
    """Each part's graph (``models``, lowered alone) as a branch body (:func:`branch_body`):
    the outputs every body gives (``output_<i>``, then ``mutated_<input>`` for each input some
    part writes, in input order), the weights hoisted to the top level, and the bodies."""
    outputs = [f"output_{i}" for i in range(len(ir.outputs))]
    mutated = sorted({o.name for m in models for o in m.graph.output if o.name.startswith("mutated_")},
                     key=lambda n: ir.inputs.index(n.removeprefix("mutated_")))
    shared: dict[str, onnx.TensorProto] = {}
    bodies = [branch_body(model.graph, k, set(ir.inputs), outputs, mutated, shared, tag)
              for k, model in enumerate(models)]
    return outputs, mutated, shared, bodies


def branch_body(graph: onnx.GraphProto, k: int, inputs: set[str], outputs: list[str],
                mutated: list[str], shared: dict[str, onnx.TensorProto], tag: str = "p") -> onnx.GraphProto:
    """Part ``k``'s graph as a branch body: no inputs (outer scope), names prefixed with
    ``<tag><k>.``, weights shared with other parts hoisted, the outputs every branch gives."""
    prefix = f"{tag}{k}."
    rename: dict[str, str] = {}
    keep = []
    for init in graph.initializer:
        digest = _digest(init)  # the bytes and type, whatever the name
        key = f"w_{init.name}"
        while key in inputs:  # a graph input's name: the input would override the weight
            key = f"w_{key}"
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
    title = f"piece_{k}" if tag == "p" else f"branch_{k}"
    return helper.make_graph(nodes, title, [], outs, initializer=keep, value_info=infos)


def _inputs_info(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    return list(graph.input)


def _digest(t: onnx.TensorProto) -> str:
    copy = onnx.TensorProto()
    copy.CopyFrom(t)
    copy.name = ""
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


__all__ = ["chain_pieces", "combine_pieces", "onnx_dtype"]
