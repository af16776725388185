"""One ONNX graph for a model traced from several examples (``GraphIR.branches``).

Each branch is lowered as a graph of its own (launches numbered after the earlier branches'),
its run-time checks as ``KernelLensCheck`` nodes (:mod:`kernel_lens.onnx.lower`). The branches are
then tried in order, as the forward itself would choose:

* branch ``k`` (not the last) is *attempted*: its nodes that a check's condition needs run
  first, then ``If(condition)``: ``then`` continues with the rest of the branch (its next check
  the same way), ``else`` gives empty outputs and a false flag. The attempt's outputs are the
  branch's outputs and whether all its checks held;
* ``If(held_k)``: ``then`` the attempt's outputs, ``else`` the next branch;
* the last branch runs as lowered: a check that fails there fails the call
  (``UntracedBranchError``, naming the model's line), as in a model traced from one example.

Only what a condition needs runs before it, so a branch whose checks fail stops at its first
failing check; no launch of it runs with sizes its checks exclude. ONNX values are immutable, so
an attempt that fails leaves the inputs as they were for the next (an input written in place is
a ``mutated_<input>`` output, copied back after the call; :mod:`.aliasing` never binds it to the
caller's buffer, since the graph reads inputs inside ``If`` bodies).

Names: a branch's own names are prefixed ``b<k>.`` (graph inputs and the weights every branch
shares stay as they are, at the top level); names made here start ``branches.``.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ..ir import GraphIR
from .context import CHECK_OP, DOMAIN
from .pieces import common_info, model_like, part_bodies, rank_only


def combine_branches(ir: GraphIR, models: list[onnx.ModelProto]) -> onnx.ModelProto:
    """The model trying ``models`` (branch ``k`` lowered alone) in order."""
    inputs = set(ir.inputs)
    outputs, mutated, shared, bodies = part_bodies(ir, models, tag="b")
    final = outputs + mutated
    initializers = list(shared.values())
    for body in bodies:  # a branch's own weights: prefixed, so unique at the top level
        initializers.extend(body.initializer)
    infos = {v.name: v for body in bodies for v in [*body.value_info, *body.output]}
    builder = _Builder(infos)
    nodes = builder.chain(bodies, 0, final)
    graph_inputs = [m for m in models[0].graph.input if m.name in inputs]
    graph_outputs = [common_info(f, bodies, i) for i, f in enumerate(final)]
    graph = helper.make_graph(nodes, ir.name, graph_inputs, graph_outputs, initializer=initializers,
                              value_info=builder.top_infos(nodes),
                              doc_string=f"Lowered by kernel_lens from GraphIR {ir.name!r}, traced "
                                         f"from {len(models)} examples that took different branches "
                                         f"on tensor values (tried in order with If)")
    return model_like(graph, models)


def gate_checks(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (one graph whose run-time checks fail the call) with every node after a check
    run only once the check has held (:meth:`_Builder.gated`): ONNX Runtime would otherwise run
    a launch that does not read a check's result before the check, or beside it."""
    graph = model.graph
    if not any(_is_check(n) for n in graph.node):
        return model
    made = {o for n in graph.node for o in n.output}
    outs = [o.name for o in graph.output if o.name in made]  # not a weight given as an output
    inner = {o: f"gated.{o}" for o in outs}  # the graph's outputs, made inside the If bodies
    nodes = []
    for original in graph.node:
        node = onnx.NodeProto()
        node.CopyFrom(original)
        node.input[:] = [inner.get(x, x) for x in node.input]
        node.output[:] = [inner.get(x, x) for x in node.output]
        nodes.append(node)
    infos = {v.name: v for v in [*graph.input, *graph.value_info]}
    infos.update({inner[o.name]: rank_only(o, inner[o.name]) for o in graph.output if o.name in inner})
    builder = _Builder(infos)
    nodes = builder.gated(nodes, list(inner.values()), outs, "graph")
    gated = helper.make_graph(nodes, graph.name, list(graph.input), list(graph.output),
                              initializer=list(graph.initializer),
                              value_info=[v for v in builder.top_infos(nodes) if v.name not in outs],
                              doc_string=graph.doc_string)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    out.graph.CopyFrom(gated)
    return out


