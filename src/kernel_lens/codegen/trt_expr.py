"""Integer sympy expressions to TensorRT ``IExprBuilder`` calls (plugin output shapes, workspace).

:func:`to_trt` prints an IR expression as a C++ expression of type
``const nvinfer1::IDimensionExpr*`` built with ``builder.constant`` and
``builder.operation(nvinfer1::DimensionOperation::k..., a, b)``, the way a TensorRT plugin's
``getOutputShapes``/``getOutputDimensions`` must express shapes. Symbols map to expressions the
caller names (usually ``inputs[i].d[j]``, or a symbol read as ``(d - offset) / scale``).

Exact over the integers, like the int64 C++ printer (``codegen.cxx``): sums and differences,
products, positive integer powers, ``floor``/``ceiling`` of a quotient (TensorRT's
``kFLOOR_DIV``/``kCEIL_DIV``), ``Mod`` (``a - b*floor(a/b)``), ``Max``/``Min``. A rational
coefficient outside ``floor``/``ceiling`` or any other construct raises
:class:`~kernel_lens.errors.SymbolicError` naming the expression.
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from ..errors import SymbolicError

OP = "nvinfer1::DimensionOperation::"


class TrtExprPrinter:
    def __init__(self, names: Mapping[sympy.Symbol, str], builder: str = "exprBuilder") -> None:
        self.names = dict(names)
        self.builder = builder
        self.root: sympy.Basic | None = None

    def fail(self, expr: sympy.Basic, reason: str) -> SymbolicError:
        return SymbolicError(f"cannot express {self.root} with TensorRT's IExprBuilder: {reason} "
                             f"(in {expr})")

    def constant(self, value: int) -> str:
        return f"{self.builder}.constant(INT64_C({value}))" if value >= 0 else \
            f"{self.op('kSUB', self.constant(0), self.constant(-value))}"

    def op(self, name: str, a: str, b: str) -> str:
        return f"{self.builder}.operation({OP}{name}, *{a}, *{b})"

    def fold(self, name: str, items: list[str]) -> str:
        out = items[0]
        for item in items[1:]:
            out = self.op(name, out, item)
        return out

    def print(self, expr: sympy.Basic) -> str:
        self.root = expr
        return self._print(sympy.sympify(expr))

    def _print(self, expr: sympy.Basic) -> str:
        if expr.is_Integer:
            return self.constant(int(expr))
        if expr.is_Symbol:
            if expr not in self.names:
                raise self.fail(expr, f"symbol {expr} has no TensorRT dimension expression")
            return self.names[expr]
        if isinstance(expr, sympy.Add):
            pos, neg = [], []
            for term in sympy.Add.make_args(expr):
                coeff, rest = term.as_coeff_Mul()
                (neg if coeff < 0 else pos).append(-term if coeff < 0 else term)
            out = self.fold("kSUM", [self._print(t) for t in pos]) if pos else self.constant(0)
            for t in neg:
                out = self.op("kSUB", out, self._print(t))
            return out
        if isinstance(expr, sympy.Mul):
            coeff, rest = expr.as_coeff_Mul()
            if not coeff.is_Integer:
                raise self.fail(expr, f"rational coefficient {coeff} outside floor/ceiling")
            if coeff < 0:
                return self.op("kSUB", self.constant(0), self._print(-expr))
            factors = [self._print(f) for f in sympy.Mul.make_args(rest)]
            if coeff != 1:
                factors.insert(0, self.constant(int(coeff)))
            return self.fold("kPROD", factors)
        if isinstance(expr, sympy.Pow):
            base, exp = expr.args
            if not (exp.is_Integer and exp > 0):
                raise self.fail(expr, f"exponent {exp} is not a positive integer")
            return self.fold("kPROD", [self._print(base)] * int(exp))
        if isinstance(expr, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(expr.args[0]))
            if den.is_Integer and den < 0:
                num, den = -num, -den
            name = "kFLOOR_DIV" if isinstance(expr, sympy.floor) else "kCEIL_DIV"
            if den == 1:
                return self._print(sympy.expand(num))
            return self.op(name, self._print(sympy.expand(num)), self._print(den))
        if isinstance(expr, sympy.Mod):
            a, b = expr.args
            quotient = self.op("kFLOOR_DIV", self._print(a), self._print(b))
            return self.op("kSUB", self._print(a), self.op("kPROD", self._print(b), quotient))
        if isinstance(expr, (sympy.Max, sympy.Min)):
            items = [self._print(a) for a in expr.args]
            return self.fold("kMAX" if isinstance(expr, sympy.Max) else "kMIN", items)
        raise self.fail(expr, f"{type(expr).__name__} has no IExprBuilder operation")


def to_trt(expr: sympy.Basic, names: Mapping[sympy.Symbol, str], builder: str = "exprBuilder") -> str:
    """``expr`` as a ``const nvinfer1::IDimensionExpr*`` C++ expression (see the module doc)."""
    return TrtExprPrinter(names, builder).print(expr)
