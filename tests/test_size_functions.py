"""Constexprs and grids computed from dynamic sizes with functions the IR grammar has no word for
(``triton.next_power_of_2``'s shifts and ors, ``cdiv`` constant over a range): proven constant,
split into one binary per value, or refused naming the sub-ranges that would work."""

from __future__ import annotations

import pytest
import sympy
import torch
import triton
from hypothesis import given, settings, strategies as st
from torch.utils._sympy.functions import FloorDiv
from torch.utils._sympy.value_ranges import ValueRanges

import kernel_lens as kl
from kernel_lens.errors import DynamicConstexprError
from kernel_lens.frontends.trace import size_functions as sf
from kernel_lens.ir.symbolic import evaluate, parse

from conftest import ROOT, load_module

corpus = load_module(ROOT / "tests" / "corpus" / "constexpr_from_sizes.py")


def test_constant_constexpr_and_one_binary_per_value():
    ir = kl.compile(corpus.model, corpus.example_inputs, dynamic_shapes=corpus.dynamic_shapes,
                    arch=90).ir
    (launch,) = ir.launches
    assert list(launch.guards) == ["BLOCK"]  # NB = cdiv(n, 65536) is proven constant
    assert all(ir.kernels[d.kernel].param("NB").constexpr_value == 1 for d in launch.dispatch)
    assert sorted(d.when["BLOCK"] for d in launch.dispatch) == [2, 4, 8, 16, 32, 64]
    for d in launch.dispatch:
        assert ir.kernels[d.kernel].param("BLOCK").constexpr_value == d.when["BLOCK"]
    names = list(ir.symbols)
    guard, grid = parse(launch.guards["BLOCK"], names), parse(launch.grid[0], names)
    for n in [*range(2, 300), 4095, 4096, 4097, 59999, 60000]:  # exact over the range
        block = min(triton.next_power_of_2(n), 64)
        assert evaluate(guard, {"n": n}) == block
        assert evaluate(grid, {"n": n}) == triton.cdiv(n, block)


