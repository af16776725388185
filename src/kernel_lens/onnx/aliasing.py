"""Which inputs a lowered graph may update in the caller's own buffer.

ONNX inputs are immutable, so a model that writes an input in place (a KV cache, a running
statistic) gets a graph output ``mutated_<input>`` holding the input's final contents
(:mod:`kernel_lens.onnx.lower`). Copying that back costs a pass over the whole tensor per call,
which for a KV cache is most of a decode step's memory traffic. Binding ``mutated_<input>`` to
the input's own buffer costs nothing, and is exact when the graph guarantees that nothing reads
the old contents after they are overwritten:

* the only writes into the bound buffer are those of the node producing ``mutated_<input>``
  (the writer): ONNX Runtime never places intermediate values in a caller's buffers;
* every other node reading the input is an ancestor of the writer, so it has run before the
  writer starts (ONNX Runtime runs nodes in a topological order); ``Shape`` and ``Size`` read
  no contents;
* the input is read by no subgraph (``If``/``Loop`` bodies are scheduled as one node);
* the rules above hold for every *view* of the input as well: ONNX Runtime's ``Reshape``,
  ``Squeeze``, ``Unsqueeze``, ``Flatten``, ``Identity`` (and ``Dropout``, ``Optional*``) kernels
  are registered with ``Alias(0, 0)`` and return the input's own buffer, so a node reading such a
  view after the writer would read the new contents; a view that is a graph output is refused
  too (the caller reads it after the run);
* if the writer itself reads the input, it must work in place with input and output one buffer:
  a ``kernel_lens`` launch node (its C++ copies the initial contents only when the two buffers
  differ, then launches) on a tensor it updates, or ``ScatterND``/``ScatterElements`` with the
  input as ``data`` only (ONNX Runtime's CUDA kernels skip the copy when the buffers are one).
"""

from __future__ import annotations

import networkx as nx
import onnx

from .context import DOMAIN

MUTATED_PREFIX = "mutated_"
_NO_CONTENTS = {("", "Shape"), ("", "Size")}  # read only the shape
_SCATTERS = {("", "ScatterND"), ("", "ScatterElements")}  # input 0 is data, updated in place
# ONNX Runtime kernels registered with Alias(0, 0): output 0 is input 0's buffer (CPU and CUDA EP)
_VIEWS = {("", op) for op in ("Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity", "Dropout",
                              "Optional", "OptionalGetElement")} | {("com.microsoft", "ExpandDims")}


def _subgraph_reads(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs read (at any depth)."""
    names: set[str] = set()
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for graph in graphs:
            for inner in graph.node:
                names.update(inner.input)
                names.update(_subgraph_reads(inner))
    return names


def _in_place_writer(node: onnx.NodeProto, name: str) -> bool:
    """``node`` may write its output into the buffer of its input ``name``."""
    if node.domain == DOMAIN:
        return True
    if (node.domain, node.op_type) in _SCATTERS:
        return list(node.input).count(name) == 1 and node.input[0] == name
    return False


def _views(graph: onnx.GraphProto, name: str) -> set[str]:
    """``name`` and every value that may be a view of its buffer (through alias kernels)."""
    names = {name}
    for node in graph.node:  # ONNX graphs are topologically sorted: one pass reaches every view
        if (node.domain, node.op_type) in _VIEWS and node.input and node.input[0] in names:
            names.update(o for o in node.output if o)
    return names


def in_place_inputs(model: onnx.ModelProto) -> set[str]:
    """Graph inputs ``x`` whose ``mutated_x`` output may be bound to ``x``'s own buffer."""
    graph = model.graph
    outputs = {o.name for o in graph.output}
    producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
    inner = [_subgraph_reads(node) for node in graph.node]  # walked once: they may be deep
    deps = nx.DiGraph()
    deps.add_nodes_from(range(len(graph.node)))
    for i, node in enumerate(graph.node):
        for name in set(node.input) | inner[i]:
            if name in producer:
                deps.add_edge(producer[name], i)
    found = set()
    for inp in graph.input:
        x = inp.name
        out = MUTATED_PREFIX + x
        if out not in outputs or out not in producer:
            continue
        writer = producer[out]
        before = nx.ancestors(deps, writer)
        views = _views(graph, x)
        safe = not (views - {x}) & outputs
        for i, node in enumerate(graph.node):
            read = views.intersection(node.input)
            if views & inner[i]:
                safe = False
            elif not read or (node.domain, node.op_type) in _NO_CONTENTS:
                continue
            elif i == writer:
                safe = safe and read == {x} and _in_place_writer(node, x)
            elif i not in before:
                safe = False
        if safe:
            found.add(x)
    return found
