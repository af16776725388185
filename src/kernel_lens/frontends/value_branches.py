"""Several examples, several traced branches: ``kernel_lens.compile(..., extra_examples=[...])``.

A forward that branches on tensor values (``if mask.any().item():``) is traced along the branch
its example takes; the graph keeps the branch's conditions as run-time checks
(``GraphIR.checks``), and a call taking another branch fails naming the line. Each extra example
is captured and traced the same way. Examples whose checks are the same took the same branches
and add nothing; the others become ``GraphIR.branches``, tried in order at run time (the
example's first): the first branch whose checks hold serves the call, and a call no example's
branch admits fails with the last branch's check (:mod:`kernel_lens.onnx.branches` lowers the
choice to ONNX ``If``).

Every example must describe the same call: the same inputs (count, dtypes, ranks) and, for each
dim the dynamic shapes leave static, the same size. A branch's sizes are its own graph's
business; the top level keeps the interface, the symbol ranges every branch serves, and the
weights every branch shares (once).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Sequence

import torch

from ..errors import InputError, UnsupportedKernelError
from ..ir import GraphIR, ValueBranch
from .trace.size_pieces import spec_for_box, unique_kernels

log = logging.getLogger(__name__)


def check_extra_examples(extra_examples: object, example: tuple, names: list[str]) -> list[tuple]:
    """``extra_examples`` as a list of input tuples like ``example``, or one-line InputError."""
    if extra_examples is None:
        return []
    if isinstance(extra_examples, torch.Tensor) or not isinstance(extra_examples, (list, tuple)):
        raise InputError(f"extra_examples must be a list of input tuples (one per extra example), "
                         f"got {type(extra_examples).__name__}")
    out = []
    for k, inputs in enumerate(extra_examples):
        if isinstance(inputs, torch.Tensor):
            inputs = (inputs,)
        if not isinstance(inputs, (list, tuple)) or len(inputs) != len(example):
            got = len(inputs) if isinstance(inputs, (list, tuple)) else type(inputs).__name__
            raise InputError(f"extra_examples[{k}] must be a tuple of {len(example)} tensors like "
                             f"example_inputs, got {got}")
        for name, t, first in zip(names, inputs, example):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"extra_examples[{k}]: input {name!r} is a {type(t).__name__}, "
                                 f"not a torch.Tensor")
            if (t.dtype, t.dim(), t.device) != (first.dtype, first.dim(), first.device):
                raise InputError(f"extra_examples[{k}]: input {name!r} is {t.dtype}, rank {t.dim()} "
                                 f"on {t.device}; example_inputs has {first.dtype}, rank "
                                 f"{first.dim()} on {first.device}: an extra example is another "
                                 f"call of the same model")
        out.append(tuple(inputs))
    return out


def _key(graph: GraphIR) -> list[tuple[str, str]]:
    return [(c.cond, c.where) for c in graph.checks]


def with_branches(main: GraphIR, extra: Sequence[tuple[int, GraphIR]], names: list[str],
                  taken: set[str] | None = None) -> GraphIR:
    """``main`` (the example's graph) and the graphs traced from extra examples (``(k, graph)``:
    ``extra_examples[k - 1]``'s) as one IR: ``main`` itself when every example took its
    branches, else one with ``branches`` (kernel ids unique, also against ``taken``)."""
    if not extra:
        return main
    kept: list[tuple[int, GraphIR]] = [(0, main)]
    for k, graph in extra:
        for name in main.inputs:
            if graph.values[name].shape != main.values[name].shape:
                raise InputError(
                    f"extra_examples[{k - 1}]: input {names[main.inputs.index(name)]!r} was traced "
                    f"with shape [{', '.join(graph.values[name].shape)}], example_inputs with "
                    f"[{', '.join(main.values[name].shape)}]: a dim that differs between examples "
                    f"must be dynamic (dynamic_shapes)")
        for i, (mine, theirs) in enumerate(zip(main.outputs, graph.outputs)):
            a, b = main.values[mine], graph.values[theirs]
            if (a.dtype, len(a.shape)) != (b.dtype, len(b.shape)):
                raise UnsupportedKernelError(
                    f"output {i} is {b.dtype.value} of rank {len(b.shape)} on the branch "
                    f"extra_examples[{k - 1}] takes, {a.dtype.value} of rank {len(a.shape)} on the "
                    f"example's: a compiled model gives each output one dtype and rank (cast "
                    f"or reshape it the same way on every branch)")
        same = next((j for j, g in kept if _key(g) == _key(graph)), None)
        if same is not None:
            log.info("extra_examples[%d] took the same branches as %s", k - 1,
                     "example_inputs" if same == 0 else f"extra_examples[{same - 1}]")
            continue
        kept.append((k, graph))
    if len(kept) == 1:
        return main
    plain = [k for k, g in kept if not g.checks]
    if plain:
        which = "example_inputs" if plain[0] == 0 else f"extra_examples[{plain[0] - 1}]"
        raise UnsupportedKernelError(
            f"{which} took no branch on tensor values but another example did: the forward's "
            f"path depends on something kernel_lens does not see (a global, a random draw, state "
            f"kept between calls); make the forward a function of its inputs")
    return _combine(kept, set(taken or ()))


def _combine(kept: list[tuple[int, GraphIR]], taken: set[str]) -> GraphIR:
    main = kept[0][1]
    graphs = [g for _, g in kept]
    symbols = {}
    for name, info in main.symbols.items():  # the sizes every branch serves
        los = [g.symbols[name].min for g in graphs if name in g.symbols]
        his = [g.symbols[name].max for g in graphs if name in g.symbols]
        upper = None if all(h is None for h in his) else min(h for h in his if h is not None)
        symbols[name] = info.model_copy(update={"min": max(los), "max": upper})
        if upper is not None and upper < max(los):
            raise UnsupportedKernelError(f"the examples' branches serve no common size of {name}")
    shared = {name: data for name, data in main.constants.items()  # weights, kept once
              if all(g.constants.get(name) == data for g in graphs)}
    values = {name: main.values[name] for name in [*main.inputs, *main.outputs, *shared]}
    branches = []
    for k, (example, graph) in enumerate(kept):
        graph = unique_kernels(graph.model_copy(deep=True), k, taken, tag="b")
        graph.constants = {n: c for n, c in graph.constants.items() if n not in shared}
        branches.append(ValueBranch(example=example, graph=graph))
    return GraphIR(name=main.name, display_name=main.display_name, arch=main.arch, symbols=symbols,
                   inputs=main.inputs, outputs=main.outputs, values=values, constants=shared,
                   branches=branches)


def lift_branches(lift_one: Callable[[tuple, Any], tuple[GraphIR, Any]], main: GraphIR,
                  extra_examples: list[tuple], dynamic_shapes: Any, names: list[str]) -> GraphIR:
    """Each extra example captured and traced (``lift_one(inputs, dynamic_shapes)``), combined
    with ``main``; in a model split by size, with the piece its sizes fall in (traced with that
    piece's ranges, as the piece was)."""
    if not extra_examples:
        return main
    if not main.pieces:
        return with_branches(main, [(k, lift_one(inputs, dynamic_shapes)[0])
                                    for k, inputs in enumerate(extra_examples, 1)], names)

    joined: dict[int, list[tuple[int, GraphIR]]] = {}
    for k, inputs in enumerate(extra_examples, 1):
        sizes = {s: (inputs[info.input].shape[info.dim] - info.offset) // info.scale
                 for s, info in main.symbols.items()}
        found = [(j, box) for j, piece in enumerate(main.pieces) for box in piece.when
                 if box.contains(sizes)]
        if not found:
            raise InputError(f"extra_examples[{k - 1}] has sizes {sizes}, outside the declared "
                             f"ranges of the dynamic shapes")
        j, box = found[0]
        graph = lift_one(inputs, spec_for_box(main, dynamic_shapes, names, box.ranges))[0]
        joined.setdefault(j, []).append((k, graph))
    pieces = []
    for j, piece in enumerate(main.pieces):
        others = {kid for i, p in enumerate(main.pieces) if i != j for kid in p.graph.all_kernels()}
        others |= {kid for p in pieces for kid in p.graph.all_kernels()}
        graph = with_branches(piece.graph, joined.get(j, []), names, taken=others)
        pieces.append(piece.model_copy(update={"graph": graph}))
    return GraphIR(**{**dict(main), "pieces": pieces})  # validated: kernel ids unique across all