def test_too_many_values_is_refused_with_working_subranges():
    class Model(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            n = x.shape[0]
            corpus.blocked_scale_kernel[(1,)](x, out, n, NB=n // 8192 + 1, BLOCK=64)
            return out

    n = torch.export.Dim("n", min=2, max=1 << 20)  # NB takes 129 values: above the cap of 64
    with pytest.raises(DynamicConstexprError) as err:
        kl.compile(Model(), (torch.randn(100),), dynamic_shapes=({0: n},), arch=90)
    text = str(err.value)
    assert "\n" not in text and "constexpr 'NB'" in text and "x.shape[0]" in text
    assert "at most 64 binaries" in text and "values in [1, 129]" in text
    assert err.value.dims == [("x", 0)]


def test_a_constexpr_with_many_values_gets_one_binary_each():
    class Model(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            n = x.shape[0]
            corpus.blocked_scale_kernel[(1,)](x, out, n, NB=n // 64 + 1, BLOCK=64)
            return out

    n = torch.export.Dim("n", min=2, max=2047)  # NB takes 32 values: 32 binaries
    ir = kl.lift(Model(), (torch.randn(100),), dynamic_shapes=({0: n},), arch=90)
    (launch,) = ir.launches
    assert sorted(d.when["NB"] for d in launch.dispatch) == list(range(1, 33))
    assert {ir.kernels[d.kernel].param("NB").constexpr_value for d in launch.dispatch} == set(range(1, 33))


def test_unbounded_range_names_the_dim_to_bound():
    s = sympy.Symbol("s0", integer=True, positive=True)
    with pytest.raises(Exception, match="give its torch.export.Dim a max"):
        sf.pieces(FloorDiv(s, 7), {s: ValueRanges(2, sympy.oo)})


@settings(max_examples=40, deadline=None)
@given(lo=st.integers(1, 5000), width=st.integers(0, 3000), d=st.integers(1, 700))
def test_pieces_and_step_form_are_exact(lo, width, d):
    s = sympy.Symbol("n", integer=True, positive=True)
    expr = FloorDiv(s + d - 1, d)
    hi = lo + width
    try:
        parts = sf.pieces(expr, {s: ValueRanges(lo, hi)})
    except Exception as exc:  # more than MAX_PIECES values: only when the range is that rich
        assert "more than" in str(exc) and (hi + d - 1) // d - (lo + d - 1) // d + 1 > sf.MAX_PIECES
        return
    step = sf.step_form(parts, s)
    for n in {lo, hi, (lo + hi) // 2, *range(lo, min(hi, lo + 50) + 1)}:
        assert int(step.xreplace({s: n})) == (n + d - 1) // d


def test_range_torch_export_rejects_is_reported_in_the_users_terms():
    class Model(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            n = x.shape[0]
            corpus.blocked_scale_kernel[(triton.cdiv(n, 64),)](x, out, n, NB=1, BLOCK=64)
            return out.view(-1, 4)  # needs n % 4 == 0

    seq = torch.export.Dim("seq", min=2, max=4096)
    with pytest.raises(kl.errors.TraceError) as err:
        kl.compile(Model(), (torch.randn(100),), dynamic_shapes=({0: seq},), arch=90)
    text = str(err.value)
    assert "\n" not in text and "L['x']" not in text
    assert text.startswith("torch.export rejects the declared dynamic range of Dim 'seq' "
                           "(x.shape[0], declared seq <= 4096)")
    assert "(x.shape[0] % 4) == 0" in text and "declare instead: _seq = Dim('_seq'" in text


def test_constexpr_of_several_sizes_gets_one_binary_per_value_of_its_interval():
    class Model(torch.nn.Module):
        def forward(self, x):  # fla's layer norm: NB = cdiv(B*T, 2048), B and T dynamic
            out = torch.empty_like(x)
            n = x.numel()
            corpus.blocked_scale_kernel[(triton.cdiv(n, 64),)](
                x, out, n, NB=triton.cdiv(x.shape[0] * x.shape[1], 2048), BLOCK=64)
            return out

    b, t = torch.export.Dim("b", min=2, max=8), torch.export.Dim("t", min=2, max=1024)
    ir = kl.compile(Model(), (torch.randn(2, 8),), dynamic_shapes=({0: b, 1: t},), arch=90).ir
    (launch,) = ir.launches
    assert launch.guards == {"NB": "floor(b*t/2048 + 2047/2048)"}
    assert sorted(d.when["NB"] for d in launch.dispatch) == [1, 2, 3, 4]
    for d in launch.dispatch:
        assert ir.kernels[d.kernel].param("NB").constexpr_value == d.when["NB"]


def test_size_function_of_a_numel_is_split_over_the_numel():
    class Model(torch.nn.Module):
        def forward(self, x):  # FlagGems' pointwise ops: tile = min(next_power_of_2(numel), 256)
            out = torch.empty_like(x)
            n = x.numel()
            block = min(triton.next_power_of_2(n), 256)
            corpus.blocked_scale_kernel[(triton.cdiv(n, block),)](x, out, n, NB=1, BLOCK=block)
            return out

    b, t = torch.export.Dim("b", min=2, max=8), torch.export.Dim("t", min=2, max=1024)
    compiled = kl.compile(Model(), (torch.randn(2, 8),), dynamic_shapes=({0: b, 1: t},), arch=90)
    (launch,) = compiled.ir.launches
    assert sorted(d.when["BLOCK"] for d in launch.dispatch) == [4, 8, 16, 32, 64, 128, 256]
    names = list(compiled.ir.symbols)
    guard, grid = parse(launch.guards["BLOCK"], names), parse(launch.grid[0], names)
    for bb in (2, 3, 8):
        for tt in (2, 3, 5, 16, 17, 100, 1024):
            block = min(triton.next_power_of_2(bb * tt), 256)
            assert evaluate(guard, {"b": bb, "t": tt}) == block
            assert evaluate(grid, {"b": bb, "t": tt}) == triton.cdiv(bb * tt, block)


def test_a_dim_the_code_fixes_to_a_constant_is_named_with_its_value():
    from kernel_lens.frontends.trace.export import _constraint_violation

    text = ("Constraints violated (m)! For more information, run with TORCH_LOGS=\"+dynamic\".\n"
            "  - You marked m as dynamic but your code specialized it to be a constant (16). If "
            "you're using mark_dynamic, either remove it or use maybe_mark_dynamic.\n"
            "Suggested fixes:\n  m = 16")  # torchao's blockwise_fp8_gemm on the H200, torch 2.11
    message = _constraint_violation(text)
    assert message.startswith("torch.export rejects the declared dynamic range of Dim 'm': the "
                              "model's code fixes it to the example's size (m = 16)")
    assert message.endswith("declare instead: m = 16") and "\n" not in message


def test_true_division_under_ceil_is_exact():
    import math

    class Model(torch.nn.Module):
        def forward(self, x):  # FlagGems' cumsum: part_num = math.ceil(B / BLOCK_SIZE)
            out = torch.empty_like(x)
            n = x.shape[0]
            block = triton.next_power_of_2(n) if n <= 4096 else 1024
            parts = math.ceil(n / block)
            corpus.blocked_scale_kernel[(parts * triton.cdiv(n, block),)](x, out, n, NB=1,
                                                                          BLOCK=block)
            return out

    n = torch.export.Dim("n", min=2, max=2048)
    ir = kl.compile(Model(), (torch.randn(8),), dynamic_shapes=({0: n},), arch=90).ir
    names = list(ir.symbols)
    grid = parse(ir.launches[0].grid[0], names)
    for v in (2, 3, 8, 9, 25, 1000, 2048):  # 1 at every size (it was 0 off powers of two)
        assert evaluate(grid, {"n": v}) == 1


def test_a_wrong_translation_is_caught_before_it_reaches_the_ir():
    from torch.utils._sympy.functions import CeilToInt, IntTrueDiv

    s = sympy.Symbol("s0", integer=True, positive=True)
    n = sympy.Symbol("s0", integer=True, nonnegative=True)  # the IR's symbol of the same name
    torch_expr = CeilToInt(IntTrueDiv(s, 32))
    sf.check_same(torch_expr, sympy.ceiling(n / 32), {s: ValueRanges(2, 2048)}, "ok")
    for attempt in range(2):  # refused every time, not only the first (issue 31)
        with pytest.raises(Exception, match="kernel_lens bug"):
            sf.check_same(torch_expr, sympy.floor(n / 32), {s: ValueRanges(2, 2048)}, "grid[0]")


def test_size_function_of_a_scaled_numel():
    class Model(torch.nn.Module):
        def forward(self, x):  # FlagGems' heuristics_for_tile_size(512, numel) of a (b, t, 64)
            out = torch.empty_like(x)
            n = x.numel()
            block = min(triton.next_power_of_2(n), 512)
            corpus.blocked_scale_kernel[(triton.cdiv(n, block),)](x, out, n, NB=1, BLOCK=block)
            return out

    b, t = torch.export.Dim("b", min=1 + 1, max=8), torch.export.Dim("t", min=2, max=2048)
    ir = kl.compile(Model(), (torch.randn(2, 8, 64),), dynamic_shapes=({0: b, 1: t},), arch=90).ir
    (launch,) = ir.launches
    assert sorted(d.when["BLOCK"] for d in launch.dispatch) == [256, 512]  # 256 only at b*t = 4
    names = list(ir.symbols)
    guard, grid = parse(launch.guards["BLOCK"], names), parse(launch.grid[0], names)
    for bb in (2, 3, 8):
        for tt in (2, 3, 7, 64, 2048):
            block = min(triton.next_power_of_2(64 * bb * tt), 512)
            assert evaluate(guard, {"b": bb, "t": tt}) == block
            assert evaluate(grid, {"b": bb, "t": tt}) == triton.cdiv(64 * bb * tt, block)


def test_a_boolean_constexpr_compares_with_its_integer_spelling():
    # flag_gems' one_tile_per_cta: torch gives a true/false Eq(...), kernel_lens folds it to 1
    s = sympy.Symbol("s0", integer=True, positive=True)
    always = sympy.Eq(FloorDiv(s + 4096, 8192), 0)  # true over [2, 2048]
    sf.check_same(always, sympy.Integer(1), {s: ValueRanges(2, 2048)}, "one_tile_per_cta")
    with pytest.raises(Exception, match="kernel_lens bug"):
        sf.check_same(always, sympy.Integer(0), {s: ValueRanges(2, 2048)}, "one_tile_per_cta")


@pytest.mark.parametrize("fn, want", [
    ("BitwiseFn_bitwise_and", lambda n: n & 12), ("BitwiseFn_bitwise_or", lambda n: n | 12),
    ("BitwiseFn_bitwise_xor", lambda n: n ^ 12), ("LShift", lambda n: n << 2),
    ("RShift", lambda n: n >> 2)])
def test_integer_bit_functions_evaluate_exactly_over_the_range(fn, want):
    # torch spells bit operations on sizes as these functions; each is evaluated exactly
    import numpy as np
    import torch.utils._sympy.functions as tf

    s = sympy.Symbol("s", integer=True, positive=True)
    arg = 12 if fn.startswith("Bitwise") else 2
    expr = getattr(tf, fn)(s, sympy.Integer(arg))
    n = np.arange(1, 100, dtype=np.int64)
    assert sf._evaluate(expr, s, n, {}).tolist() == [want(int(v)) for v in n]


def test_a_violation_torch_gives_no_reason_for_still_names_the_dim():
    from kernel_lens.frontends.trace.export import _constraint_violation

    message = _constraint_violation("Constraints violated (seq, batch)! see the log\n")
    assert message == ("torch.export rejects the declared dynamic range of Dim 'seq', Dim 'batch': "
                       "the model's code only works for part of that range")
    assert _constraint_violation("some other failure") is None


def test_a_view_at_a_dynamic_offset_has_no_address_under_torch_export():
    import types

    from kernel_lens.errors import UnsupportedKernelError
    from kernel_lens.frontends.capture.tensor_likes import Tokens

    view = types.SimpleNamespace(_base=None, storage_offset=lambda: sympy.Symbol("s0") + 4,
                                 element_size=lambda: 4)
    with pytest.raises(UnsupportedKernelError, match=r"data_ptr\(\) of a view whose storage offset "
                       r"depends on a dynamic size \(s0 \+ 4\) was asked for under torch.export"):
        Tokens().address(view)
    root = types.SimpleNamespace(_base=None, storage_offset=lambda: 0, element_size=lambda: 4)
    at_three = types.SimpleNamespace(_base=root, storage_offset=lambda: 3, element_size=lambda: 4)
    tokens = Tokens()
    assert tokens.address(at_three) - tokens.address(root) == 12  # one root, 3 elements on


# --- issue 39 item 13: ranges wider than the dense window (1 << 16) reach the bisection ----------
def _covered(parts, lo, hi):
    """The pieces are ascending, contiguous and cover [lo, hi] exactly: no size in no piece."""
    assert parts[0][1] == lo and parts[-1][2] == hi
    for (_, a, b), (_, c, _) in zip(parts, parts[1:]):
        assert a <= b and c == b + 1, parts


def test_a_range_wider_than_65536_is_split_with_no_size_left_out():
    s = sympy.Symbol("n", integer=True, positive=True)
    cond = sympy.And(s >= 75_000, s <= 112_500)
    parts = sf.truth_pieces(cond, {s: ValueRanges(1, 200_000)})
    _covered(parts, 1, 200_000)
    assert parts == [(False, 1, 74_999), (True, 75_000, 112_500), (False, 112_501, 200_000)]
    steps = sf.pieces(FloorDiv(s, 37_500), {s: ValueRanges(1, 200_000)})
    _covered(steps, 1, 200_000)
    assert [(v, a) for v, a, _ in steps] == [(k, max(1, 37_500 * k)) for k in range(6)]


@settings(max_examples=25, deadline=None)
@given(lo=st.integers(1, 1000), width=st.integers(70_000, 3_000_000), d=st.integers(20_000, 900_000))
def test_wide_ranges_are_split_exactly_where_the_value_changes(lo, width, d):
    s = sympy.Symbol("n", integer=True, positive=True)
    hi = lo + width
    try:
        parts = sf.pieces(FloorDiv(s, d), {s: ValueRanges(lo, hi)})
    except Exception as exc:  # more than MAX_PIECES values
        assert "more than" in str(exc) and hi // d - lo // d + 1 > sf.MAX_PIECES
        return
    _covered(parts, lo, hi)
    for value, a, b in parts:  # each piece's ends, and the sizes just outside them
        assert a // d == value == b // d
        assert a == lo or (a - 1) // d != value
        assert b == hi or (b + 1) // d != value
