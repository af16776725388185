"""Symbolic helpers: sound interval bounds, torch -> plain sympy conversion."""

from __future__ import annotations

import pytest
import sympy
from hypothesis import given, settings, strategies as st

from kernel_lens.ir import evaluate, symbol
from kernel_lens.ir.symbolic import bounds, parse, to_plain_sympy

n, m = symbol("n"), symbol("m")
leaf = st.one_of(st.sampled_from([n, m]), st.integers(-20, 100).map(sympy.Integer))
exprs = st.recursive(leaf, lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] - t[1]),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.floor(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.ceiling(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.Mod(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Min(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Max(t[0], t[1])),
), max_leaves=6)


@settings(max_examples=300, deadline=None)
@given(expr=exprs, nlo=st.integers(0, 50), nspan=st.integers(0, 500), mlo=st.integers(0, 50),
       mspan=st.integers(0, 50), data=st.data())
def test_bounds_contain_every_value(expr, nlo, nspan, mlo, mspan, data):
    ranges = {"n": (nlo, nlo + nspan), "m": (mlo, mlo + mspan)}
    lo, hi = bounds(expr, ranges)
    values = {"n": data.draw(st.integers(nlo, nlo + nspan)),
              "m": data.draw(st.integers(mlo, mlo + mspan))}
    v = evaluate(expr, values)
    assert lo <= v <= hi


def test_a_floor_of_an_even_expression_over_twice_an_odd_number_stays_a_floor():
    """sympy 1.14 calls Max(2, 2*n)/6 an integer and drops the floor: (x // 6) * 6 became x."""
    from torch.utils._sympy.functions import CeilDiv, FloorDiv

    s = sympy.Symbol("s0", integer=True, positive=True)
    x = sympy.Max(2, 2 * s)
    for e, want in ((to_plain_sympy(FloorDiv(x, 6) * 6), [0, 0, 6, 6, 6, 12]),
                    (to_plain_sympy(CeilDiv(x, 6)), [1, 1, 1, 2, 2, 2]),
                    (to_plain_sympy(FloorDiv(x + 6, 10)), [0, 1, 1, 1, 1, 1]),
                    (parse("(Max(2, 2*s0) // 6) * 6"), [0, 0, 6, 6, 6, 12]),
                    (parse("floor(Max(2, 2*s0)/6) + ceiling(Max(2, 2*s0)/6)"), [1, 1, 2, 3, 3, 4])):
        assert [evaluate(e, {"s0": v}) for v in range(1, 7)] == want, e
    m6 = sympy.floor(sympy.Max(2, 2 * n) / 6) * 6  # rebuilt by xreplace (a trace renames its symbols)
    assert [evaluate(m6.xreplace({n: m}), {"m": v}) for v in range(1, 7)] == [0, 0, 6, 6, 6, 12]
    assert (sympy.Max(2, 2 * n) / 6).is_integer is None and (sympy.Max(2, 2 * n) / 2).is_integer is True
    assert sympy.floor(4 * n / 2) == 2 * n and sympy.ceiling(n / 3 + 1) == sympy.ceiling(n / 3) + 1  # still simplified


def test_torch_clean_division_is_a_floor():
    from torch.utils._sympy.functions import CleanDiv
    s, t = sympy.Symbol("s0", integer=True, positive=True), sympy.Symbol("s1", integer=True, positive=True)
    e = to_plain_sympy(CleanDiv(s + t, 2))  # torch's "divides exactly" (it stays CleanDiv here)
    assert e == sympy.floor((symbol("s0") + symbol("s1")) / 2)
    assert evaluate(e, {"s0": 5, "s1": 3}) == 4


def test_torch_conditions_become_plain_sympy_conditions():
    s = sympy.Symbol("s0", integer=True, positive=True)
    for cond, want in ((sympy.Not(sympy.And(s > 1, sympy.Ne(s, 3))), [True, False, True, False]),
                       (sympy.And(s > 1, sympy.Ne(s, 3)), [False, True, False, True]),
                       (sympy.Or(sympy.Eq(s, 1), s >= 4), [True, False, False, True])):
        plain = to_plain_sympy(cond)
        assert [bool(plain.xreplace({symbol("s0"): v})) for v in range(1, 5)] == want, cond


def test_unbounded_symbol_gives_infinite_upper_bound():
    assert bounds(4 * n + 3, {"n": (2, None)}) == (11, sympy.oo)


def test_torch_functions_become_plain_sympy():
    from torch.utils._sympy.functions import CeilDiv, FloorDiv, ModularIndexing, PythonMod

    s = sympy.Symbol("s0", integer=True, positive=True)
    assert to_plain_sympy(FloorDiv(s + 31, 32)) == sympy.floor((symbol("s0") + 31) / 32)
    assert [evaluate(to_plain_sympy(CeilDiv(s, 8)), {"s0": v}) for v in (0, 1, 8, 9)] == [0, 1, 1, 2]
    assert to_plain_sympy(PythonMod(s, 7)) == sympy.Mod(symbol("s0"), 7)
    e = to_plain_sympy(ModularIndexing(s, 4, 8))
    assert evaluate(e, {"s0": 45}) == (45 // 4) % 8


def test_exponents_are_integer_literals_of_either_sign():
    from kernel_lens.errors import SymbolicError
    from kernel_lens.ir import parse

    assert parse("n**3", ["n"]) == parse("n*n*n", ["n"])
    assert parse("2**-1") == sympy.Rational(1, 2)
    assert parse("n**-2", ["n"]) == 1 / parse("n", ["n"]) ** 2
    for text in ("n**n", "n**1.5", "n**-n"):
        try:
            parse(text, ["n"])
        except SymbolicError as exc:
            assert "exponent must be an integer literal" in str(exc), text
        else:
            raise AssertionError(f"{text} parsed")


def test_a_symbol_without_a_declared_range_is_a_size():
    # bounds() of a symbol the ranges do not name: a size, [0, oo)
    n = symbol("n")
    assert bounds(n + 1, {}) == (1, sympy.oo)
    assert bounds(n + 1, {"n": (2, 5)}) == (3, 6)


def test_non_integer_constants_are_refused_by_name():
    from kernel_lens.errors import SymbolicError

    for constant in (sympy.Float(1.5), sympy.Rational(1, 3), sympy.pi):
        try:
            to_plain_sympy(constant * symbol("n") if constant != sympy.pi else constant)
        except SymbolicError as exc:
            assert f"non-integer constant {constant} in a shape expression" in str(exc)
        else:
            raise AssertionError(f"{constant} accepted")


def test_plain_python_integers_become_sympy_integers_and_other_objects_are_refused():
    from kernel_lens.errors import SymbolicError
    from kernel_lens.ir.symbolic import to_plain_sympy

    assert to_plain_sympy(7) == sympy.Integer(7) and isinstance(to_plain_sympy(7), sympy.Integer)
    assert to_plain_sympy(True) == sympy.Integer(1)
    with pytest.raises(SymbolicError, match=r"not a symbolic integer: 'x'"):
        to_plain_sympy("x")


def test_torchs_float_to_int_functions_become_floor_and_ceiling():
    # math.floor(a / b) and math.ceil(a / b) on sizes reach the trace as FloorToInt/CeilToInt of
    # IntTrueDiv; as plain sympy they are floor and ceiling of the exact quotient
    from torch.utils._sympy.functions import CeilToInt, FloorToInt, IntTrueDiv

    s = sympy.Symbol("s", integer=True, positive=True)
    plain = symbol("s")
    assert to_plain_sympy(FloorToInt(IntTrueDiv(s, 3))) == sympy.floor(plain / 3)
    assert to_plain_sympy(CeilToInt(IntTrueDiv(s, 3))) == sympy.ceiling(plain / 3)
    assert evaluate(to_plain_sympy(FloorToInt(IntTrueDiv(s, 3))), {"s": 10}) == 3
