"""Graph optimizations on the lowered ONNX graph (issue 26).

A deployment compiler owns the whole graph, so it may spell the ATen part of a model in a form
that runs faster than the ops torch's exporter wrote. These passes do that on onnx_ir's model,
with the pass manager's discipline (:class:`kernel_lens.passes.base.PassManager` orders them by
``requires``/``provides``): each is named, verified after it runs (:func:`check_graph`), timed,
and can be dumped (:meth:`GraphPassManager.run`'s ``dump``). The user chooses them:
``kernel_lens.compile(..., optimize=1)`` / ``--opt-level 1`` (the default; ``0``: none), or a list
of names. The choice is data in the IR (``GraphIR.graph_passes``), so ``dump-ir`` shows it, every
target lowers the same graph, and the lowering cache keys on it.

The user's Triton launches are never touched (their nodes, inputs and outputs stay as they
are): a pass only re-spells standard ONNX ops around them.

* ``fuse_sibling_matmuls``: MatMuls that read the same activation with constant 2-D weights of
  one dtype and depth (q/k/v; gate/up) become one MatMul over the weights concatenated along N,
  then a Split. One GEMM streams the weights of several; each output element is still one dot
  product of the same row and column (cuBLAS may tile the wider GEMM differently, so the last
  bits can differ from the separate GEMMs').
* ``gqa_without_expand``: grouped-query attention written as torch writes it (``repeat_kv``:
  ``Unsqueeze`` -> ``Expand`` -> ``Reshape`` of each K/V cache to the query heads, then
  ``Attention``) reads the K/V heads as they are: the ``G`` query heads sharing a K/V head are
  folded into the query length (``[B, Hkv*G, L, D] -> [B, Hkv, G*L, D]``), attention runs with
  ``Hkv`` heads, and the result is unfolded. Each query row still attends the same keys with the
  same mask, so no expanded K/V copy is made (at a 4096-position cache, batch 8, that copy is
  256 MB per layer and step). Only where the mask (if any) is the same for every head (its
  head dim is 1) and has one row for all query rows or one per query row (repeated for the
  folded rows: ONNX Runtime wants a mask row per query row), and attention is not causal:
  ``is_causal`` masks by the row's index, which folding moves, so a causal prefill would need an
  explicit ``[G*L, S]`` mask, more bytes than the K/V expand it replaces at prefill lengths; ORT's
  CUDA ``Attention`` has no grouped-query path of its own (its source throws for ``Hq != Hkv``;
  read, not tried on ORT 1.31.1).

Two optimizations are made before the graph exists, while the forward is captured and traced,
and are chosen here like the others (level 2, or by name); their launches are in the IR like the
user's (:mod:`kernel_lens.frontends.own_kernels`), and their results are not bit-identical to
cuBLAS's or ORT's attention (another summation order):

* ``own_skinny_gemm``: ``F.linear`` (every ``nn.Linear``) with at most 16 rows, fp16/bf16, runs
  kernel_lens's own skinny GEMM (``kernel_lens.kernels.skinny_gemm``) instead of an ONNX MatMul,
  with a residual added to its result in its epilogue (the bits of the GEMM then the add; the
  lowering drops the launch whose result nothing else reads);
* ``own_decode_attention``: ``F.scaled_dot_product_attention`` of one query position, fp16/bf16,
  no dropout, not causal, a bool mask of one row of keys (or none), runs kernel_lens's own
  split-KV decode attention (``kernel_lens.kernels.decode_attention``) instead of ONNX
  ``Attention``, reading ``repeat_kv``'d K/V heads where they lie.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Iterable, Sequence

import numpy as np
import onnx_ir as oir

from .. import progress
from ..errors import InputError, PostconditionError
from ..passes.base import PassManager

log = logging.getLogger(__name__)

#: ``optimize=<level>`` -> the graph passes it runs (``kernel_lens.compile``, ``--opt-level``)
LEVELS: dict[int, tuple[str, ...]] = {
    0: (),
    1: ("fuse_sibling_matmuls", "gqa_without_expand"),
    2: ("fuse_sibling_matmuls", "gqa_without_expand", "own_skinny_gemm", "own_decode_attention"),
}
DEFAULT_LEVEL = 1


class GraphPass:
    """One optimization of the lowered graph: ``run(model) -> rewrites made`` (0: unchanged)."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    options: ClassVar[dict[str, type]] = {}  # the pass manager's interface; graph passes take none

    def run(self, model: oir.Model) -> int:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<graph pass {self.name}>"


