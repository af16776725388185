"""The one printer from integer sympy expressions to exact int64_t C++.

Symbolic grid sizes, shapes and shape-derived scalars of a compiled model are
integer sympy expressions (plain sympy or torch's ``torch.utils._sympy``
functions). :func:`to_cxx` prints them as C++ expressions of type ``int64_t``
whose value equals Python's exact evaluation of the expression, under these
preconditions: every symbol denotes an ``int64_t`` value, divisors are non-zero
and no intermediate result overflows ``int64_t``.

Floor/ceiling division, modulo, min/max and powers are emitted as calls to the
helpers of ``kernel_lens/targets/common/kl_symbolic.h`` (``kl_floordiv``,
``kl_ceildiv``, ``kl_mod``, ``kl_min``, ``kl_max``, ``kl_pow``), which the
generated translation unit must include. Every other construct (non-integer
rationals outside ``floor``/``ceiling``, floats, negative or fractional
exponents, unknown functions, ...) raises :class:`~kernel_lens.errors.SymbolicError`;
the printer never falls back to sympy's generic (floating point, truncating)
C++ output, and ignores the ``_ccode``/``_cxxcode`` hooks of torch's sympy
functions, which are not int64-exact.
"""

from __future__ import annotations

import functools
import re
import sys
from collections.abc import Mapping
from typing import Any, Callable, NoReturn

import sympy
from sympy.printing.cxx import CXX17CodePrinter

from kernel_lens.errors import SymbolicError

