"""Grid canonicalization: every symbolic quantity simplified, over graph-input dims, printable.

Each grid, integer scalar, shape, stride and offset is parsed, simplified under the symbols'
integer/non-negative assumptions, checked to use only declared graph-input dims, checked to
print as exact int64 C++ (through the one printer, ``ir.cxx_printer``), and checked against
the values seen at capture.
"""

from __future__ import annotations

import functools

import sympy

from ..errors import SymbolicError
from ..ir import GraphIR, evaluate, format_expr, parse
from ..ir.cxx_printer import to_cxx
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
    try:  # printable as exact int64 C++ (symbols renamed: a Dim may be named like a keyword)
        to_cxx(simple, {sym: f"sym_{sym.name}" for sym in simple.free_symbols})
    except SymbolicError as exc:
        raise _NotCanonical(str(exc)) from None
    return format_expr(simple)


def canonical(text: str, names: list[str], where: str) -> str:
    try:
        return _canonical(text, tuple(names))
    except _NotCanonical as exc:
        raise SymbolicError(f"{where}: {exc}") from None


class GridCanonicalization(Pass):
    name = "grid-canonicalization"
    description = "simplify grids/scalars/shapes over graph-input dims; check exact int64 printing"
    provides = frozenset({"canonical-symbolic"})

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        names = ir.symbol_names()
        before = ir.model_dump_json()
        for value in ir.values.values():
            value.shape = [canonical(s, names, f"tensor {value.name} shape") for s in value.shape]
            value.strides = [canonical(s, names, f"tensor {value.name} strides") for s in value.strides]
        for launch in ir.launches:
            where = f"launch {launch.order} ({launch.kernel})"
            launch.grid = tuple(canonical(g, names, f"{where} grid") for g in launch.grid)
            for arg in launch.args:
                w = f"{where} argument {arg.name}"
                if arg.expr is not None:
                    arg.expr = canonical(arg.expr, names, w)
                if arg.shape is not None:
                    arg.shape = [canonical(s, names, w) for s in arg.shape]
                    arg.strides = [canonical(s, names, w) for s in arg.strides]
                    arg.storage_offset = canonical(arg.storage_offset, names, w)
        return PassResult(ir, ir.model_dump_json() != before)

    def ensures(self, ir: GraphIR) -> None:
        from ..errors import PostconditionError

        example = {n: s.example for n, s in ir.symbols.items()}
        for launch in ir.launches:
            grid = tuple(evaluate(parse(g, list(example)), example) for g in launch.grid)
            if grid != tuple(launch.captured_grid):
                raise PostconditionError(
                    f"launch {launch.order} ({launch.kernel}): symbolic grid {launch.grid} gives "
                    f"{grid} at the captured sizes, but the kernel was launched with "
                    f"{tuple(launch.captured_grid)}")