# ----------------------------------------------------------------------------- helpers


def _const(value: oir.Value | None) -> np.ndarray | None:
    tensor = oir.convenience.get_const_tensor(value) if value is not None else None
    return None if tensor is None else tensor.numpy()


def _initializer(graph: oir.Graph, name: str, array: np.ndarray) -> oir.Value:
    """A new initializer holding ``array``, under a name no value of ``graph`` has."""
    unique = _fresh(graph, name)
    tensor = oir.tensor(array, name=unique)
    value = oir.Value(name=unique, shape=oir.Shape(array.shape), type=oir.TensorType(tensor.dtype),
                      const_value=tensor)
    graph.register_initializer(value)
    return value


def _taken(graph: oir.Graph) -> set[str]:
    """Every name a value or node of ``graph`` has."""
    names = {v.name for n in graph for v in n.outputs} | {n.name for n in graph}
    return names | set(graph.initializers) | {v.name for v in graph.inputs}


def _fresh(graph: oir.Graph, name: str) -> str:
    """``name``, or ``name.1``, ``name.2``, ...: the first no value or node of ``graph`` has (two
    unnamed nodes a pass rewrites must not give their new values one name: SSA)."""
    taken = _taken(graph)
    unique, k = name, 1
    while unique in taken:
        unique, k = f"{name}.{k}", k + 1
    return unique


def _base(node: oir.Node) -> str:
    """The name new values made for ``node`` are scoped by (its op type when it has none)."""
    return node.name or node.op_type


def _node(domain: str, op: str, inputs: list, name: str, *, type: oir.TypeProtocol | None = None,
          shape: Sequence | oir.Shape | None = None, **kw) -> oir.Node:
    """A new node whose (first) output is named as the node: names scoped by the op they replace
    (``op17/MatMul_66.fused``), as the lowering scopes its helper values (the caller makes them
    unique, :func:`_fresh`); that output's ``type`` and ``shape`` are set where given."""
    node = oir.Node(domain, op, inputs, name=name, **kw)
    out = node.outputs[0]
    out.name, out.type = name, type
    if shape is not None:
        out.shape = shape if isinstance(shape, oir.Shape) else oir.Shape(shape)
    return node


def _attr_int(node: oir.Node, name: str, default: int = 0) -> int:
    attr = node.attributes.get(name)
    return default if attr is None else attr.as_int()


def _take_names(old: Sequence[oir.Value], new: Sequence[oir.Value]) -> None:
    """The replacements keep the names of the values they replace (removed from the graph by
    now): later stages, error messages and per-launch verify see the names the lowering gave."""
    for was, value in zip(old, new):
        name, was.name = was.name, None
        value.name = name


def _drop_unused_initializers(graph: oir.Graph, values: Iterable[oir.Value]) -> None:
    for value in values:
        if value.is_initializer() and not value.uses() and not value.is_graph_input() \
                and not value.is_graph_output():
            graph.initializers.pop(value.name, None)


# ----------------------------------------------------------------------------- the passes


