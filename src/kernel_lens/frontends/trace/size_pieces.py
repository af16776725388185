"""Size branches become ranges: a forward whose Python code branches on a size is lifted piece
by piece, each piece a part of the declared range with a graph of its own.

torch.export traces one path through the model's Python code. Code that branches on a size
(``if m == 48``, ``if cdiv(seq, 64) == 1``, Triton's binder folding an int argument equal to 1)
makes that path valid for part of the declared range only; torch then refuses the range (or,
with deferred asserts, records the condition). kernel_lens finds where each such condition holds
exactly (:func:`~.size_functions.truth_pieces`, conditions on one size), cuts every size's range
at the boundaries, keeps the traced graph for the cells where all its conditions hold, and traces
each other cell again with inputs resized into it (the example's data tiled or cut along the
resized dims) and the Dim narrowed to it, recursively. At most :data:`MAX_PIECES` graphs; the
result is a :class:`~kernel_lens.ir.GraphIR` with ``pieces``, dispatched by size at run time.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Callable

import sympy
import torch
from torch.export.dynamic_shapes import Dim, _DerivedDim

from ... import progress
from ...errors import KernelLensError, SizeBranchError, TraceError
from .export import SizeBranch
from ...ir import GraphIR, SizeBox, SizePiece, SymbolInfo, TensorValue, evaluate, parse
from ...ir.graph import UNBOUNDED  # the top of a declared range with no max, in a cell
from ...ir.names import is_identifier

log = logging.getLogger(__name__)

MAX_PIECES = 8  # graphs one model may be split into

Dim_ = tuple[int, int]  # (graph input index, dim)
Cell = dict[Dim_, tuple[int, int]]  # input dim -> [lo, hi]


def lift_in_pieces(lift_one: Callable[[tuple, Any], tuple[GraphIR, Any]], inputs: tuple,
                   dynamic_shapes: Any, input_names: list[str]) -> tuple[GraphIR, Any]:
    """``lift_one(inputs, dynamic_shapes) -> (ir, eager outputs)`` over the declared ranges, or,
    where it raises :class:`SizeBranchError`, piece by piece (module docstring); returns the IR
    and the example's eager outputs."""
    small = _sizes_zero_and_one(inputs, dynamic_shapes, input_names)
    if small:
        first = SizeBranchError("sizes 0 and 1 are traced on their own", small)
    else:
        try:
            return lift_one(inputs, dynamic_shapes)
        except SizeBranchError as exc:
            first = exc
    state = _State(lift_one, input_names, inputs, dynamic_shapes)
    pieces = state.region(inputs, dynamic_shapes, {}, first)
    ir = _combine(pieces, state)
    log.info("the forward branches on sizes: %d pieces\n%s", len(pieces), describe(ir))
    example = next(p for p in pieces if p[3])
    return ir, example[2]


