"""Symbolic integer expressions: sympy inside, strings in the IR.

Every symbol is a non-negative integer standing for one dimension of one graph input; the
graph's symbol table says which. Expressions are stored as sympy's own ``str`` form, so any
tool can read them back with ``sympy.sympify`` (see :func:`parse`).
"""

from __future__ import annotations

from typing import Annotated, Iterable, Mapping

import sympy
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from ..errors import SymbolicError


def symbol(name: str) -> sympy.Symbol:
    """The canonical symbol for a dimension: an integer that is never negative."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


_PARSE_GLOBALS: dict = {}
exec("from sympy import *", _PARSE_GLOBALS)  # the namespace sympify uses, made once


def parse(text: str, names: Iterable[str] | None = None) -> sympy.Expr:
    """Parse an IR expression string. Free names become dimension symbols."""
    try:
        expr = sympy.sympify(text, locals={n: symbol(n) for n in (names or ())})
    except (sympy.SympifyError, SyntaxError, TypeError) as exc:
        raise SymbolicError(f"cannot parse symbolic expression {text!r}: {exc}") from None
    # Re-bind any free symbol that sympify created without our assumptions.
    fix = {s: symbol(s.name) for s in expr.free_symbols if s != symbol(s.name)}
    return expr.xreplace(fix) if fix else expr


def format_expr(expr: sympy.Expr | int) -> str:
    return str(sympy.sympify(expr))


def _check(text: str) -> str:
    parse(text)
    return text


SymExpr = Annotated[str, AfterValidator(_check)]
"""An integer-valued sympy expression over dimension symbols, in sympy's string syntax."""


def to_plain_sympy(expr: object) -> sympy.Expr:
    """Rewrite torch's symbolic-shape functions (FloorDiv, ModularIndexing, ...) into plain sympy.

    torch.export hands us sympy expressions that use torch's own function classes; the IR must
    be readable with sympy alone, so those become floor/ceiling/Mod/Min/Max/Pow.
    """
    if isinstance(expr, (int, bool)):
        return sympy.Integer(int(expr))
    if not isinstance(expr, sympy.Basic):
        raise SymbolicError(f"not a symbolic integer: {expr!r}")
    if expr in (sympy.true, sympy.false):
        return expr
    if expr.is_Atom:
        if isinstance(expr, sympy.Symbol):
            return symbol(expr.name)
        if expr.is_Integer:
            return expr
        raise SymbolicError(f"non-integer constant {expr} in a shape expression")
    args = [to_plain_sympy(a) for a in expr.args]
    name = type(expr).__name__
    if name in ("FloorDiv", "CleanDiv", "IntTrueDiv") or (name == "FloorToInt" and len(args) == 1):
        if len(args) == 1:
            return sympy.floor(args[0])
        return sympy.floor(args[0] / args[1])
    if name in ("CeilDiv",):
        return sympy.ceiling(args[0] / args[1])
    if name == "CeilToInt":
        return sympy.ceiling(args[0])
    if name in ("PythonMod", "Mod"):
        return sympy.Mod(args[0], args[1])
    if name == "ModularIndexing":
        return sympy.Mod(sympy.floor(args[0] / args[1]), args[2])
    if name in ("Min",):
        return sympy.Min(*args)
    if name in ("Max",):
        return sympy.Max(*args)
    if name in ("PowByNatural", "Pow"):
        return sympy.Pow(args[0], args[1])
    if name == "Identity":
        return args[0]
    if name in ("Add", "Mul", "floor", "ceiling", "Equality", "Unequality", "StrictLessThan",
                "LessThan", "StrictGreaterThan", "GreaterThan", "And", "Or", "Not"):
        return expr.func(*args)
    raise SymbolicError(
        f"symbolic function {name} in {expr} has no exact integer meaning kernel_lens supports"
    )


def evaluate(expr: sympy.Expr, values: Mapping[str, int]) -> int:
    """Exact integer value of an expression at the given symbol values."""
    sub = {s: sympy.Integer(values[s.name]) for s in expr.free_symbols}
    out = expr.xreplace(sub)
    if not out.is_Integer:
        out = sympy.simplify(out)
    if not out.is_Integer:
        raise SymbolicError(f"{expr} is not an integer at {dict(values)}: {out}")
    return int(out)


class SymbolInfo(BaseModel):
    """Where a dimension symbol comes from at run time, and the range it was declared with."""

    model_config = ConfigDict(extra="forbid")

    input: int = Field(description="index of the graph input whose shape holds this symbol")
    dim: int = Field(description="dimension of that input")
    min: int = Field(ge=0, description="smallest value declared (inclusive)")
    max: int | None = Field(default=None, description="largest value declared; None: unbounded")
    example: int = Field(description="its value in the example inputs the model was captured with")
    scale: int = Field(default=1, ge=1, description="the dim's size is scale*symbol + offset")
    offset: int = Field(default=0, description="the dim's size is scale*symbol + offset")


Interval = tuple[sympy.Expr, sympy.Expr]  # (lower, upper); +-oo where unbounded


def bounds(expr: sympy.Expr, ranges: Mapping[str, tuple[int, int | None]]) -> Interval:
    """Sound interval bounds of an integer expression over symbol ranges (interval arithmetic)."""
    oo = sympy.oo
    if expr.is_Number:
        return expr, expr
    if isinstance(expr, sympy.Symbol):
        lo, hi = ranges.get(expr.name, (0, None))
        return sympy.Integer(lo), (oo if hi is None else sympy.Integer(hi))
    if isinstance(expr, sympy.Add):
        parts = [bounds(a, ranges) for a in expr.args]
        return sympy.Add(*[p[0] for p in parts]), sympy.Add(*[p[1] for p in parts])
    if isinstance(expr, sympy.Mul):
        lo, hi = sympy.Integer(1), sympy.Integer(1)
        for a in expr.args:
            alo, ahi = bounds(a, ranges)
            corners = [_mul(x, y) for x in (lo, hi) for y in (alo, ahi)]
            lo, hi = min(corners), max(corners)
        return lo, hi
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        lo, hi = bounds(expr.args[0], ranges)
        f = expr.func
        return (lo if lo.is_infinite else f(lo)), (hi if hi.is_infinite else f(hi))
    if isinstance(expr, sympy.Mod):
        blo, bhi = bounds(expr.args[1], ranges)
        if blo > 0:
            alo, _ = bounds(expr.args[0], ranges)
            lo = sympy.Integer(0)
            return lo, (bhi - 1 if not bhi.is_infinite else (oo if alo < 0 else bounds(expr.args[0], ranges)[1]))
        return -oo, oo
    if isinstance(expr, (sympy.Min, sympy.Max)):
        parts = [bounds(a, ranges) for a in expr.args]
        f = min if isinstance(expr, sympy.Min) else max
        return f(p[0] for p in parts), f(p[1] for p in parts)
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp >= 0:
        lo, hi = bounds(expr.base, ranges)
        if lo >= 0:
            return lo ** expr.exp, hi ** expr.exp
    if isinstance(expr, sympy.Pow) and expr.exp == -1:
        lo, hi = bounds(expr.base, ranges)
        if lo > 0:
            return 1 / hi if not hi.is_infinite else sympy.Integer(0), 1 / lo
    return -oo, oo


def _mul(x: sympy.Expr, y: sympy.Expr) -> sympy.Expr:
    if x == 0 or y == 0:
        return sympy.Integer(0)
    return x * y
