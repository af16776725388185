"""Symbolic integer expressions: sympy inside, strings in the IR.

Every symbol is a non-negative integer standing for one dimension of one graph input; the
graph's symbol table says which. Expressions are stored as sympy's own ``str`` form and read
back by :func:`parse`, kernel_lens's own parser: Python's ``ast`` restricted to a small
grammar (docs/ir_expressions.md), building sympy objects directly. IR documents are data
from anywhere; nothing in them is ever evaluated as Python (no ``sympify``/``eval``).
"""

from __future__ import annotations

import ast
import functools
import operator
from typing import Annotated, Callable, Iterable, Mapping

import sympy
from sympy.core.mul import Mul
from sympy import trailing
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from ..errors import SymbolicError


def symbol(name: str) -> sympy.Symbol:
    """The canonical symbol for a dimension: an integer that is never negative."""
    return sympy.Symbol(name, integer=True, nonnegative=True)


# --- the grammar -------------------------------------------------------------------------------
MAX_LENGTH = 10_000      # characters in one expression
MAX_DEPTH = 100          # nesting of the syntax tree
MAX_BITS = 4096          # bits of any integer constant the parser builds (base**exp included)
MAX_EXPONENT = 64        # |exp| in base**exp; exp must be an integer literal
MAX_SIZE_EXPONENT = 8    # |exp| in base**exp where the base holds a size (s**64 is no size)
MAX_FREE_SYMBOLS = 32    # distinct sizes one expression reads

# Characters an expression may contain; published as the JSON schema's `pattern`.
PATTERN = r"^[A-Za-z0-9_ +\-*/%()<>=!&|~,]*$"

_FUNCTIONS: dict[str, tuple[Callable[..., sympy.Basic], int | None]] = {
    # name -> (constructor, number of arguments; None: two or more)
    "floor": (sympy.floor, 1), "ceiling": (sympy.ceiling, 1), "Mod": (sympy.Mod, 2),
    "Min": (sympy.Min, None), "Max": (sympy.Max, None),
    "Eq": (sympy.Eq, 2), "Ne": (sympy.Ne, 2), "Lt": (sympy.Lt, 2), "Le": (sympy.Le, 2),
    "Gt": (sympy.Gt, 2), "Ge": (sympy.Ge, 2),
    "And": (sympy.And, None), "Or": (sympy.Or, None), "Not": (sympy.Not, 1),
}
# Names sympy gives a meaning (oo, pi, E, I, nan, S, ...) are never dimension symbols: read back
# as symbols they would silently change the expression.
_NOT_SYMBOLS = frozenset(dir(sympy)) | frozenset(_FUNCTIONS) | {"lambda"}
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: lambda a, b: sympy.floor(a / b),
           ast.Mod: sympy.Mod, ast.BitAnd: sympy.And, ast.BitOr: sympy.Or}
_COMPARE = {ast.Lt: sympy.Lt, ast.LtE: sympy.Le, ast.Gt: sympy.Gt, ast.GtE: sympy.Ge,
            ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne}


def _mul_is_integer(original: Callable[[Mul], bool | None]) -> Callable[[Mul], bool | None]:
    """sympy 1.14's ``Mul._eval_is_integer`` calls an even expression over 2 x an odd number an
    integer (it weighs only the power of 2 in the denominator): ``Max(2, 2*n)/6`` was one, so
    ``floor(Max(2, 2*n)/6)`` lost its floor, here and wherever sympy rebuilds it (``xreplace``,
    ``subs``), and ``(x // 6) * 6`` became ``x`` (wrong for x = 2). Where a rational factor's
    denominator has an odd part above 1, "integer" is not known: None."""

    @functools.wraps(original)
    def is_integer(self: Mul) -> bool | None:
        out = original(self)
        if out and any(a.is_Rational and not a.is_Integer and a.q >> trailing(a.q) != 1 for a in self.args):
            return None
        return out

    return is_integer


if not getattr(Mul._eval_is_integer, "_kernel_lens", False):
    Mul._eval_is_integer = _mul_is_integer(Mul._eval_is_integer)
    Mul._eval_is_integer._kernel_lens = True
    Mul._prop_handler["integer"] = Mul._eval_is_integer  # what sympy's assumptions call