class FuseSiblingMatMuls(GraphPass):
    name = "fuse_sibling_matmuls"
    description = "MatMuls of one activation by constant weights -> one MatMul + Split"
    provides = frozenset({"sibling_matmuls_fused"})

    def run(self, model: oir.Model) -> int:
        graph = model.graph
        groups: dict[tuple, list[oir.Node]] = {}
        for node in graph:
            key = self._key(node)
            if key is not None:
                groups.setdefault(key, []).append(node)
        fused = 0
        for nodes in groups.values():
            if len(nodes) > 1:
                self._fuse(graph, nodes)
                fused += 1
        return fused

    @staticmethod
    def _key(node: oir.Node) -> tuple | None:
        """What a sibling must share: the activation, the weights' dtype and depth K."""
        if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.inputs) != 2:
            return None
        x, w = node.inputs
        out = node.outputs[0]
        if x is None or w is None or out.is_graph_output() or not w.is_initializer() \
                or w.const_value is None or len(w.const_value.shape) != 2:
            return None
        if x.shape is None or len(x.shape) < 2:  # a 1-D activation drops N's axis: no Split
            return None
        return (id(x), w.const_value.dtype, w.const_value.shape[0])

    @staticmethod
    def _fuse(graph: oir.Graph, nodes: list[oir.Node]) -> None:
        x = nodes[0].inputs[0]
        weights = [n.inputs[1] for n in nodes]
        arrays = [_const(w) for w in weights]
        widths = [a.shape[1] for a in arrays]
        cat = _initializer(graph, f"{weights[0].name}.fused", np.concatenate(arrays, axis=1))
        sizes = _initializer(graph, f"{weights[0].name}.fused_split", np.asarray(widths, np.int64))
        old = [n.outputs[0] for n in nodes]
        base = _base(nodes[0])
        matmul = _node("", "MatMul", [x, cat], _fresh(graph, f"{base}.fused"), type=old[0].type)
        split = oir.Node("", "Split", [matmul.outputs[0], sizes], attributes=[oir.AttrInt64("axis", -1)],
                         num_outputs=len(nodes), name=_fresh(graph, f"{base}.fused_split"))
        if all(o.shape is not None for o in old):
            shape = list(old[0].shape)
            shape[-1] = sum(widths)
            matmul.outputs[0].shape = oir.Shape(shape)
        for new, was in zip(split.outputs, old):
            new.shape, new.type = was.shape, was.type
        graph.insert_before(nodes[0], [matmul, split])
        for new, was in zip(split.outputs, old):
            was.replace_all_uses_with(new)
        graph.remove(nodes, safe=True)
        _take_names(old, split.outputs)
        _drop_unused_initializers(graph, weights)


@dataclass
class _Repeated:
    """A K or V input of attention made by ``repeat_kv``: the cache and its group size."""
    cache: oir.Value
    groups: int
    chain: list[oir.Node] = field(default_factory=list)