class _State:
    def __init__(self, lift_one: Callable, input_names: list[str], example: tuple,
                 spec: Any = None) -> None:
        self.lift_one = lift_one
        self.spec = spec
        self.names = input_names
        self.example = example
        self.count = 0
        self.dim_names: dict[Dim_, str] = {}

    def index(self, label: str) -> int:
        if label.startswith("args[") and label.endswith("]"):
            return int(label[5:-1])
        if label in self.names:
            return self.names.index(label)
        raise TraceError(f"torch.export branched on a size of {label!r}, which is not an argument "
                         f"of the forward ({', '.join(self.names)})")

    def size(self, inputs: tuple, spec: Any, dim: Dim_) -> int:
        """The size of a branched dim in ``inputs``, in its root Dim's units (a derived dim
        ``16*blocks`` of 48 is 3: cells of a derived dim are ranges of its root)."""
        i, d = dim
        have = int(inputs[i].shape[d])
        entry = _entry(spec, i, self.names[i], d)
        if not isinstance(entry, _DerivedDim):
            return have
        lo, hi = 0, have  # derived dims are increasing affine functions of their root
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (mid + 1, hi) if int(entry.fn(mid)) < have else (lo, mid)
        return lo

    def region(self, inputs: tuple, spec: Any, cell: Cell, exc: SizeBranchError
               ) -> list[tuple[Cell, GraphIR, Any, bool]]:
        """The pieces of ``cell``, whose trace raised ``exc``: its range cut where the branch
        conditions change, each part traced again (recursively)."""
        by_dim: dict[Dim_, list] = {}
        for b in exc.branches:
            by_dim.setdefault((self.index(b.label), b.dim), []).append(b)
        dims = list(by_dim)
        cuts = {d: _cut([b.pieces for b in by_dim[d]]) for d in dims}
        out = []
        for combo in itertools.product(*(cuts[d] for d in dims)):
            box = {**cell, **{d: (lo, hi) for d, (lo, hi) in zip(dims, combo)}}
            self.count += 1
            if self.count > MAX_PIECES:
                conditions = "; ".join(dict.fromkeys(b.condition for b in exc.branches))
                raise TraceError(
                    f"the model's Python code branches on sizes into more than {MAX_PIECES} pieces "
                    f"of the declared range (conditions: {conditions}); kernel_lens compiles one "
                    f"graph per piece: narrow the Dim ranges to fewer pieces, or mark dims static")
            point = {d: min(max(self.size(inputs, spec, d), lo), hi) for d, (lo, hi) in box.items()}
            where = ", ".join(f"{self.names[i]}.shape[{k}] in [{lo}, {hi}]"
                              for (i, k), (lo, hi) in box.items())
            sub_inputs = resized_inputs(inputs, spec, self.names, point)
            sub_spec = narrowed(spec, self.names, box)
            log.info("size branch: tracing the piece %s at %s", where,
                     ", ".join(f"{self.names[i]}.shape[{k}]={v}" for (i, k), v in point.items()))
            try:
                ir, outputs = self.lift_one(sub_inputs, sub_spec)
                is_example = all(a is b for a, b in zip(sub_inputs, self.example))
                out.append((box, ir, outputs, is_example))
            except SizeBranchError as deeper:
                out += self.region(sub_inputs, sub_spec, box, deeper)
            except KernelLensError as err:
                raise type(err)(f"in the piece of the declared range where {where} (the model's "
                                f"code branches on sizes there): {err}") from err
        return out


def _sizes_zero_and_one(inputs: tuple, spec: Any, names: list[str]) -> list[SizeBranch]:
    """A branch at 2 for every declared range that holds size 0 or 1 and larger sizes: torch
    reasons as if a dynamic size were at least 2 (its "0/1 specialization": ``if n == 1``,
    ``min(n, 3)``, a stride of a size-1 dim are decided for the example's path, unguarded), so a
    graph traced at 4 would be silently wrong at 1. Sizes 0 and 1 are traced on their own, as
    static sizes; the rest of the range from 2."""
    out, seen = [], set()
    for i, name in enumerate(names):
        t = inputs[i] if i < len(inputs) else None
        for d in range(t.dim() if isinstance(t, torch.Tensor) else 0):
            entry = _entry(spec, i, name, d)
            root = entry.root if isinstance(entry, _DerivedDim) else entry
            if not isinstance(root, Dim) or id(root) in seen:
                continue
            if isinstance(entry, _DerivedDim) and any(  # split where the root itself is a dim
                    _entry(spec, j, names[j], k) is root for j in range(len(names))
                    for k in range(inputs[j].dim() if isinstance(inputs[j], torch.Tensor) else 0)):
                continue
            lo = int(root.min)  # a derived dim's cells are ranges of its root
            hi = int(root.max) if isinstance(root.max, int) else UNBOUNDED
            if lo <= 1 < hi:
                seen.add(id(root))
                out.append(SizeBranch(name, d, f"{name}.shape[{d}] >= 2",
                                      [(False, lo, 1), (True, 2, hi)]))
    return out


def _cut(conditions: list[list[tuple[bool, int, int]]]) -> list[tuple[int, int]]:
    """One size's range cut where any of its conditions changes truth; sizes 0 and 1 alone
    (a torch.export Dim's range ends at 2 or above, so they are traced as static sizes)."""
    bounds = sorted({b for parts in conditions for _, lo, hi in parts for b in (lo, hi + 1)})
    cells = [(lo, nxt - 1) for lo, nxt in zip(bounds, bounds[1:])]
    out = []
    for lo, hi in cells:
        while lo < hi and lo <= 1 and hi < 2:
            out.append((lo, lo))
            lo += 1
        out.append((lo, hi))
    return out