class _Builder:
    """Turns a whitelisted Python expression tree into sympy objects; anything else is refused."""

    def __init__(self, text: str) -> None:
        self.text = text

    def fail(self, why: str) -> SymbolicError:
        return SymbolicError(f"symbolic expression {_clip(self.text)!r} is not in the IR grammar: "
                             f"{why} (see docs/ir_expressions.md)")

    def build(self, node: ast.AST, depth: int = 0) -> sympy.Basic:
        if depth > MAX_DEPTH:
            raise self.fail(f"nested deeper than {MAX_DEPTH}")
        d = depth + 1
        if isinstance(node, ast.Constant):
            if type(node.value) is bool:
                return sympy.true if node.value else sympy.false
            if type(node.value) is not int:
                raise self.fail(f"constant {node.value!r} is not a non-negative integer literal")
            if node.value.bit_length() > MAX_BITS:
                raise self.fail(f"integer literal larger than {MAX_BITS} bits")
            return sympy.Integer(node.value)
        if isinstance(node, ast.Name):
            if node.id.startswith("_") or node.id in _NOT_SYMBOLS:
                raise self.fail(f"name {node.id!r} cannot be a dimension symbol")
            return symbol(node.id)
        if isinstance(node, ast.UnaryOp):
            arg = self.build(node.operand, d)
            if isinstance(node.op, ast.USub):
                return self.check(-arg)
            if isinstance(node.op, ast.UAdd):
                return arg
            if isinstance(node.op, ast.Invert):
                return sympy.Not(arg)
            raise self.fail(f"operator {type(node.op).__name__} is not allowed")
        if isinstance(node, ast.BinOp):
            if isinstance(node.op, ast.Pow):
                return self.power(node, d)
            op = _BINARY.get(type(node.op))
            if op is None:
                raise self.fail(f"operator {type(node.op).__name__} is not allowed")
            lhs, rhs = self.build(node.left, d), self.build(node.right, d)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and rhs == 0:
                raise self.fail("division by zero")
            return self.check(op(lhs, rhs))
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise self.fail("chained comparisons are not allowed")
            op = _COMPARE.get(type(node.ops[0]))
            if op is None:
                raise self.fail(f"comparison {type(node.ops[0]).__name__} is not allowed")
            return op(self.build(node.left, d), self.build(node.comparators[0], d))
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
                raise self.fail(f"only the functions {', '.join(_FUNCTIONS)} may be called")
            if node.keywords:
                raise self.fail("keyword arguments are not allowed")
            fn, arity = _FUNCTIONS[node.func.id]
            if (arity is None and len(node.args) < 2) or (arity is not None and len(node.args) != arity):
                raise self.fail(f"{node.func.id} takes {arity or 'two or more'} arguments, "
                                f"got {len(node.args)}")
            if any(isinstance(a, ast.Starred) for a in node.args):
                raise self.fail("starred arguments are not allowed")
            args = [self.build(a, d) for a in node.args]
            if node.func.id == "Mod" and args[1] == 0:
                raise self.fail("division by zero")
            if node.func.id in ("Min", "Max") and not all(a.is_Number for a in args):
                # sympy compares every pair of symbolic arguments (seconds for a few dozen): read
                # them as written; format_expr wrote them simplified, and equal sets compare equal
                return self.check(fn(*args, evaluate=False))
            return self.check(fn(*args))
        raise self.fail(f"{type(node).__name__} is not allowed")

    def power(self, node: ast.BinOp, depth: int) -> sympy.Basic:
        exp_node = node.right
        negative = isinstance(exp_node, ast.UnaryOp) and isinstance(exp_node.op, ast.USub)
        literal = exp_node.operand if negative else exp_node
        if not (isinstance(literal, ast.Constant) and type(literal.value) is int):
            raise self.fail("an exponent must be an integer literal")
        exp = -literal.value if negative else literal.value
        if abs(exp) > MAX_EXPONENT:
            raise self.fail(f"exponent {exp} is larger than {MAX_EXPONENT}")
        base = self.build(node.left, depth)
        if base.is_Number and abs(exp) * abs(int(sympy.Integer(sympy.floor(base)) or 1)).bit_length() \
                > MAX_BITS:
            raise self.fail(f"constant power larger than {MAX_BITS} bits")
        if base == 0 and exp < 0:
            raise self.fail("division by zero")
        if abs(exp) > MAX_SIZE_EXPONENT and base.free_symbols:
            raise self.fail(f"a size to the power {exp}: at most {MAX_SIZE_EXPONENT}")
        return self.check(sympy.Pow(base, exp))

    def check(self, value: sympy.Basic) -> sympy.Basic:
        """Refuse constants past MAX_BITS (products of long literals) and non-finite results."""
        if value.is_Number:
            if not value.is_finite:
                raise self.fail("the expression is not finite")
            p, q = (value.p, value.q) if value.is_Rational else (0, 1)
            if not value.is_Rational or abs(p).bit_length() > MAX_BITS or q.bit_length() > MAX_BITS:
                raise self.fail(f"constant larger than {MAX_BITS} bits or not rational")
        return value