class GqaWithoutExpand(GraphPass):
    name = "gqa_without_expand"
    description = "attention over repeat_kv'd K/V -> attention over the K/V heads, query groups folded"
    provides = frozenset({"kv_heads_not_expanded"})

    def run(self, model: oir.Model) -> int:
        graph = model.graph
        done = 0
        for node in list(graph):
            plan = self._match(node)
            if plan is not None:
                self._fold(graph, node, *plan)
                done += 1
        return done

    @staticmethod
    def _repeated(value: oir.Value | None) -> _Repeated | None:
        """``Reshape(Expand(Unsqueeze(cache, [2]), [B, H, G, S, D]), [B, H*G, S, D])``."""
        reshape = value.producer() if value is not None else None
        if reshape is None or reshape.op_type != "Reshape":
            return None
        expand = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
        if expand is None or expand.op_type != "Expand":
            return None
        unsqueeze = expand.inputs[0].producer() if expand.inputs[0] is not None else None
        if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or len(unsqueeze.inputs) != 2:
            return None
        axes = _const(unsqueeze.inputs[1])
        cache = unsqueeze.inputs[0]
        if axes is None or axes.reshape(-1).tolist() not in ([2], [-3]):
            return None
        shapes = [cache.shape, expand.outputs[0].shape, value.shape]
        if any(s is None for s in shapes):
            return None
        c, e, r = (list(s) for s in shapes)
        if len(c) != 4 or len(e) != 5 or len(r) != 4:
            return None
        groups = e[2]
        if not all(isinstance(d, int) for d in (c[1], c[3], groups, r[1])) or groups < 1:
            return None
        # the expand repeats axis 2 only; the reshape merges (heads, groups) and keeps the rest
        if [e[0], e[1], e[3], e[4]] != c or r != [c[0], c[1] * groups, c[2], c[3]]:
            return None
        return _Repeated(cache, groups, [reshape, expand, unsqueeze])

    def _match(self, node: oir.Node) -> tuple[_Repeated, _Repeated] | None:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or len(node.inputs) < 3:
            return None
        if len(node.inputs) > 4 and any(v is not None for v in node.inputs[4:]):
            return None  # past key/value
        if any(o.uses() or o.is_graph_output() for o in node.outputs[1:]):
            return None  # present key/value or QK output read
        if _attr_int(node, "is_causal") or "q_num_heads" in node.attributes \
                or _attr_int(node, "qk_matmul_output_mode") \
                or (node.attributes.get("softcap") is not None and node.attributes["softcap"].as_float()):
            return None
        q, k, v = node.inputs[:3]
        rk, rv = self._repeated(k), self._repeated(v)
        if rk is None or rv is None or rk.groups != rv.groups or rk.groups == 1:
            return None
        if q.shape is None or len(q.shape) != 4 or q.shape[1] != k.shape[1] \
                or not isinstance(q.shape[3], int):
            return None
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        if mask is not None:
            dims = list(mask.shape) if mask.shape is not None else None
            # one mask for every head; a row per query row, or one row for all
            if dims is None or len(dims) < 2 or dims[-2] not in (1, q.shape[2]) \
                    or (len(dims) >= 3 and dims[-3] != 1):
                return None
            if (dims[-2] != 1 or q.shape[2] == 1) and not isinstance(dims[-1], int):
                return None  # its rows are merged by a Reshape that names the key length
        return rk, rv

    @staticmethod
    def _fold(graph: oir.Graph, node: oir.Node, rk: _Repeated, rv: _Repeated) -> None:
        q = node.inputs[0]
        base = _base(node)
        made_names: set[str] = set()

        def name(suffix: str) -> str:  # unique in the graph and among this fold's new nodes
            unique, k = _fresh(graph, f"{base}.{suffix}"), 1
            while unique in made_names:
                unique, k = _fresh(graph, f"{base}.{suffix}.{k}"), k + 1
            made_names.add(unique)
            return unique
        kv_heads, head = rk.cache.shape[1], q.shape[3]
        v_head = rv.cache.shape[3]
        heads = q.shape[1]
        fold = _initializer(graph, f"{base}.fold", np.asarray([0, kv_heads, -1, head], np.int64))
        unfold = _initializer(graph, f"{base}.unfold", np.asarray([0, heads, -1, v_head], np.int64))
        length = q.shape[2] * rk.groups if isinstance(q.shape[2], int) else None
        folded = _node("", "Reshape", [q, fold], name("fold_groups"), type=q.type,
                       shape=[q.shape[0], kv_heads, length, head])
        mask = node.inputs[3] if len(node.inputs) > 3 else None
        made = [folded]
        if mask is not None:  # its one row repeated for the folded rows (ORT wants them all)
            made += GqaWithoutExpand._mask_rows(graph, node, mask, folded.outputs[0], length, name)
            mask = made[-1].outputs[0]
        inputs = [folded.outputs[0], rk.cache, rv.cache, *([mask] if mask is not None else [])]
        old = node.outputs[0]
        attention = _node(node.domain, "Attention", inputs, name("kv_heads"), type=old.type,
                          attributes=list(node.attributes.values()), version=node.version)
        unfolded = _node("", "Reshape", [attention.outputs[0], unfold], name("unfold_groups"),
                         type=old.type, shape=old.shape)
        graph.insert_before(node, [*made, attention, unfolded])
        old.replace_all_uses_with(unfolded.outputs[0], replace_graph_outputs=True)
        graph.remove(node, safe=True)
        _take_names([old], unfolded.outputs)
        for chain in (rk.chain, rv.chain):  # repeat_kv's nodes, unless something else reads them
            for n in chain:
                if n.graph is graph and not any(o.uses() or o.is_graph_output() for o in n.outputs):
                    graph.remove(n, safe=True)


    @staticmethod
    def _mask_rows(graph: oir.Graph, node: oir.Node, mask: oir.Value, folded_q: oir.Value,
                   length: int | None, name: Callable[[str], str]) -> list[oir.Node]:
        """The mask's rows for the folded query rows (``g*L + l`` reads row ``l``; ONNX Runtime
        takes a mask whose query dim equals the query length, none that broadcasts). A row per
        query row: ``Unsqueeze`` a group axis, ``Expand`` it to ``G``, ``Reshape`` (groups, rows)
        into one axis; one row for all: ``Expand`` it to the folded length. Only ops ORT's CUDA EP
        runs for every mask dtype (its ``Tile`` has no ``bool`` kernel: a Tile of a boolean mask
        would run on the CPU, and a session with a CPU node cannot be captured in a CUDA graph)."""
        rank = len(mask.shape)
        ones = [1] * (rank - 2)
        rows_out = [*mask.shape[:-2], length, mask.shape[-1]]
        if mask.shape[-2] != 1 or node.inputs[0].shape[2] == 1:  # a row per query row
            groups = node.inputs[0].shape[1] // folded_q.shape[1]
            axis = _initializer(graph, f"{_base(node)}.mask_group_axis", np.asarray([rank - 2], np.int64))
            unsqueeze = _node("", "Unsqueeze", [mask, axis], name("mask_group"), type=mask.type,
                              shape=[*mask.shape[:-2], 1, *mask.shape[-2:]])
            repeats = _initializer(graph, f"{_base(node)}.mask_groups", np.asarray([*ones, groups, 1, 1], np.int64))
            expand = _node("", "Expand", [unsqueeze.outputs[0], repeats], name("mask_repeat"),
                           type=mask.type, shape=[*mask.shape[:-2], groups, *mask.shape[-2:]])
            merged = _initializer(graph, f"{_base(node)}.mask_merge",
                                  np.asarray([*([0] * (rank - 2)), -1, mask.shape[-1]], np.int64))
            reshape = _node("", "Reshape", [expand.outputs[0], merged], name("mask_rows"),
                            type=mask.type, shape=rows_out)
            return [unsqueeze, expand, reshape]
        made = []
        if length is not None:
            rows = _initializer(graph, f"{_base(node)}.mask_rows", np.asarray([*ones, length, 1], np.int64))
        else:  # the folded length at run time: Shape(q)[2]
            shape = _node("", "Shape", [folded_q], name("query_length"),
                          attributes=[oir.AttrInt64("start", 2), oir.AttrInt64("end", 3)])
            head = _initializer(graph, f"{_base(node)}.mask_ones", np.asarray(ones, np.int64))
            tail = _initializer(graph, f"{_base(node)}.mask_one", np.asarray([1], np.int64))
            concat = _node("", "Concat", [head, shape.outputs[0], tail], name("mask_rows"),
                           attributes=[oir.AttrInt64("axis", 0)])
            made, rows = [shape, concat], concat.outputs[0]
        expand = _node("", "Expand", [mask, rows], name("mask_expand"), type=mask.type,
                       shape=rows_out)
        return [*made, expand]


