"""Passes and the pass manager.

A pass is a small class: ``run(ir, ctx) -> PassResult``, with the facts it ``requires`` and
``provides``. The manager orders passes by those facts (a DAG), checks pre- and
post-conditions, verifies IR invariants between passes, times each pass and can dump the IR
after any of them.
"""

from __future__ import annotations

import difflib
import heapq
import logging
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Iterable, Protocol

from pydantic import ValidationError

from .. import progress
from ..errors import PassError, PostconditionError, PreconditionError
from ..fileio import inside, subfolder
from ..ir import GraphIR, KernelBinary, KernelIR
from ..ir.kernel import Specialization

if TYPE_CHECKING:
    import networkx as nx

log = logging.getLogger(__name__)


@dataclass
class PassResult:
    ir: GraphIR
    modified: bool


class KernelCompiler(Protocol):
    """What the specialization pass calls to compile a kernel (the driver passes Triton's, see
    :func:`kernel_lens.compiler.pass_context`): a binary of ``kernel`` for ``arch`` under
    ``assumptions`` (``specialized``: the fast variant, else the generic one)."""

    def __call__(self, kernel: KernelIR, arch: int, assumptions: dict[str, Specialization],
                 specialized: bool) -> KernelBinary: ...


@dataclass
class PassContext:
    """What passes may use besides the IR: options (each declared by a pass, see
    :attr:`Pass.options`) and the kernel compiler service."""

    options: dict[str, Any] = field(default_factory=dict)
    compile_binary: KernelCompiler | None = None


class Pass:
    """Base class. Subclasses set ``name``, ``requires``, ``provides`` and implement ``run``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    requires: ClassVar[frozenset[str]] = frozenset()
    provides: ClassVar[frozenset[str]] = frozenset()
    #: options the pass reads from ``ctx.options``: name -> type (the manager refuses others)
    options: ClassVar[dict[str, type]] = {}

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise the error naming a bad value of this pass's options (before any work)."""

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        raise NotImplementedError

    def ensures(self, ir: GraphIR) -> None:
        """Raise PostconditionError when the pass did not deliver what it provides."""

    def __repr__(self) -> str:
        return f"<pass {self.name}>"


@dataclass
class PassTiming:
    name: str
    seconds: float
    modified: bool


