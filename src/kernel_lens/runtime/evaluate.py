"""IR expressions as plain Python closures with exact integer semantics, for the run path.

A call of the runtime evaluates output shapes and input-dim checks from symbol values; doing
that through sympy costs tens of microseconds per expression, and ``lambdify`` with ``math``
divides in floating point (inexact past 2**53) and works by ``exec``-ing generated text. Here
each expression is turned once into nested closures over ints (``Fraction`` only where the IR
divides), so a call costs about a microsecond and is exact for any size.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Callable, Sequence

import sympy

from ..errors import SymbolicError

Values = Sequence[int]
Evaluator = Callable[[Values], int]


def _compile(expr: sympy.Basic, index: dict[str, int]) -> Callable[[Values], int | Fraction]:
    if expr.is_Integer:
        value = int(expr)
        return lambda v: value
    if expr.is_Rational:
        frac = Fraction(int(expr.p), int(expr.q))
        return lambda v: frac
    if isinstance(expr, sympy.Symbol):
        if expr.name not in index:
            raise SymbolicError(f"expression uses {expr.name}, which is not a symbol of the model")
        i = index[expr.name]
        return lambda v: v[i]
    if isinstance(expr, (sympy.floor, sympy.ceiling)):
        return _rounded(expr, index)
    args = [_compile(a, index) for a in expr.args]
    if isinstance(expr, sympy.Add):
        return lambda v: sum(f(v) for f in args)
    if isinstance(expr, sympy.Mul):
        def mul(v: Values) -> int | Fraction:
            out: int | Fraction = 1
            for f in args:
                out = out * f(v)
            return out
        return mul
    if isinstance(expr, sympy.Pow):
        base, exp = args[0], expr.exp
        if not exp.is_Integer:
            raise SymbolicError(f"{expr}: only integer exponents are supported")
        e = int(exp)
        return (lambda v: base(v) ** e) if e >= 0 else (lambda v: Fraction(1, base(v) ** -e))
    if isinstance(expr, sympy.Mod):  # sympy's Mod takes the divisor's sign, like Python's %
        return lambda v: args[0](v) % args[1](v)
    if isinstance(expr, sympy.Min):
        return lambda v: min(f(v) for f in args)
    if isinstance(expr, sympy.Max):
        return lambda v: max(f(v) for f in args)
    raise SymbolicError(f"{expr}: {type(expr).__name__} is not an integer expression the runtime "
                        f"evaluates")


def _rounded(expr: sympy.Basic, index: dict[str, int]) -> Callable[[Values], int | Fraction]:
    """floor(p/q) as p // q over integer numerator and denominator: no Fraction per call."""
    num, den = (_compile(e, index) for e in sympy.fraction(sympy.together(expr.args[0])))
    if isinstance(expr, sympy.floor):  # // is floor division for ints and Fractions alike
        return lambda v: num(v) // den(v)
    return lambda v: -((-num(v)) // den(v))


def evaluator(expr: sympy.Basic, symbols: Sequence[str]) -> Evaluator:
    """A function of the symbol values (in ``symbols`` order) returning ``expr`` as an int."""
    fn = _compile(expr, {name: i for i, name in enumerate(symbols)})

    def evaluate(values: Values) -> int:
        out = fn(values)
        if isinstance(out, Fraction):
            if out.denominator != 1:
                raise SymbolicError(f"{expr} is not an integer at {list(values)}: {out}")
            return int(out)
        return out
    return evaluate