PASSES: dict[str, type[GraphPass]] = {p.name: p for p in (FuseSiblingMatMuls, GqaWithoutExpand)}
#: optimizations made in the front half (capture and trace), named and chosen like graph passes
FRONT_END: tuple[str, ...] = ("own_skinny_gemm", "own_decode_attention")


# ----------------------------------------------------------------------------- choosing, running


def resolve(optimize: int | Sequence[str] | None) -> list[str]:
    """The graph passes ``optimize`` names: a level of :data:`LEVELS` (None: the default level),
    or pass names (each known, none twice). InputError naming the bad value otherwise."""
    if optimize is None:
        optimize = DEFAULT_LEVEL
    if isinstance(optimize, bool) or not isinstance(optimize, (int, list, tuple)):
        raise InputError(f"optimize={optimize!r}: give a level ({', '.join(map(str, LEVELS))}) or a "
                         f"list of graph pass names ({', '.join([*PASSES, *FRONT_END])})")
    if isinstance(optimize, int):
        if optimize not in LEVELS:
            raise InputError(f"optimize={optimize}: the levels are {', '.join(map(str, LEVELS))} "
                             f"(0: no graph optimizations; {DEFAULT_LEVEL}: {', '.join(LEVELS[DEFAULT_LEVEL])})")
        return list(LEVELS[optimize])
    names = list(optimize)
    for name in names:
        if name not in PASSES and name not in FRONT_END:
            raise InputError(f"optimize names graph pass {name!r}, which does not exist; graph passes: "
                             f"{', '.join([*PASSES, *FRONT_END])}")
    if len(set(names)) != len(names):
        raise InputError(f"optimize={names}: a graph pass is named twice")
    return names