class PassManager:
    """Orders, runs, verifies, times and dumps a set of passes."""

    def __init__(self, passes: Iterable[Pass] = (), verify: Callable[[GraphIR], None] | None = None):
        self._passes: list[Pass] = []
        self._after: dict[str, set[str]] = {}
        self._before: dict[str, set[str]] = {}
        self.verify = verify
        self.timings: list[PassTiming] = []
        for p in passes:
            self.add(p)

    def add(self, p: Pass, *, after: str | Iterable[str] = (),
            before: str | Iterable[str] = ()) -> "PassManager":
        """Add a pass; ``after`` / ``before`` force it to run after / before the named passes
        (besides what its ``requires`` and ``provides`` facts order)."""
        if not p.name or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", p.name):
            raise PassError(f"{type(p).__name__} has name {p.name!r}; a pass name is 1-64 letters, "
                            f"digits, '-', '_' or '.' (it names dump files), starting with a "
                            f"letter or digit")
        if any(q.name == p.name for q in self._passes):
            raise PassError(f"pass {p.name!r} is already in the pipeline")
        self._passes.append(p)
        self._after[p.name] = {after} if isinstance(after, str) else set(after)
        self._before[p.name] = {before} if isinstance(before, str) else set(before)
        return self

    def remove(self, name: str) -> "PassManager":
        self._passes = [p for p in self._passes if p.name != name]
        self._after.pop(name, None)
        self._before.pop(name, None)
        return self

    def __contains__(self, name: str) -> bool:
        return any(p.name == name for p in self._passes)

    def get(self, name: str) -> Pass:
        for p in self._passes:
            if p.name == name:
                return p
        raise PassError(f"no pass named {name!r}; passes: {[p.name for p in self._passes]}")

    def _edges(self, have: Iterable[str] = ()) -> list[tuple[str, str]]:
        """Every edge provider -> consumer (a required fact, or a forced ``after``)."""
        have = set(have)
        names = {p.name for p in self._passes}
        edges: list[tuple[str, str]] = []
        for p in self._passes:
            for fact in p.requires:
                providers = [q.name for q in self._passes if fact in q.provides and q is not p]
                if not providers and fact not in have:
                    raise PreconditionError(
                        f"pass {p.name!r} requires {fact!r}, which no pass in the pipeline "
                        f"provides and the IR does not have; add a pass that provides it")
                edges += [(q, p.name) for q in providers]
            for name in self._after[p.name]:
                if name not in names:
                    raise PassError(f"pass {p.name!r} is to run after unknown pass {name!r}")
                edges.append((name, p.name))
            for name in self._before[p.name]:
                if name not in names:
                    raise PassError(f"pass {p.name!r} is to run before unknown pass {name!r}")
                edges.append((p.name, name))
        return edges

    def graph(self, have: Iterable[str] = ()) -> "nx.DiGraph":
        """The dependency DAG: an edge provider -> consumer for every required fact."""
        import networkx as nx  # lazy: ~0.25 s to import; order() does without it

        edges = self._edges(have)
        g = nx.DiGraph()
        for i, p in enumerate(self._passes):
            g.add_node(p.name, position=i)
        g.add_edges_from(edges)
        if not nx.is_directed_acyclic_graph(g):
            raise PassError(f"pass dependencies form a cycle: {nx.find_cycle(g)}")
        return g

    def order(self, have: Iterable[str] = ()) -> list[Pass]:
        """The passes in dependency order; among those ready, the one added first (networkx's
        lexicographical topological sort keyed by position, without importing networkx)."""
        edges = self._edges(have)
        position = {p.name: i for i, p in enumerate(self._passes)}
        indegree = dict.fromkeys(position, 0)
        successors: dict[str, set[str]] = {n: set() for n in position}
        for a, b in edges:
            if b not in successors[a]:
                successors[a].add(b)
                indegree[b] += 1
        ready = [(position[n], n) for n, d in indegree.items() if d == 0]
        heapq.heapify(ready)
        names: list[str] = []
        while ready:
            _, n = heapq.heappop(ready)
            names.append(n)
            for m in successors[n]:
                indegree[m] -= 1
                if indegree[m] == 0:
                    heapq.heappush(ready, (position[m], m))
        if len(names) != len(position):
            self.graph(have)  # raises PassError naming the cycle
            raise PassError("pass dependencies form a cycle")
        return [self.get(n) for n in names]

    def check_options(self, options: dict[str, Any]) -> None:
        """PassError for an option no pass of this pipeline declares or of the wrong type; then
        each pass checks its own values (checked by :func:`kernel_lens.compile` before the
        capture, and again by :meth:`run`)."""
        declared = {name: (p, kind) for p in self._passes for name, kind in p.options.items()}
        for name, value in options.items():
            if name not in declared:
                close = difflib.get_close_matches(str(name), list(declared), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PassError(f"option {name!r} is read by no pass of the pipeline{hint}; "
                                f"options: {', '.join(sorted(declared)) or 'none'}")
            p, kind = declared[name]
            if value is not None and not isinstance(value, kind):
                raise PassError(f"option {name!r} of pass {p.name!r} must be a {kind.__name__}, got "
                                f"{type(value).__name__} {value!r}")
        for p in self._passes:
            p.check_options({k: v for k, v in options.items() if k in p.options})

    def check_names(self, wanted: Iterable[str], order: list | None = None) -> None:
        """PassError for a name in ``wanted`` that is no pass of this pipeline (checked by
        :func:`kernel_lens.compile` before the capture, so a typo costs no work)."""
        names = [p.name for p in (order if order is not None else self.order())]
        for name in sorted(set(wanted)):
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise PassError(f"no pass named {name!r}{hint}; passes: {names}")

    def run(self, ir: GraphIR, ctx: PassContext | None = None, *, stop_after: str | None = None,
            dump_after: Iterable[str] = (), dump: Callable[[str, GraphIR], None] | None = None,
            ) -> GraphIR:
        ctx = ctx or PassContext()
        self.check_options(ctx.options)
        dump_after = set(dump_after)
        order = self.order(ir.facts)
        self.check_names(dump_after | ({stop_after} if stop_after else set()), order)
        self.timings = []
        if self.verify:
            self.verify(ir)
        for p in order:
            missing = set(p.requires) - set(ir.facts)
            if missing:
                raise PreconditionError(f"pass {p.name!r} requires {sorted(missing)}; the IR has "
                                        f"{sorted(ir.facts)}")
            start = time.perf_counter()
            with progress.stage(f"pass {p.name}") as shown:
                ir, modified = self._apply(p, ir, ctx)
                shown.note = "" if modified else "no change"
            seconds = time.perf_counter() - start
            if self.verify:
                try:
                    self.verify(ir)
                except PostconditionError:
                    raise
                except Exception as exc:
                    raise PostconditionError(f"IR invariant broken after pass {p.name!r}: {exc}") from exc
            self.timings.append(PassTiming(p.name, seconds, modified))
            log.info("pass %-22s %8.1f ms%s", p.name, seconds * 1e3,
                     "" if modified else " (no change)")
            if p.name in dump_after and dump is not None:
                dump(p.name, ir)
            if p.name == stop_after:
                break
        return ir

    @staticmethod
    def _apply(p: Pass, ir: GraphIR, ctx: PassContext) -> tuple[GraphIR, bool]:
        """``p`` over ``ir``: over each piece's and value branch's graph when the model has them
        (a pass sees ordinary graphs only), recording its facts on every graph it ran over."""
        def one(graph: GraphIR) -> tuple[GraphIR, bool]:
            result = p.run(graph.model_copy(deep=True), ctx)
            out = result.ir
            try:  # an assignment validates the whole graph: a pass that broke it is named
                out.facts = sorted(set(out.facts) | set(p.provides))
                out.passes_run = [*out.passes_run, p.name]
            except ValidationError as exc:
                raise PostconditionError(f"pass {p.name} left an IR that is not valid: "
                                         f"{str(exc.errors()[0]['msg'])[:300]}") from None
            p.ensures(out)
            return out, result.modified

        def over(ir: GraphIR) -> tuple[GraphIR, bool]:  # a piece's graph may have branches
            if not ir.parts():
                return one(ir)
            ir = ir.model_copy(deep=True)
            modified = False
            for part in ir.parts():
                part.graph, changed = over(part.graph)
                modified = modified or changed
            ir.facts = sorted(set(ir.facts) | set(p.provides))
            ir.passes_run = [*ir.passes_run, p.name]
            return ir, modified

        return over(ir)



def dump_to_dir(directory: str | Path, *, root: str | Path | None = None
                ) -> Callable[[str, GraphIR], None]:
    """A dump callback writing ``<dir>/<NN>-<pass>.json``. ``directory`` is a real folder below
    ``root`` (default: its parent, e.g. the output folder of ``compile -o``): made if missing,
    and a link at any level below ``root`` is refused, when made and again before each dump."""
    directory = Path(directory)
    root = directory.parent if root is None else Path(root)
    rel = directory.relative_to(root)
    subfolder(root, rel)  # checked now, before the passes run

    def dump(name: str, ir: GraphIR) -> None:
        ir.save(inside(subfolder(root, rel), f"{len(ir.passes_run):02d}-{name}.json"))
    return dump