# --- inputs of another size ----------------------------------------------------------------------
def _entry(spec: Any, i: int, name: str, d: int) -> Any:
    entry = spec.get(name) if isinstance(spec, dict) else (
        spec[i] if isinstance(spec, (tuple, list)) and i < len(spec) else None)
    base, _, k = name.partition("[")  # ``caches[1]``: the 2nd argument of ``*caches``
    if entry is None and k and isinstance(spec, dict) and isinstance(spec.get(base), (tuple, list)):
        held, k = spec[base], int(k.rstrip("]"))
        entry = held[k] if k < len(held) else None
    if isinstance(entry, dict):
        return entry.get(d)
    if isinstance(entry, (tuple, list)) and d < len(entry):
        return entry[d]
    return None


def _roots(spec: Any, names: list[str], values: dict[Dim_, Any]) -> dict:
    """What each branched input dim's spec entry is keyed by for :func:`_rebuild`: its root Dim
    (``id``), or, for a Dim.AUTO/DYNAMIC hint, its place in the spec."""
    out = {}
    for (i, d), value in values.items():
        entry = _entry(spec, i, names[i], d)
        root = entry.root if isinstance(entry, _DerivedDim) else entry
        if isinstance(root, Dim):
            out[id(root)] = value
        else:
            out[("hint", names[i] if isinstance(spec, dict) else i, d)] = value
    return out


def resized_inputs(inputs: tuple, spec: Any, names: list[str], point: dict[Dim_, int]) -> tuple:
    """``inputs`` with every dim its spec ties to a branched size (the same Dim, or one derived
    from it) at the size ``point`` gives: the example's data tiled (or cut) along it, so
    index-like inputs keep values the model expects."""
    values = _roots(spec, names, point)
    out = []
    for i, t in enumerate(inputs):
        shape = list(t.shape)
        for d in range(t.dim()):
            entry = _entry(spec, i, names[i], d)
            if isinstance(entry, _DerivedDim) and id(entry.root) in values:
                shape[d] = int(entry.fn(values[id(entry.root)]))
            elif isinstance(entry, Dim) and id(entry) in values:
                shape[d] = values[id(entry)]
            elif (i, d) in point:
                shape[d] = point[(i, d)]
        out.append(t if shape == list(t.shape) else _resized(t, shape))
    return tuple(out)