def check_graph(graph: oir.Graph) -> None:
    """The graph's invariants: every node reads only values defined before it (graph inputs,
    initializers, earlier nodes' outputs), every graph output is defined, and every value's name
    is defined once (SSA: ONNX names are how values are found)."""
    defined = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    names = [v.name for v in graph.inputs] + list(graph.initializers) + \
        [o.name for n in graph for o in n.outputs if o.name]
    twice = sorted({n for n in names if names.count(n) > 1}) if len(set(names)) != len(names) else []
    if twice:
        raise ValueError(f"value name {twice[0]!r} is defined more than once (the graph is not in "
                         f"SSA form)")
    for node in graph:
        for value in node.inputs:
            if value is not None and id(value) not in defined and value.const_value is None:
                raise ValueError(f"node {node.name!r} ({node.op_type}) reads {value.name!r} before it "
                                 f"is defined")
        defined.update(id(o) for o in node.outputs)
    for value in graph.outputs:
        if id(value) not in defined:
            raise ValueError(f"graph output {value.name!r} is no longer produced")


@dataclass
class GraphPassTiming:
    name: str
    seconds: float
    rewrites: int


class GraphPassManager(PassManager):
    """The graph passes named, in requires/provides order, each verified and timed; ``dump``
    (``dump(name, model)``) sees the model after each pass."""

    def __init__(self, names: Iterable[str]):
        super().__init__([PASSES[n]() for n in resolve(list(names)) if n in PASSES])
        self.graph_timings: list[GraphPassTiming] = []

    def run_on(self, model: oir.Model, *,
               dump: Callable[[str, oir.Model], None] | None = None) -> list[GraphPassTiming]:
        self.graph_timings = []
        for p in self.order():
            start = time.perf_counter()
            with progress.stage(f"graph pass {p.name}") as shown:
                rewrites = p.run(model)
                shown.note = f"{rewrites} rewrite{'s' * (rewrites != 1)}"
            try:
                check_graph(model.graph)
            except ValueError as exc:
                raise PostconditionError(f"the ONNX graph is broken after graph pass {p.name!r}: "
                                         f"{exc}") from exc
            timing = GraphPassTiming(p.name, time.perf_counter() - start, rewrites)
            self.graph_timings.append(timing)
            log.info("graph pass %-22s %8.1f ms, %d rewrites", p.name, timing.seconds * 1e3, rewrites)
            if dump is not None:
                dump(p.name, model)
        return self.graph_timings
