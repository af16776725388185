"""Integer functions of dynamic sizes that the IR grammar cannot spell, made exact over the range.

Library host code computes launch parameters from sizes with more than arithmetic:
``triton.next_power_of_2(n)`` is a chain of shifts and bitwise ors, ``triton.cdiv(B*T, 65536)``
a division that is constant over a bounded range. torch.export records them as torch's sympy
functions (``BitwiseFn_bitwise_or``, ...). Over a declared ``Dim`` range such a function of one
size is piecewise constant with few pieces, which interval evaluation (torch's own
``bound_sympy``) finds by bisection; a piecewise-constant function of an integer ``n`` is then
exactly ``v0 + sum(d_i * Min(1, Max(0, n - b_i + 1)))``, which the grammar spells.

- ``pieces(expr, ranges)``: the (value, lo, hi) pieces of a one-symbol expression over its range.
- ``rewrite(expr, ranges)``: every maximal sub-expression using a function outside the grammar
  replaced by its step-function form (one symbol each), or ``SymbolicError`` naming it.
- ``constexpr_values(expr, ranges)``: the values a constexpr takes over the declared range.
- ``truth_pieces(cond, ranges)``: where a condition on one size holds over its range (the
  guards of Python branches on sizes, which split a declared range into pieces).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import sympy
from torch.utils._sympy.value_ranges import ValueRanges, bound_sympy

from ...errors import SymbolicError

_FOREIGN = ("BitwiseFn", "LShift", "RShift")  # torch functions the IR grammar has no word for
MAX_PIECES = 64  # pieces a rewritten sub-expression may have
_MAX_PROBES = 20000  # interval evaluations spent looking for the pieces


def _brief(expr: Any, limit: int = 100) -> str:
    text = str(expr)
    return text if len(text) <= limit else text[:limit] + " ..."


def _foreign(expr: sympy.Basic) -> bool:
    return type(expr).__name__.startswith(_FOREIGN)


def _bounds(ranges: dict, sym: sympy.Symbol) -> tuple[int, int]:
    vr = ranges.get(sym, ranges.get(str(sym)))
    lo = vr.lower if vr is not None else None
    hi = vr.upper if vr is not None else None
    if lo is None or hi is None or not (getattr(lo, "is_Integer", False) or isinstance(lo, int)) \
            or not (getattr(hi, "is_Integer", False) or isinstance(hi, int)):
        raise SymbolicError(f"size {sym} has no finite range (lower {lo}, upper {hi}): give its "
                            f"torch.export.Dim a max")
    return int(lo), int(hi)


_DENSE = 1 << 16  # a box this narrow is evaluated point by point (vectorized)


def pieces(expr: sympy.Expr, ranges: dict, limit: int = MAX_PIECES) -> list[tuple[int, int, int]]:
    """The pieces ``(value, lo, hi)`` (inclusive, ascending) of ``expr``, a function of one size
    symbol, over that symbol's range; ``SymbolicError`` when there are more than ``limit``.

    Boxes are split by bisection until interval evaluation proves them constant or they are
    narrow enough to evaluate every point exactly (int64 numpy, checked against overflow)."""
    free = sorted(expr.free_symbols, key=str)
    if len(free) != 1:
        raise SymbolicError(f"{_brief(expr)} depends on {len(free)} sizes ({', '.join(map(str, free))}); "
                            f"kernel_lens splits functions of one size only")
    sym = free[0]
    lo, hi = _bounds(ranges, sym)

    def constant(vr: ValueRanges) -> int | None:
        return int(vr.lower) if vr.lower == vr.upper and getattr(vr.lower, "is_Integer", False) else None
    merged = _bisect(expr, sym, lo, hi, limit, constant, "into constant pieces ")
    if len(merged) > limit:
        raise SymbolicError(f"{_brief(expr)} takes more than {limit} values over {sym} in [{lo}, {hi}]")
    return merged


def truth_pieces(cond: sympy.Basic, ranges: dict, limit: int = MAX_PIECES) -> list[tuple[bool, int, int]]:
    """The pieces ``(holds, lo, hi)`` (inclusive, ascending) of a condition on one size over that
    size's range, exactly: boxes are proven by interval evaluation (torch's ``bound_sympy``,
    sound for relations and their and/or/not) or evaluated point by point; ``SymbolicError``
    when the condition depends on several sizes or has more than ``limit`` pieces."""
    free = sorted(cond.free_symbols, key=str)
    if len(free) != 1:
        raise SymbolicError(f"{_brief(cond)} depends on {len(free)} sizes "
                            f"({', '.join(map(str, free))}); kernel_lens splits ranges on "
                            f"conditions of one size")
    sym = free[0]
    lo, hi = _bounds(ranges, sym)

    def constant(vr: ValueRanges) -> int | None:
        proven = vr.lower == vr.upper and vr.lower in (sympy.true, sympy.false)
        return int(vr.lower is sympy.true) if proven else None
    merged = _bisect(cond, sym, lo, hi, limit, constant, "")
    if len(merged) > limit:
        raise SymbolicError(f"{_brief(cond)} changes truth more than {limit} times over {sym} in "
                            f"[{lo}, {hi}]")
    return [(bool(v), a, b) for v, a, b in merged]


def _bisect(expr: sympy.Basic, sym: sympy.Symbol, lo: int, hi: int, limit: int,
            constant: Callable[[ValueRanges], int | None], into: str) -> list[tuple[int, int, int]]:
    """The merged pieces ``(value, lo, hi)`` of ``expr`` over ``[lo, hi]``: boxes are split by
    bisection until ``constant`` proves one from its interval bound (its value, else None) or it
    is narrow enough to evaluate every point exactly. Stops early once more than ``limit``
    pieces are certain (the caller refuses those)."""
    out: list[tuple[int, int, int]] = []
    todo, probes = [(lo, hi)], 0
    while todo:
        a, b = todo.pop()
        probes += 1
        if probes > _MAX_PROBES:
            raise SymbolicError(f"{_brief(expr)} over {sym} in [{lo}, {hi}] could not be split "
                                f"{into}within {_MAX_PROBES} evaluations")
        if b - a < _DENSE:
            out += _dense_pieces(expr, sym, a, b)
        else:
            value = constant(bound_sympy(expr, {sym: ValueRanges(a, b)}))
            if value is not None:
                out.append((value, a, b))
            else:
                mid = (a + b) // 2
                todo += [(mid + 1, b), (a, mid)]  # lower half popped first
        if len(out) > 4 * limit and len(_merged(out)) > limit:
            break
    return _merged(out)


def _dense_pieces(expr: sympy.Expr, sym: sympy.Symbol, a: int, b: int) -> list[tuple[int, int, int]]:
    points = np.arange(a, b + 1, dtype=np.int64)
    values = _evaluate(expr, sym, points, {})
    cuts = np.flatnonzero(np.diff(values)) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts - 1, [len(points) - 1]))
    return [(int(values[i]), int(points[i]), int(points[j])) for i, j in zip(starts, ends)]


_LIMIT = 1 << 62  # int64 headroom: a value beyond it may have overflowed
_RELATIONS = {"Equality": np.equal, "Unequality": np.not_equal, "StrictLessThan": np.less,
              "LessThan": np.less_equal, "StrictGreaterThan": np.greater,
              "GreaterThan": np.greater_equal}


def _evaluate(expr: sympy.Basic, sym: sympy.Symbol, n: np.ndarray, memo: dict) -> np.ndarray:
    """``expr`` at every point of ``n``, exactly in int64 (torch's integer functions)."""
    if expr in memo:
        return memo[expr]
    if expr == sym:
        out = n
    elif expr is sympy.true or expr is sympy.false:
        out = np.full_like(n, int(expr is sympy.true))
    elif expr.is_Integer:
        out = np.full_like(n, int(expr))
    elif type(expr).__name__ in _RELATIONS:
        lhs, rhs = (_evaluate(a, sym, n, memo) for a in expr.args)
        out = _RELATIONS[type(expr).__name__](lhs, rhs).astype(np.int64)
    elif isinstance(expr, (sympy.And, sympy.Or, sympy.Not)):
        args = [_evaluate(a, sym, n, memo) != 0 for a in expr.args]
        combined = np.logical_not(args[0]) if isinstance(expr, sympy.Not) else \
            (np.logical_and.reduce(args) if isinstance(expr, sympy.And) else np.logical_or.reduce(args))
        out = combined.astype(np.int64)
    else:
        args = [_evaluate(a, sym, n, memo) for a in expr.args]
        name = type(expr).__name__
        if name == "Add":
            out = sum(args[1:], args[0])
        elif name == "Mul":
            out = args[0]
            for a in args[1:]:
                out = out * a
        elif name in ("FloorDiv", "floor") and len(args) == 2:
            out = np.floor_divide(args[0], args[1])
        elif name == "CeilDiv":
            out = -np.floor_divide(-args[0], args[1])
        elif name in ("PythonMod", "Mod"):
            out = np.mod(args[0], args[1])
        elif name == "Min":
            out = np.minimum.reduce(args)
        elif name == "Max":
            out = np.maximum.reduce(args)
        elif name == "BitwiseFn_bitwise_or":
            out = np.bitwise_or(args[0], args[1])
        elif name == "BitwiseFn_bitwise_and":
            out = np.bitwise_and(args[0], args[1])
        elif name == "BitwiseFn_bitwise_xor":
            out = np.bitwise_xor(args[0], args[1])
        elif name == "LShift":
            out = np.left_shift(args[0], args[1])
        elif name == "RShift":
            out = np.right_shift(args[0], args[1])
        elif name in ("PowByNatural", "Pow") and expr.args[1].is_Integer and int(expr.args[1]) >= 0:
            out = args[0] ** int(expr.args[1])
        else:
            raise SymbolicError(f"cannot evaluate {name} in {expr} exactly")
        if np.any(np.abs(out) > _LIMIT):
            raise SymbolicError(f"{_brief(expr)} leaves the int64 range over the declared sizes")
    memo[expr] = out
    return out


def _merged(found: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for value, a, b in sorted(found, key=lambda p: p[1]):
        if out and out[-1][0] == value and out[-1][2] + 1 == a:
            out[-1] = (value, out[-1][1], b)
        else:
            out.append((value, a, b))
    return out


def step_form(parts: list[tuple[int, int, int]], sym: sympy.Symbol) -> sympy.Expr:
    """The piecewise-constant function with these pieces, in the IR grammar."""
    expr = sympy.Integer(parts[0][0])
    for (prev, _, _), (value, start, _) in zip(parts, parts[1:]):
        expr += (value - prev) * sympy.Min(1, sympy.Max(0, sym - start + 1))
    return expr


def _has_foreign(expr: Any) -> bool:
    return isinstance(expr, sympy.Basic) and any(_foreign(a) for a in sympy.preorder_traversal(expr))


def one_variable(expr: sympy.Expr, ranges: dict) -> tuple[sympy.Expr, sympy.Symbol, Any, dict]:
    """``expr`` of several sizes written as a function of one sub-expression ``g`` of them (e.g.
    ``next_power_of_2(B*T)`` of ``u = B*T``): ``(expr in u, u, g, ranges with u's interval)``.
    Raises SymbolicError when no such ``g`` (free of foreign functions) exists."""
    free = expr.free_symbols
    candidates = sorted({a for a in sympy.preorder_traversal(expr)
                         if isinstance(a, sympy.Expr) and not a.is_Atom and a.free_symbols == free
                         and not _has_foreign(a)}, key=lambda a: (sympy.count_ops(a), str(a)))
    u = sympy.Symbol("_kl_u", integer=True)
    product = sympy.Mul(*sorted(free, key=str))  # a numel: torch spreads its factors (32*B*T)
    for g in [product, *candidates]:
        in_u = expr.subs(g, u) if g is product else expr.xreplace({g: u})
        if in_u.free_symbols == {u}:
            box = {s: ValueRanges(*_bounds(ranges, s)) for s in free}
            vr = bound_sympy(g, box)
            if getattr(vr.lower, "is_Integer", False) and getattr(vr.upper, "is_Integer", False):
                return in_u, u, g, {**ranges, u: ValueRanges(int(vr.lower), int(vr.upper))}
    raise SymbolicError(f"{_brief(expr)} depends on {len(free)} sizes ({', '.join(sorted(map(str, free)))}) "
                        f"other than through one expression of them")


def rewrite(expr: Any, ranges: dict) -> Any:
    """``expr`` with every maximal sub-expression the grammar cannot spell replaced by its exact
    step-function form over the declared range (of one size, or of one expression of several,
    such as a numel)."""
    if not _has_foreign(expr):
        return expr
    try:  # the largest piecewise-constant sub-expression wins
        if len(expr.free_symbols) == 1:
            (sym,) = expr.free_symbols
            return step_form(pieces(expr, ranges), sym)
        in_u, u, g, with_u = one_variable(expr, ranges)
        return step_form(pieces(in_u, with_u), u).xreplace({u: g})
    except SymbolicError:
        if _foreign(expr):
            raise
    return expr.func(*(rewrite(a, ranges) for a in expr.args))


def tighten(expr: Any, ranges: dict) -> Any:
    """``Max(a, b)``/``Min(a, b)`` decided by the declared ranges where interval evaluation proves
    one side never smaller/larger (torch writes ``Max(1, seq//4)`` for strides; over seq >= 4 it
    is ``seq//4``)."""
    if not isinstance(expr, sympy.Basic) or expr.is_Atom:
        return expr
    args = [tighten(a, ranges) for a in expr.args]
    name = type(expr).__name__
    if name in ("Max", "Min") and len(args) == 2 and all(isinstance(a, sympy.Expr) for a in args):
        try:
            box = {s: ValueRanges(*_bounds(ranges, s)) for s in (args[0] - args[1]).free_symbols}
            vr = bound_sympy(args[0] - args[1], box)
        except SymbolicError:
            vr = None
        if vr is not None and vr.lower >= 0:
            return args[0] if name == "Max" else args[1]
        if vr is not None and vr.upper <= 0:
            return args[1] if name == "Max" else args[0]
    return expr.func(*args) if args != list(expr.args) else expr


def constexpr_values(expr: sympy.Expr, ranges: dict, limit: int) -> list[tuple[int, int, int]]:
    """The pieces of a constexpr computed from sizes: one piece when it is constant over the
    whole declared range (proven by interval evaluation, any number of sizes)."""
    free = sorted(expr.free_symbols, key=str)
    if not free and getattr(expr, "is_Integer", False):  # torch's replacements made it a constant
        return [(int(expr), None, None)]
    if free:
        box = {s: ValueRanges(*_bounds(ranges, s)) for s in free}
        vr = bound_sympy(expr, box)
        if vr.lower == vr.upper and getattr(vr.lower, "is_Integer", False):
            return [(int(vr.lower), *_bounds(ranges, free[0]))]
        if len(free) > 1 and not any(_foreign(a) for a in sympy.preorder_traversal(expr)) \
                and getattr(vr.lower, "is_Integer", False) and getattr(vr.upper, "is_Integer", False) \
                and int(vr.upper) - int(vr.lower) < limit:
            # several sizes (cdiv(B*T, 2048)): every value the interval allows gets a binary;
            # the expression itself is the guard (no piece boundaries needed)
            return [(v, None, None) for v in range(int(vr.lower), int(vr.upper) + 1)]
        if len(free) > 1:  # next_power_of_2(B*T): pieces over u = B*T
            in_u, u, _, with_u = one_variable(expr, ranges)
            return pieces(in_u, with_u, limit)
    return pieces(expr, ranges, limit)


def value_range(expr: sympy.Expr, ranges: dict) -> tuple[int, int]:
    """Interval bounds of ``expr`` over the declared box of its sizes."""
    box = {s: ValueRanges(*_bounds(ranges, s)) for s in expr.free_symbols}
    vr = bound_sympy(expr, box)
    if not (getattr(vr.lower, "is_Integer", False) and getattr(vr.upper, "is_Integer", False)):
        raise SymbolicError(f"{_brief(expr)} has no finite bounds over the declared ranges")
    return int(vr.lower), int(vr.upper)


def _samples(lo: int, hi: int) -> list[int]:
    picks = {lo, hi, (lo + hi) // 2, min(hi, lo + 1), min(hi, lo + 2)}
    for k in range(1, 63):
        for v in (2 ** k - 1, 2 ** k, 2 ** k + 1, 3 * 2 ** k - 1):
            if lo <= v <= hi:
                picks.add(v)
    return sorted(picks)


def _as_int(value: Any) -> Any:
    """sympy's true/false as 1/0 (a boolean constexpr's two spellings), anything else as is."""
    if value is sympy.true or value is True:
        return sympy.Integer(1)
    if value is sympy.false or value is False:
        return sympy.Integer(0)
    return value


_CHECKED: set = set()  # (torch expression, IR form) pairs already checked in this process


def check_same(torch_expr: Any, plain: Any, ranges: dict, what: str) -> None:
    """The IR's form of a size expression equals torch's own at sample sizes over the declared
    ranges (range ends, powers of two and their neighbours; at most ~300 points per symbol, all
    symbols moved together and one at a time): a translation that is wrong anywhere it is
    sampled stops the compile instead of giving wrong launches."""
    if not isinstance(torch_expr, sympy.Basic) or not torch_expr.free_symbols \
            or not torch_expr.atoms(sympy.Function):  # plain polynomials translate as they are
        return
    key = (torch_expr, plain, tuple(sorted((str(s), str(ranges.get(s))) for s in torch_expr.free_symbols)))
    if key in _CHECKED:
        return
    syms = sorted(torch_expr.free_symbols, key=str)
    try:
        bounds = {s: _bounds(ranges, s) for s in syms}
    except SymbolicError:
        bounds = {s: (2, 1 << 20) for s in syms}
    points = {s: _samples(*b) for s, b in bounds.items()}
    hints = {s: points[s][len(points[s]) // 2] for s in syms}
    trials = [dict(hints)]
    for s in syms:
        trials += [{**hints, s: v} for v in points[s]]
    by_name = {str(s): s for s in plain.free_symbols} if isinstance(plain, sympy.Basic) else {}
    for trial in trials:
        want = torch_expr.xreplace({s: sympy.Integer(v) for s, v in trial.items()})
        got = plain.xreplace({by_name[str(s)]: sympy.Integer(v) for s, v in trial.items()
                              if str(s) in by_name}) if by_name else plain
        want, got = _as_int(want), _as_int(got)  # a boolean constexpr may print as 1/0
        try:
            same = bool(sympy.simplify(sympy.Integer(int(want)) - sympy.Integer(int(got))) == 0)
        except (TypeError, ValueError):
            same = want == got
        if not same:
            at = ", ".join(f"{s}={v}" for s, v in trial.items())
            raise SymbolicError(f"{what}: kernel_lens's form {_brief(plain)} of torch's "
                                f"{_brief(torch_expr)} gives {got} at {at} where torch gives "
                                f"{want}; this is a kernel_lens bug: please report it")
    _CHECKED.add(key)  # only once it has passed: a wrong translation is refused every time