def _is_check(node: onnx.NodeProto) -> bool:
    return node.domain == DOMAIN and node.op_type == CHECK_OP


class _Builder:
    def __init__(self, infos: dict[str, onnx.ValueInfoProto]) -> None:
        self.infos = dict(infos)  # name -> typed value info (launch outputs are not inferred)
        self.count = 0

    def fresh(self, what: str) -> str:
        self.count += 1
        return f"branches.{what}.{self.count}"

    def info(self, name: str, like: str) -> onnx.ValueInfoProto:
        """A value info for ``name``: ``like``'s type and rank (its dims differ between the
        branches an ``If`` chooses from: an empty tensor, another branch's sizes)."""
        self.infos[name] = rank_only(self.infos[like], name)
        return self.infos[name]

    def graph(self, nodes: list, outputs: list[str], title: str) -> onnx.GraphProto:
        """A branch body giving ``outputs`` (an output made in an outer scope is passed on by an
        ``Identity``, which ONNX Runtime runs as an alias of its input)."""
        made = {o for n in nodes for o in n.output}
        names = []
        for name in outputs:
            if name not in made:
                alias = self.fresh("pass")
                nodes = [*nodes, helper.make_node("Identity", [name], [alias], name=alias)]
                self.info(alias, name)
                name = alias
            names.append(name)
        return helper.make_graph(nodes, title, [], [self.infos[n] for n in names],
                                 value_info=self._made_here(nodes, set(names)))

    def _made_here(self, nodes: list, skip: set[str]) -> list[onnx.ValueInfoProto]:
        return [self.infos[o] for n in nodes for o in n.output if o in self.infos and o not in skip]

    def top_infos(self, nodes: list) -> list[onnx.ValueInfoProto]:
        return [self.infos[o] for n in nodes for o in n.output
                if o in self.infos and not o.startswith(("output_", "mutated_"))]

    def chain(self, bodies: list[onnx.GraphProto], k: int, results: list[str]) -> list:
        """Nodes giving ``results``: branch ``k`` where its checks hold, else the next branch's."""
        body = bodies[k]
        outs = [o.name for o in body.output]
        for name, out in zip(results, outs):
            self.info(name, out)
        if k == len(bodies) - 1:  # the last: its checks fail the call
            return self.gated(list(body.node), outs, results, f"b{k}")
        nodes, tried, held = self.attempt(list(body.node), outs, k)
        then = self.graph([], tried, f"b{k}_serves")
        other = [self.fresh(f"b{k + 1}.result") for _ in results]
        other_graph = self.graph(self.chain(bodies, k + 1, other), other, f"b{k + 1}_tried")
        return nodes + [helper.make_node("If", [held], results, name=self.fresh(f"b{k}.choose"),
                                         then_branch=then, else_branch=other_graph)]

    def gated(self, nodes: list, outs: list[str], results: list[str], tag: str) -> list:
        """Nodes giving ``results`` (``outs`` of ``nodes``) where every check holds, the call
        failing at the first that does not: what its condition needs, then ``If(condition)``:
        ``then`` the rest (its next check the same way), ``else`` the check itself, which fails
        the call (the branch's empty outputs are made from the check's result, so that ONNX
        Runtime runs it). No node after a check runs before the check has held: a launch never
        sees sizes a check excludes, nor writes an input first."""
        check = next((n for n in nodes if _is_check(n)), None)
        if check is None:
            return nodes + [helper.make_node("Identity", [out], [name], name=self.fresh(f"{tag}.result"))
                            for out, name in zip(outs, results)]
        before, rest = _split_at(nodes, check)
        inner = [self.fresh(f"{tag}.checked") for _ in outs]
        for name, out in zip(inner, outs):
            self.info(name, out)
        then = self.graph(self.gated(rest, outs, inner, tag), inner, f"{tag}_checked")
        # The refused body's outputs are made from the check's (never-read, empty) result, so
        # that nothing knows their shapes before the check has run: ONNX Runtime's If fixes an
        # output whose shape it can infer before running the body, and would refuse the call
        # there, on a shape, before the check could say why.
        none = self.fresh(f"{tag}.none")
        refused = [check, helper.make_node("Shape", [check.output[0]], [none], name=none)]
        names = []
        for out in outs:
            info = self.infos[out].type.tensor_type
            rank = len(info.shape.dim) if info.HasField("shape") else 1
            name, cast, shape, repeats = (self.fresh(f"{tag}.refused") for _ in range(4))
            refused += [helper.make_node("Cast", [check.output[0]], [cast], name=cast, to=info.elem_type),
                        _constant(repeats, TensorProto.INT64, [1], [rank]),
                        helper.make_node("Tile", [none, repeats], [shape], name=shape),
                        helper.make_node("Reshape", [cast, shape], [name], name=name, allowzero=1)]
            self.info(name, out)
            names.append(name)
        other = self.graph(refused, names, f"{tag}_refused")
        for name, out in zip(results, outs):
            self.info(name, out)
        return before + [helper.make_node("If", [check.input[0]], results, name=self.fresh(f"{tag}.check"),
                                          then_branch=then, else_branch=other)]

    def attempt(self, nodes: list, outs: list[str], k: int) -> tuple[list, list[str], str]:
        """(nodes, their output names, flag name): ``nodes`` up to the first check, then an ``If``
        on its condition continuing with the rest where it holds."""
        check = next((n for n in nodes if _is_check(n)), None)
        if check is None:
            flag = self.fresh(f"b{k}.true")
            self.infos[flag] = helper.make_tensor_value_info(flag, TensorProto.BOOL, [1])
            return nodes + [_constant(flag, TensorProto.BOOL, [1], [True])], outs, flag
        before, rest = _split_at(nodes, check)
        inner_nodes, inner_outs, inner_flag = self.attempt(rest, outs, k)
        then = self.graph(inner_nodes, [*inner_outs, inner_flag], f"b{k}_checked")
        empties, names = [], []
        for out in outs:
            name = self.fresh(f"b{k}.empty")
            info = self.infos[out].type.tensor_type
            rank = len(info.shape.dim) if info.HasField("shape") else 1
            empties.append(_constant(name, info.elem_type, [0] * rank, []))
            self.info(name, out)
            names.append(name)
        false = self.fresh(f"b{k}.false")
        empties.append(_constant(false, TensorProto.BOOL, [1], [False]))
        self.infos[false] = helper.make_tensor_value_info(false, TensorProto.BOOL, [1])
        other = self.graph(empties, [*names, false], f"b{k}_refused")
        results = [self.fresh(f"b{k}.after") for _ in outs]
        for name, out in zip(results, outs):
            self.info(name, out)
        flag = self.fresh(f"b{k}.held")
        self.infos[flag] = helper.make_tensor_value_info(flag, TensorProto.BOOL, [1])
        choose = helper.make_node("If", [check.input[0]], [*results, flag], name=self.fresh(f"b{k}.check"),
                                  then_branch=then, else_branch=other)
        return before + [choose], results, flag


def _split_at(nodes: list, check: onnx.NodeProto) -> tuple[list, list]:
    """(what ``check``'s condition needs, every other node but ``check``), in order."""
    needed = _ancestors(nodes, check.input[0])
    return ([n for n in nodes if id(n) in needed],
            [n for n in nodes if id(n) not in needed and n is not check])


def _ancestors(nodes: list, name: str) -> set[int]:
    """ids of the nodes of ``nodes`` that ``name`` is computed from (names made elsewhere are
    in an outer scope)."""
    producer = {o: n for n in nodes for o in n.output if o}
    needed: set[int] = set()
    todo = [name]
    while todo:
        node = producer.get(todo.pop())
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        todo.extend(node.input)
        for attr in node.attribute:  # a subgraph reads names of this scope too
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                todo.extend(_reads(g))
    return needed


def _reads(graph: onnx.GraphProto) -> list[str]:
    names = []
    for node in graph.node:
        names.extend(node.input)
        for attr in node.attribute:
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                names.extend(_reads(g))
    return names


def _constant(name: str, elem: int, dims: list[int], vals: list) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=helper.make_tensor(name, elem, dims, vals))


__all__ = ["combine_branches", "gate_checks"]