def _clip(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


@functools.lru_cache(maxsize=65536)
def _parse(text: str) -> sympy.Basic:
    if not isinstance(text, str):
        raise SymbolicError(f"a symbolic expression must be a string, got {type(text).__name__}")
    if len(text) > MAX_LENGTH:
        raise SymbolicError(f"symbolic expression of {len(text)} characters is longer than the "
                            f"IR grammar allows ({MAX_LENGTH})")
    if not text.strip():
        raise SymbolicError("empty symbolic expression")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
        raise SymbolicError(f"cannot parse symbolic expression {_clip(text)!r}: "
                            f"{type(exc).__name__}") from None
    builder = _Builder(text)
    names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    if len(names) > MAX_FREE_SYMBOLS + len(_FUNCTIONS):
        raise builder.fail(f"it names {len(names)} sizes; at most {MAX_FREE_SYMBOLS}")
    try:
        result = builder.build(tree.body)
        if len(result.free_symbols) > MAX_FREE_SYMBOLS:
            raise builder.fail(f"it reads {len(result.free_symbols)} sizes; at most {MAX_FREE_SYMBOLS}")
        return result
    except RecursionError:
        raise builder.fail("nested too deeply") from None
    except (TypeError, ValueError, ZeroDivisionError, AttributeError) as exc:
        raise builder.fail(f"{type(exc).__name__}: {exc}") from None


def parse(text: str, names: Iterable[str] | None = None) -> sympy.Basic:
    """Parse an IR expression string (cached). Free names become dimension symbols.

    ``names`` is accepted for compatibility and is not needed: every free name becomes
    :func:`symbol` of that name. Raises :class:`SymbolicError` for anything outside the grammar.
    """
    return _parse(text)


def format_expr(expr: sympy.Basic | int) -> str:
    """The IR string of an expression (sympy's ``str``), which :func:`parse` reads back exactly."""
    if isinstance(expr, bool) or not isinstance(expr, (int, sympy.Basic)):
        raise SymbolicError(f"not a symbolic integer expression: {expr!r}")
    return str(sympy.Integer(expr) if isinstance(expr, int) else expr)


def _check(text: str) -> str:
    try:
        parse(text)
    except SymbolicError as exc:  # pydantic reports ValueErrors with the field's location
        raise ValueError(str(exc)) from None
    return text


SymExpr = Annotated[str, Field(pattern=PATTERN, max_length=MAX_LENGTH), AfterValidator(_check)]
"""An integer-valued sympy expression over dimension symbols, in the IR grammar."""


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
    if name == "IntTrueDiv":  # int / int as a real (math.ceil(a / b) wraps it in CeilToInt)
        return args[0] / args[1]
    if name in ("FloorDiv", "CleanDiv") or (name == "FloorToInt" and len(args) == 1):
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


_INT64 = (-(1 << 63), (1 << 63) - 1)


def inexact_reason(expr: sympy.Basic) -> str | None:
    """Why ``expr`` (an IR expression, as :func:`parse` builds it) is not an exact int64 integer
    expression, or None when it is: every division sits in floor/ceiling/Mod, exponents are
    non-negative integers, literals fit int64. The IR's own rule; printers enforce it again."""
    if isinstance(expr, sympy.Integer):
        return None if _INT64[0] <= int(expr) <= _INT64[1] else f"{expr} is outside the int64 range"
    if isinstance(expr, (sympy.Rational, sympy.Float)):
        return f"{expr} is not an integer; write divisions as floor()/ceiling()"
    if isinstance(expr, sympy.Symbol):
        return f"symbol {expr} is declared non-integer" if expr.is_integer is False else None
    if expr in (sympy.true, sympy.false):
        return None
    if isinstance(expr, sympy.Mul):
        coeff, _ = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            return f"{expr} has a non-integer coefficient; write divisions as floor()/ceiling()"
    if isinstance(expr, sympy.Pow) and not (expr.exp.is_integer and expr.exp.is_nonnegative):
        return f"{expr} has an exponent that is not a non-negative integer"
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        args = sympy.fraction(sympy.together(expr.args[0]))  # numerator and denominator
    elif isinstance(expr, (sympy.Add, sympy.Mul, sympy.Pow, sympy.Mod, sympy.Min, sympy.Max,
                           sympy.Rel, sympy.And, sympy.Or, sympy.Not)):
        args = expr.args
    else:
        return f"{type(expr).__name__} in {expr} is not part of the IR's integer grammar"
    for arg in args:
        reason = inexact_reason(arg)
        if reason is not None:
            return reason
    return None


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

    @model_validator(mode="after")
    def _range_is_a_range(self) -> "SymbolInfo":
        if self.max is not None and self.max < self.min:
            raise ValueError(f"its range [{self.min}, {self.max}] is empty (max < min)")
        return self


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
