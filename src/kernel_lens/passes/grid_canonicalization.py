"""Grid canonicalization: every symbolic quantity simplified, over graph-input dims, printable.

Each grid, integer scalar, shape, stride and offset is parsed, simplified under the symbols'
integer/non-negative assumptions, checked to use only declared graph-input dims, checked to
be exact int64 arithmetic (the IR's rule, :func:`~kernel_lens.ir.inexact_reason`; the pass
prints no C++), and checked against the values seen at capture.

A recompile of the same model asks the same questions: the pass's results are kept in one
content-addressed cache entry per list of expressions (keyed also by sympy's version and this
code), so a recompile neither simplifies again nor imports the parts of sympy that
``simplify`` pulls in. Expressions that fail are never cached: they fail again, with the message.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, Iterator

import sympy

from ..errors import PostconditionError, SymbolicError
from ..ir import GraphIR, evaluate, format_expr, inexact_reason, parse
from ..toolchain import entry_cache
from .base import Pass, PassContext, PassResult


class _NotCanonical(Exception):
    """Why an expression has no canonical form, without the caller's ``where``."""


@functools.lru_cache(maxsize=4096)
def _canonical(text: str, names: tuple[str, ...]) -> str:
    """The canonical text of ``text`` over ``names``: a pure function of both, so cached (the
    same shapes, strides and offsets recur across tensors and launches; sympy.simplify is slow)."""
    expr = parse(text, names)
    unknown = {s.name for s in expr.free_symbols} - set(names)
    if unknown:
        raise _NotCanonical(f"{text} uses {sorted(unknown)}, which are not graph-input dims")
    simple = sympy.simplify(expr)
    if sympy.count_ops(simple) > sympy.count_ops(expr):
        simple = expr
    reason = inexact_reason(simple)
    if reason is not None:
        raise _NotCanonical(f"{format_expr(simple)} is not an exact integer expression ({reason})")
    return format_expr(simple)


def canonical(text: str, names: list[str], where: str) -> str:
    try:
        return _canonical(text, tuple(names))
    except _NotCanonical as exc:
        raise SymbolicError(f"{where}: {exc}") from None


class GridCanonicalization(Pass):
    name = "grid-canonicalization"
    description = "simplify grids/scalars/shapes over graph-input dims; check exact int64 arithmetic"
    provides = frozenset({"canonical-symbolic"})

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        names = ir.symbol_names()
        fields = list(_fields(ir))
        slots = [(where, text) for where, owner, name in fields
                 for text in _texts(getattr(owner, name))]
        texts = [text for _, text in slots]
        results = _cached_results(names, texts)
        if results is None:
            results = [canonical(text, names, where) for where, text in slots]
            _store_results(names, texts, results)
        rest = iter(results)
        for _, owner, name in fields:  # whole fields assigned: validated like any IR edit
            old = getattr(owner, name)
            new = next(rest) if isinstance(old, str) else type(old)(next(rest) for _ in old)
            if new != old:
                setattr(owner, name, new)
        return PassResult(ir, results != texts)

    def ensures(self, ir: GraphIR) -> None:
        example = ir.symbol_examples()
        for launch in ir.launches:
            grid = tuple(evaluate(parse(g, list(example)), example) for g in launch.grid)
            if grid != tuple(launch.captured_grid):
                raise PostconditionError(
                    f"launch {launch.order} ({launch.kernel}): symbolic grid {launch.grid} gives "
                    f"{grid} at the captured sizes, but the kernel was launched with "
                    f"{tuple(launch.captured_grid)}")


def _fields(ir: GraphIR) -> Iterator[tuple[str, Any, str]]:
    """Every IR field that holds symbolic expressions, in a fixed order: (where, for messages;
    the object; the field's name). A field is one expression or a list/tuple of them."""
    for value in ir.values.values():
        yield f"tensor {value.name} shape", value, "shape"
        yield f"tensor {value.name} strides", value, "strides"
    for launch in ir.launches:
        where = f"launch {launch.order} ({launch.kernel})"
        yield f"{where} grid", launch, "grid"
        for arg in launch.args:
            w = f"{where} argument {arg.name}"
            if arg.expr is not None:
                yield w, arg, "expr"
            if arg.shape is not None:
                yield w, arg, "shape"
                yield w, arg, "strides"
                yield w, arg, "storage_offset"


def _texts(field: Any) -> list[str]:
    return [field] if isinstance(field, str) else list(field)


@functools.lru_cache(maxsize=1)
def _code_key() -> str:
    """What the results depend on besides the expressions: sympy and the code that computes them."""
    here = Path(__file__)
    files = [here, here.parents[1] / "ir" / "symbolic.py"]
    return entry_cache.key_of("canonical/1", sympy.__version__, *(f.read_bytes() for f in files))


def _key(names: list[str], texts: list[str]) -> str:
    return entry_cache.key_of(_code_key(), list(names), texts)


def _cached_results(names: list[str], texts: list[str]) -> list[str] | None:
    body = entry_cache.read("canonical", _key(names, texts), ".json")
    if body is None:
        return None
    try:
        results = json.loads(body)
    except ValueError:
        return None
    if not (isinstance(results, list) and len(results) == len(texts)
            and all(isinstance(r, str) for r in results)):
        return None
    return results


def _store_results(names: list[str], texts: list[str], results: list[str]) -> None:
    entry_cache.write("canonical", _key(names, texts), json.dumps(results).encode(), ".json")