def _resized(t: torch.Tensor, shape: list[int]) -> torch.Tensor:
    for d, n in enumerate(shape):
        have = t.shape[d]
        if have == n:
            continue
        if have == 0:
            t = torch.zeros((*t.shape[:d], n, *t.shape[d + 1:]), dtype=t.dtype, device=t.device)
            continue
        reps = -(-n // have)
        t = torch.cat([t] * reps, dim=d).narrow(d, 0, n) if reps > 1 else t.narrow(d, 0, n)
    return t.contiguous().clone()


# --- narrower Dims -------------------------------------------------------------------------------
def narrowed(spec: Any, names: list[str], box: Cell) -> Any:
    """The user's ``dynamic_shapes`` with the Dim of each input dim in ``box`` narrowed to its
    range there (static when the range is one size); derived Dims follow their root."""
    ranges = _roots(spec, names, box)
    new = {}
    for key, (lo, hi) in ranges.items():
        if isinstance(key, int):
            root = next(_dims_in(spec, key))
            new[key] = Dim.STATIC if lo == hi else Dim(root.__name__, min=lo, max=_top(hi))
        else:  # a Dim.AUTO/DYNAMIC hint: named as the IR names its symbol, <input>_<dim>
            owner = key[1] if isinstance(key[1], str) else names[key[1]]
            new[key] = Dim.STATIC if lo == hi else Dim(f"{owner}_{key[2]}", min=lo, max=_top(hi))
    return _rebuild(spec, new, [])


def _top(hi: int) -> Any:
    return hi if hi < UNBOUNDED else Dim("_").max  # torch's own "no max"


def _dims_in(spec: Any, ident: int):
    if isinstance(spec, _DerivedDim):
        yield from _dims_in(spec.root, ident)
    elif isinstance(spec, Dim) and id(spec) == ident:
        yield spec
    elif isinstance(spec, dict):
        for v in spec.values():
            yield from _dims_in(v, ident)
    elif isinstance(spec, (tuple, list)):
        for v in spec:
            yield from _dims_in(v, ident)


def _rebuild(spec: Any, new: dict, path: list) -> Any:
    if isinstance(spec, _DerivedDim):
        root = new.get(id(spec.root))
        if root is None:
            return spec
        return Dim.STATIC if root is Dim.STATIC else _DerivedDim(spec.__name__, root, spec.fn)
    if isinstance(spec, Dim):
        return new.get(id(spec), spec)
    if isinstance(spec, dict):
        return {k: _rebuild(v, new, [*path, k]) for k, v in spec.items()}
    if isinstance(spec, (tuple, list)):
        return type(spec)(_rebuild(v, new, [*path, i]) for i, v in enumerate(spec))
    if spec is not None and type(spec).__name__ == "_DimHint" and len(path) == 2:
        return new.get(("hint", path[0], path[1]), spec)
    return spec


# --- one IR ---------------------------------------------------------------------------------------
def _symbol_name(pieces: list, state: _State, dim: Dim_) -> str:
    """The IR symbol of a branched input dim: as the pieces that keep it dynamic name it, else
    its Dim's name (or ``<input>_<dim>``)."""
    i, d = dim
    entry = _entry(state.spec, i, state.names[i], d)
    derived = isinstance(entry, _DerivedDim)
    for _, ir, _, _ in pieces:
        for name, info in ir.symbols.items():
            if (info.input, info.dim) == (i, d) and (derived or (info.scale, info.offset) == (1, 0)):
                return name
    if isinstance(entry, Dim) and not isinstance(entry, _DerivedDim) and is_identifier(entry.__name__):
        return entry.__name__
    return f"{state.names[i]}_{d}"


def _combine(pieces: list[tuple[Cell, GraphIR, Any, bool]], state: _State) -> GraphIR:
    """The top-level IR: the interface and the declared ranges, and each piece's graph with
    kernel ids made unique across pieces."""
    example = next(ir for _, ir, _, is_example in pieces if is_example)
    dims = list(dict.fromkeys(d for cell, _, _, _ in pieces for d in cell))
    names = {d: _symbol_name(pieces, state, d) for d in dims}
    symbols: dict[str, SymbolInfo] = {}
    for _, ir, _, _ in pieces:
        for name, info in ir.symbols.items():
            if name in symbols:
                old = symbols[name]
                upper = None if old.max is None or info.max is None else max(old.max, info.max)
                symbols[name] = old.model_copy(update={"min": min(old.min, info.min), "max": upper})
            else:
                symbols[name] = info.model_copy()
    for d, name in names.items():
        lo = min(cell[d][0] for cell, _, _, _ in pieces)
        hi = max(cell[d][1] for cell, _, _, _ in pieces)
        entry = _entry(state.spec, d[0], state.names[d[0]], d[1])
        scale, offset = 1, 0
        if isinstance(entry, _DerivedDim):  # the dim is scale*root + offset; cells are root ranges
            offset = int(entry.fn(0))
            scale = int(entry.fn(1)) - offset
        symbols[name] = SymbolInfo(input=d[0], dim=d[1], min=lo, max=hi if hi < UNBOUNDED else None,
                                   example=state.size(state.example, state.spec, d),
                                   scale=scale, offset=offset)
    for name, info in list(symbols.items()):  # the example's own value
        if name in example.symbols:
            symbols[name] = info.model_copy(update={"example": example.symbols[name].example})
    values = {name: _interface_value(name, [ir for _, ir, _, _ in pieces], symbols)
              for name in example.inputs}
    values.update({name: example.values[name] for name in example.outputs})
    graphs = [ir for _, ir, _, _ in pieces]
    shared = {name: data for name, data in graphs[0].constants.items()  # weights, kept once
              if all(g.constants.get(name) == data for g in graphs)}
    taken: set[str] = set()
    out = []
    for k, (cell, graph, _, _) in enumerate(pieces):
        graph = unique_kernels(graph.model_copy(deep=True), k, taken)
        graph.constants = {n: c for n, c in graph.constants.items() if n not in shared}
        out.append(SizePiece(when=[SizeBox(ranges={names[d]: r for d, r in cell.items()})],
                             graph=graph))
    values.update({name: example.values[name] for name in shared})
    return GraphIR(name=example.name, display_name=example.display_name, arch=example.arch,
                   symbols=symbols, inputs=example.inputs, outputs=example.outputs,
                   values=values, constants=shared, pieces=out)


def _interface_value(name: str, graphs: list[GraphIR], symbols: dict[str, SymbolInfo]) -> TensorValue:
    """An input's value at the top level: the pieces' most dynamic spelling of it, with every
    dim a top-level symbol is read from named by that symbol."""
    best = max(graphs, key=lambda g: sum(not s.lstrip("-").isdigit() for s in g.values[name].shape))
    value = best.values[name].model_copy(deep=True)
    index = graphs[0].inputs.index(name)
    for sym, info in symbols.items():
        if info.input == index and (info.scale, info.offset) == (1, 0):
            value.shape[info.dim] = sym
    return value


def unique_kernels(graph: GraphIR, k: int, taken: set[str], tag: str = "p") -> GraphIR:
    """``graph`` (part ``k`` of a model) with each kernel id not in ``taken`` (then added to it):
    ``<id>_<tag><k>`` where another part has the id."""
    renames = {}
    for kid in graph.kernels:
        new, n = kid, 0
        while new in taken:
            n += 1
            new = f"{kid}_{tag}{k}" if n == 1 else f"{kid}_{tag}{k}_{n}"
        renames[kid] = new
        taken.add(new)
    if all(a == b for a, b in renames.items()):
        return graph
    data = graph.model_dump()
    data["kernels"] = {renames[kid]: {**kernel, "id": renames[kid]}
                       for kid, kernel in data["kernels"].items()}
    for launch in data["launches"]:
        launch["kernel"] = renames[launch["kernel"]]
        for d in launch["dispatch"]:
            d["kernel"] = renames[d["kernel"]]
    return GraphIR.model_validate(data)


def describe(ir: GraphIR) -> str:
    """One line per piece: the sizes it serves, its launches and kernels."""
    lines = []
    for k, piece in enumerate(ir.pieces):
        boxes = " or ".join(", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in box.ranges.items())
                            or "any size" for box in piece.when)
        kernels = ", ".join(sorted({k.name for k in piece.graph.kernels.values()})) or "none"
        lines.append(f"piece {k}: {boxes}: {len(piece.graph.launches)} launches ({kernels})")
    return "\n".join(lines)


# --- where a piece is least proven: its ends ---------------------------------------------------
_SIZES_OF: list = [None, None]  # the last IR asked about, and its tensors' element counts


def largest_tensor(ir: GraphIR, sizes: dict[str, int]) -> int:
    """Elements of the largest tensor whose size depends on a dynamic size, of any graph of
    ``ir``, at ``sizes`` (symbol -> value): what an evaluation there costs, roughly (an estimate:
    divisions in floating point)."""
    held = _SIZES_OF
    if held[0] is not ir:
        exprs: dict[str, tuple[tuple[str, ...], Callable]] = {}
        for graph in ir.graphs():
            names = list(graph.symbols)
            for value in graph.values.values():
                numel = sympy.Mul(*[parse(d, names) for d in value.shape])
                key = str(numel)
                if key not in exprs and numel.free_symbols:  # (weights cost the same anywhere)
                    used = tuple(sorted(str(x) for x in numel.free_symbols))
                    exprs[key] = (used, sympy.lambdify([sympy.Symbol(u) for u in used],
                                                       numel.xreplace({x: sympy.Symbol(str(x)) for x in numel.free_symbols}),
                                                       modules="math"))
        held[:] = [ir, list(exprs.values())]
    top = 0
    for used, fn in held[1]:
        if all(u in sizes for u in used):
            top = max(top, int(fn(*[sizes[u] for u in used])))
    return top


def piece_ends(ir: GraphIR, budget: int | None = None) -> list[tuple[int | None, dict[str, int]]]:
    """(piece index or None, sizes) for both ends of every piece's boxes (of the declared ranges,
    for a model with no pieces), each size not in the box at the example's value. With
    ``budget``, an end where a tensor of the model would hold more than ``budget`` elements is
    moved toward the example's sizes (all sizes alike) until none does: the largest end a slow
    evaluation (Triton's interpreter) can afford. Duplicates dropped."""
    example = {s: info.example for s, info in ir.symbols.items()}
    boxes: list[tuple[int | None, dict[str, tuple[int, int]]]] = []
    if ir.pieces:
        boxes = [(k, box.ranges) for k, p in enumerate(ir.pieces) for box in p.when]
    elif ir.symbols:
        boxes = [(None, {s: (i.min, i.max if i.max is not None else max(i.min, i.example))
                         for s, i in ir.symbols.items()})]
    out: list[tuple[int | None, dict[str, int]]] = []
    for k, ranges in boxes:
        for end in (0, 1):
            point = {**example, **{s: r[end] for s, r in ranges.items()}}
            if budget is not None and largest_tensor(ir, point) > budget:
                point = _within(ir, ranges, example, point, budget)
            if point is not None and (k, point) not in out:
                out.append((k, point))
    return out


def _within(ir: GraphIR, ranges: dict[str, tuple[int, int]], example: dict[str, int],
            end: dict[str, int], budget: int) -> dict[str, int] | None:
    """The point on the way from the box's point nearest the example to ``end`` that is nearest
    ``end`` with no tensor over ``budget`` elements, or over the start's own (the example's cost
    is always affordable: it was captured)."""
    start = {s: min(max(example[s], lo), hi) for s, (lo, hi) in ranges.items()}
    start = {**example, **start}

    def at(t: float) -> dict[str, int]:
        return {s: round(start[s] + t * (end[s] - start[s])) for s in end}
    budget = max(budget, largest_tensor(ir, start))  # never less than the example's own cost
    lo, hi = 0.0, 1.0
    for _ in range(24):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if largest_tensor(ir, at(mid)) <= budget else (lo, mid)
    return at(lo)


def inputs_at(ir: GraphIR, example: tuple, spec: Any, names: list[str], sizes: dict[str, int]) -> tuple:
    """The example inputs resized to ``sizes`` (symbol -> value; each input dim at
    ``scale*value + offset``), the example's data tiled or cut along the resized dims."""
    point = {}
    for s, value in sizes.items():
        info = ir.symbols[s]
        derived = isinstance(_entry(spec, info.input, names[info.input], info.dim), _DerivedDim)
        # resized_inputs takes a derived dim's size as its root's value (the symbol's own)
        point[(info.input, info.dim)] = value if derived else info.scale * value + info.offset
    return resized_inputs(example, spec, names, point)


# --- each piece proven at its ends (issue 38) ----------------------------------------------------
PROOF_BUDGET_CPU = 1 << 16  # elements of the largest tensor at an end captured in the interpreter
PROOF_BUDGET_GPU = 1 << 28  # captured natively


def prove_ends(ir: GraphIR, lift_one: Callable[[tuple, Any], GraphIR], inputs: tuple,
               spec: Any, names: list[str], budget: int, forward: str = "") -> GraphIR:
    """``ir`` with each piece's graph captured and traced again at both ends of its sizes
    (:func:`piece_ends`, within ``budget`` input elements) by ``lift_one(inputs, spec)`` and
    found to be the same graph there: those sizes are recorded in its ``proven_at``. A piece
    whose graph differs at an end is refused in one line: the model took another path there
    and torch.export recorded no condition to split the range on. (A model of one graph is
    traced over a range torch reasons about soundly: sizes 0 and 1 are always pieces of their
    own, :func:`_sizes_zero_and_one`; a piece of one size is traced at that size.)"""
    proven: dict[int, list[dict[str, int]]] = {}
    for k, sizes in piece_ends(ir, budget) if ir.pieces else ():
        graph, ranges = ir.pieces[k].graph, ir.pieces[k].when[0].ranges
        own = {s: info.example for s, info in graph.symbols.items()}
        if all(sizes.get(s) == own.get(s) for s in ranges) or all(lo == hi for lo, hi in ranges.values()):
            continue  # traced there (or at its only size)
        where = _brief_sizes(sizes)
        with progress.stage(f"prove piece {k} at {where}"):
            again = lift_one(inputs_at(ir, inputs, spec, names, sizes),
                             spec_for_box(ir, spec, names, ranges))
        mine, there = [(c.cond, c.where) for c in graph.checks], [(c.cond, c.where) for c in again.checks]
        if mine != there:  # the example's values, tiled to these sizes, take another value branch
            lines = sorted({w.split(" (")[0] for _, w in set(mine) ^ set(there)})
            raise TraceError(
                f"{forward + ': ' if forward else ''}kernel_lens proves each piece of a size range "
                f"at its ends with the example's values tiled to those sizes, and at {where} they "
                f"take another branch on tensor values ({'; '.join(lines)[:300]}) than the example: "
                f"give example inputs whose values take the same branches at every size, or make "
                f"the size static")
        problem = difference(graph, again, ir.constants)
        if problem is not None:
            box = ", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in ranges.items())
            raise TraceError(
                f"{forward + ': ' if forward else ''}the model takes another path at {where} than "
                f"at {_brief_sizes(own)} inside the piece of the declared range where {box}, and "
                f"torch.export recorded no condition that tells them apart: {problem}; narrow the "
                f"Dim range, or make the size static")
        proven.setdefault(k, []).append(sizes)
    if not proven:
        return ir
    pieces = [p.model_copy(update={"graph": p.graph.model_copy(update={"proven_at": proven.get(k, [])})})
              for k, p in enumerate(ir.pieces)]
    return ir.model_copy(update={"pieces": pieces})


def _brief_sizes(sizes: dict[str, int]) -> str:
    return ", ".join(f"{s}={v}" for s, v in sizes.items()) or "the example"


def spec_for_box(ir: GraphIR, spec: Any, names: list[str], ranges: dict[str, tuple[int, int]]) -> Any:
    """The user's ``dynamic_shapes`` narrowed to a box of symbol ranges (as the piece was traced)."""
    cell = {(ir.symbols[s].input, ir.symbols[s].dim): r for s, r in ranges.items()}
    return narrowed(spec, names, cell)


def difference(graph: GraphIR, again: GraphIR, shared: dict | None = None) -> str | None:
    """The first difference between a piece's graph and the same code traced at other sizes
    (ops with their arguments, constants, launches with grids, scalars and constexprs), in words;
    None when they are the same graph. Kernel ids, example sizes, captured grids and what the JIT
    assumed (alignment, divisibility) may differ; autotuned constexprs too (a config chosen per
    size is the tuner's, and any config computes the kernel)."""
    if len(graph.ops) != len(again.ops):
        return f"{len(again.ops)} torch ops there, {len(graph.ops)} in the piece"
    for a, b in zip(graph.ops, again.ops):
        if (a.op, a.args, a.kwargs, len(a.outputs)) != (b.op, b.args, b.kwargs, len(b.outputs)):
            return f"torch op {a.order} is {b.op}({_args(b)}) there, {a.op}({_args(a)}) in the piece"
    held = {**(shared or {}), **graph.constants}  # weights every piece shares are kept once, above
    changed = sorted(n for n in set(again.constants) | set(graph.constants)
                     if held.get(n) != again.constants.get(n))
    if changed:
        return f"the graph's constants differ ({', '.join(changed[:4])})"
    if len(graph.launches) != len(again.launches):
        return f"{len(again.launches)} kernel launches there, {len(graph.launches)} in the piece"
    for i, (a, b) in enumerate(zip(graph.launches, again.launches)):
        ka, kb = graph.kernels[a.kernel], again.kernels[b.kernel]
        what = f"launch {i} ({ka.name}, defined at {ka.source.file}:{ka.source.line})"
        if ka.source.source_hash != kb.source.source_hash:
            return f"{what} launches {kb.name} there"
        if tuple(a.grid) != tuple(b.grid):
            return f"{what} has grid {tuple(b.grid)} there, {tuple(a.grid)} in the piece"
        if a.guards != b.guards or [d.when for d in a.dispatch] != [d.when for d in b.dispatch]:
            return f"{what} chooses its variant by other conditions there"
        tuned = set(ka.options.autotune_config or {})
        for x, y in zip(a.args, b.args):
            if x.name in tuned:
                continue
            if x.model_dump(exclude={"role"}) != y.model_dump(exclude={"role"}):
                return f"{what} argument {x.name!r} is {_arg(y)} there, {_arg(x)} in the piece"
        for case_a, case_b in zip(a.dispatch or [a], b.dispatch or [b]):
            pa = {p.name: p.constexpr_value for p in graph.kernels[case_a.kernel].leaves()
                  if p.name not in tuned}
            pb = {p.name: p.constexpr_value for p in again.kernels[case_b.kernel].leaves()
                  if p.name not in tuned}
            if pa != pb:
                name = next(n for n in pa if pa[n] != pb.get(n))
                return f"{what} constexpr {name!r} is {pb.get(name)!r} there, {pa[name]!r} in the piece"
    if list(graph.outputs) != list(again.outputs):
        return "the graph returns other values there"
    return None


def _args(op: Any) -> str:
    text = ", ".join(str(a.model_dump()) for a in op.args)
    return text if len(text) <= 120 else text[:117] + "..."


def _arg(arg: Any) -> str:
    for field in ("expr", "constant", "value"):
        value = getattr(arg, field)
        if value is not None:
            return repr(value)
    return "unset"