__all__ = ["Int64CxxPrinter", "to_cxx"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# identifier, optionally followed by subscripts / member accesses: needs no parentheses.
_POSTFIX_EXPR = re.compile(r"[A-Za-z_]\w*(?:(?:::|\.|->)[A-Za-z_]\w*|\[[^\[\]]*\])*\Z")


def _torch_function(name: str) -> type | None:
    """A class of ``torch.utils._sympy.functions``, or None without torch (or without that class).

    Never imports torch itself: an expression can only hold torch's functions once they are imported.
    """
    if "torch.utils._sympy.functions" not in sys.modules:
        return None
    try:
        from torch.utils._sympy import functions  # lazy: codegen never imports torch; reached only once it is loaded
    except ImportError:  # pragma: no cover - depends on the environment
        return None
    cls = getattr(functions, name, None)
    return cls if isinstance(cls, type) else None


@functools.cache
def _find_handler(printer_type: type, expr_type: type) -> Callable[[Any, Any], str] | None:
    """The first ``_print_<Class>`` along ``expr_type``'s MRO that Int64CxxPrinter (or a subclass) defines."""
    for klass in expr_type.__mro__:
        method = "_print_" + klass.__name__
        for owner in printer_type.__mro__:
            if method in vars(owner):
                if issubclass(owner, Int64CxxPrinter):
                    return vars(owner)[method]
                break  # defined by sympy's printers only: not exact, keep looking
    return None


class Int64CxxPrinter(CXX17CodePrinter):
    """Prints integer sympy expressions as exact ``int64_t`` C++ expressions.

    ``names`` maps symbols to C++ expressions (e.g. ``{s0: "dims[0]"}``); other
    symbols print as their own name, which must then be a valid, non-reserved
    C++ identifier. The mapped text is emitted as given (parenthesised unless it
    is an identifier with subscripts/member accesses); it must denote an
    ``int64_t`` value -- map to ``static_cast<int64_t>(...)`` for narrower types.

    Only the ``_print_<Class>`` methods defined on this class (or a subclass) are
    used; anything without one raises :class:`SymbolicError`.
    """

    def __init__(
        self,
        settings: dict[str, Any] | None = None,
        *,
        names: Mapping[sympy.Symbol, str] | None = None,
    ) -> None:
        super().__init__(settings or {})
        self._names: dict[sympy.Basic, str] = {}
        for sym, text in (names or {}).items():
            if not isinstance(text, str) or not text.strip():
                raise SymbolicError(f"C++ name for symbol {sym} must be a non-empty string, got {text!r}")
            self._names[sym] = text.strip()
        self._root: sympy.Basic | None = None

    # ------------------------------------------------------------------ entry points

    def doprint(self, expr: Any, assign_to: str | None = None) -> str:  # type: ignore[override]
        """The C++ expression for ``expr``, or ``"<assign_to> = <expr>;"`` with ``assign_to``."""
        try:
            expr = sympy.sympify(expr, strict=True)
        except (sympy.SympifyError, TypeError) as exc:
            raise SymbolicError(f"{expr!r} is not an exact integer expression (not a sympy expression)") from exc
        self._root = expr
        try:
            code = self._print(expr)
        finally:
            self._root = None
        return code if assign_to is None else f"{assign_to} = {code};"

    def _print(self, expr: Any, **kwargs: Any) -> str:
        # Whitelist dispatch: sympy's own dispatch would silently fall back to
        # float/truncating C output (or to torch's non-exact _ccode hooks).
        if not isinstance(expr, sympy.Basic):
            self._fail(expr, f"unsupported Python object of type {type(expr).__name__}")
        handler = _find_handler(type(self), type(expr))
        if handler is None:
            self._fail(expr, f"unsupported construct {type(expr).__name__}")
        return handler(self, expr)

    def _fail(self, expr: Any, reason: str) -> NoReturn:
        where = "" if self._root is None or self._root == expr else f" in {self._root}"
        raise SymbolicError(f"{expr} is not an exact integer expression ({reason}){where}")

    # ------------------------------------------------------------------ atoms

    def _print_Integer(self, expr: sympy.Integer) -> str:
        value = int(expr)
        if not _INT64_MIN <= value <= _INT64_MAX:
            self._fail(expr, "integer literal outside the int64_t range")
        if value == _INT64_MIN:
            return f"(-INT64_C({_INT64_MAX}) - INT64_C(1))"
        if value < 0:
            return f"(-INT64_C({-value}))"
        return f"INT64_C({value})"

    def _print_Rational(self, expr: sympy.Rational) -> str:  # only non-integers get here
        self._fail(expr, "non-integer rational; division must be written as floor()/ceiling()/FloorDiv")

    def _print_Float(self, expr: sympy.Float) -> str:
        self._fail(expr, "floating-point number")

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        if expr.is_integer is False:
            self._fail(expr, "symbol is declared non-integer")
        text = self._names.get(expr)
        if text is not None:
            return text if _POSTFIX_EXPR.match(text) else f"({text})"
        name = expr.name
        if not _IDENTIFIER.match(name) or name in self.reserved_words:
            self._fail(expr, f"symbol name {name!r} is not a usable C++ identifier; pass names={{symbol: 'cxx_name'}}")
        return name

    # ------------------------------------------------------------------ arithmetic

    def _print_Add(self, expr: sympy.Add) -> str:
        terms = expr.as_ordered_terms()
        parts = [self._print(terms[0])]
        for term in terms[1:]:
            if term.could_extract_minus_sign():
                parts.append(f"- {self._print(-term)}")
            else:
                parts.append(f"+ {self._print(term)}")
        return "(" + " ".join(parts) + ")"

    def _print_Mul(self, expr: sympy.Mul) -> str:
        coeff, rest = expr.as_coeff_Mul()
        if not coeff.is_Integer:
            self._fail(expr, "non-integer coefficient; division must be written as floor()/ceiling()/FloorDiv")
        factors = [self._print(f) for f in rest.as_ordered_factors()] if rest != 1 else []
        if coeff == -1:
            body = factors[0] if len(factors) == 1 else "(" + " * ".join(factors) + ")"
            return f"(-{body})"
        if coeff != 1 or not factors:
            factors.insert(0, self._print(coeff))
        return factors[0] if len(factors) == 1 else "(" + " * ".join(factors) + ")"

    def _print_Pow(self, expr: sympy.Pow) -> str:
        base, exp = expr.args
        if exp.is_Integer:
            if exp < 0:
                self._fail(expr, "negative exponent (division without floor)")
        elif not (exp.is_integer and exp.is_nonnegative):
            self._fail(expr, "exponent is not a non-negative integer")
        if exp == 1:
            return self._print(base)
        return f"kl_pow({self._print(base)}, {self._print(exp)})"

    # ------------------------------------------------------------------ division

    def _rationalize(self, expr: sympy.Expr) -> sympy.Expr:
        """Replace torch's IntTrueDiv(a, b) by the exact rational a/b."""
        int_true_div = _torch_function("IntTrueDiv")
        if int_true_div is not None and expr.has(int_true_div):
            expr = expr.replace(lambda e: isinstance(e, int_true_div), lambda e: e.args[0] / e.args[1])
        return expr

    def _split(self, arg: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
        """``arg`` as (numerator, denominator); both are printed, so non-integer leftovers still raise."""
        return sympy.fraction(sympy.together(self._rationalize(sympy.sympify(arg))))

    def _print_rounded_division(self, expr: sympy.Basic, arg: sympy.Expr, helper: str) -> str:
        if arg.has(sympy.Float):
            self._fail(expr, "floating-point operand")
        num, den = self._split(arg)
        if den == 1:
            return self._print(num)
        return f"{helper}({self._print(num)}, {self._print(den)})"

    def _print_floor(self, expr: sympy.floor) -> str:
        return self._print_rounded_division(expr, expr.args[0], "kl_floordiv")

    def _print_ceiling(self, expr: sympy.ceiling) -> str:
        return self._print_rounded_division(expr, expr.args[0], "kl_ceildiv")

    def _print_Mod(self, expr: sympy.Basic) -> str:
        # sympy.Mod (Python semantics) and torch's Mod (non-negative operands, where
        # C and Python agree) share this class name.
        p, q = expr.args
        return f"kl_mod({self._print(p)}, {self._print(q)})"

    # torch.utils._sympy.functions (looked up by class name; no torch import needed here)

    def _print_FloorDiv(self, expr: sympy.Basic) -> str:  # also CleanDiv, a subclass
        base, divisor = expr.args
        return self._print_rounded_division(expr, base / divisor, "kl_floordiv")

    def _print_CeilDiv(self, expr: sympy.Basic) -> str:
        base, divisor = expr.args
        return self._print_rounded_division(expr, base / divisor, "kl_ceildiv")

    def _print_FloorToInt(self, expr: sympy.Basic) -> str:
        return self._print_rounded_division(expr, expr.args[0], "kl_floordiv")

    def _print_CeilToInt(self, expr: sympy.Basic) -> str:
        return self._print_rounded_division(expr, expr.args[0], "kl_ceildiv")

    def _print_PythonMod(self, expr: sympy.Basic) -> str:
        return self._print_Mod(expr)

    def _print_ModularIndexing(self, expr: sympy.Basic) -> str:
        base, divisor, modulus = expr.args
        quotient = self._print_rounded_division(expr, base / divisor, "kl_floordiv")
        return f"kl_mod({quotient}, {self._print(modulus)})"

    def _print_PowByNatural(self, expr: sympy.Basic) -> str:
        base, exp = expr.args
        if exp.is_Integer and exp < 0:
            self._fail(expr, "negative exponent")
        return f"kl_pow({self._print(base)}, {self._print(exp)})"

    def _print_IntTrueDiv(self, expr: sympy.Basic) -> str:
        num, den = sympy.fraction(sympy.cancel(sympy.together(self._rationalize(expr))))
        if den == 1:
            return self._print(num)
        if den == -1:
            return self._print(-num)
        self._fail(expr, "true division that is not provably exact")

    def _print_Identity(self, expr: sympy.Basic) -> str:
        return self._print(expr.args[0])

    # ------------------------------------------------------------------ min / max

    def _print_lattice(self, expr: sympy.Basic, helper: str) -> str:
        args = sorted(expr.args, key=sympy.default_sort_key)
        code = self._print(args[-1])
        for arg in reversed(args[:-1]):
            code = f"{helper}({self._print(arg)}, {code})"
        return code

    def _print_Min(self, expr: sympy.Basic) -> str:  # sympy.Min and torch's Min
        return self._print_lattice(expr, "kl_min")

    def _print_Max(self, expr: sympy.Basic) -> str:  # sympy.Max and torch's Max
        return self._print_lattice(expr, "kl_max")


def to_cxx(expr: sympy.Expr, names: Mapping[sympy.Symbol, str] | None = None) -> str:
    """``expr`` as a C++ ``int64_t`` expression with Python's exact integer semantics.

    ``names`` renames symbols to C++ expressions (default: the symbol's name).
    The result uses the helpers of ``kl_symbolic.h``. Raises
    :class:`~kernel_lens.errors.SymbolicError` if ``expr`` is not an exact
    integer expression.
    """
    if not isinstance(expr, sympy.Basic):
        return Int64CxxPrinter(names=names).doprint(expr)
    try:
        key = frozenset((names or {}).items())
        hash(key)
    except TypeError:  # unhashable names: print without the cache
        return Int64CxxPrinter(names=names).doprint(expr)
    return _to_cxx_cached(expr, key)


@functools.lru_cache(maxsize=8192)
def _to_cxx_cached(expr: sympy.Basic, names: frozenset) -> str:
    # A pure function of the (structurally compared) expression and the names: emitters print
    # the same shapes and strides many times, and a printer is costly to construct.
    return Int64CxxPrinter(names=dict(names)).doprint(expr)
