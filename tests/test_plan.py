"""codegen.plan: the launch plan every native target renders, checked for every corpus model and
example: it round-trips through JSON, each symbol is read from a node input whose dim is that
symbol (or the declared affine form of it), and every expression a target prints (output
shapes, byte sizes, grid, scalars, pointer offsets, workspace) prints with both printers: the
int64 C++ one and TensorRT's IExprBuilder one."""

from __future__ import annotations

import pytest
import sympy

import kernel_lens as kl
from kernel_lens.codegen.cxx import to_cxx
from kernel_lens.codegen.plan import SCRATCH_ALIGN, ModelPlan, build_plan
from kernel_lens.codegen.trt_expr import to_trt
from kernel_lens.ir import evaluate, parse, symbol
from kernel_lens.targets.common.emit import render_launches

from conftest import corpus_files, example_files, load_module

MODELS = {p.stem: p for p in [*corpus_files(), *example_files()]}


@pytest.fixture(scope="module")
def plans():
    out = {}
    for stem, path in MODELS.items():
        module = load_module(path)
        if not hasattr(module, "example_inputs"):
            continue
        inputs = tuple(t.clone() for t in module.example_inputs)
        ir = kl.compile(module.model, inputs, dynamic_shapes=getattr(module, "dynamic_shapes", None),
                        arch=90, roles=getattr(module, "roles", None)).ir
        out[stem] = (ir, build_plan(ir))
    assert len(out) >= 20
    return out


def test_plan_round_trips_through_json(plans):
    for stem, (_, plan) in plans.items():
        text = plan.model_dump_json()  # (as text: a nan scalar is not equal to itself)
        assert ModelPlan.model_validate_json(text).model_dump_json() == text, stem


def _graph_of(ir, index: int):
    """The graph (a piece's, for a model split by size) holding the plan's launch ``index``."""
    for graph in ir.graphs():
        if index < len(graph.launches):
            return graph
        index -= len(graph.launches)
    raise IndexError(index)


def test_symbols_are_read_from_the_input_that_carries_them(plans):
    for stem, (top, plan) in plans.items():
        for launch in plan.launches:
            ir = _graph_of(top, launch.index)
            for read in launch.symbols:
                dim = launch.inputs[read.input]
                text = ir.values[dim.value].shape[read.dim] if read.scale == 1 and not read.offset else None
                if text is not None:
                    assert text == read.name, (stem, launch.index, read)
                else:  # a shape-only graph input: the symbol's declared source
                    info = ir.symbols[read.name]
                    assert (ir.inputs[info.input], info.dim, info.scale, info.offset) == \
                        (dim.value, read.dim, read.scale, read.offset), (stem, read)
                assert (read.min, read.max) == (ir.symbols[read.name].min, ir.symbols[read.name].max)


def test_every_expression_prints_for_cxx_and_tensorrt(plans):
    for stem, (_, plan) in plans.items():
        names = plan.symbols
        cxx_names = {symbol(n): f"sym_{n}" for n in names}
        trt_names = {symbol(n): f"dims_{n}" for n in names}
        for launch in plan.launches:
            texts = [*launch.grid, launch.workspace, *(c.expr for c in launch.dim_checks)]
            texts += [e for o in launch.outputs for e in (*o.shape, o.nbytes)]
            texts += [p.offset for p in launch.pointers] + [s.expr for s in launch.scalars if s.expr]
            for text in texts:
                expr = parse(text, names)
                assert to_cxx(expr, cxx_names), (stem, text)
                assert to_trt(expr, trt_names).count("exprBuilder") >= 1 or expr.is_Symbol, (stem, text)


def test_workspace_covers_each_binary_scratch(plans):
    # the plan's workspace at the captured sizes >= what kl::launch asks for (both scratch
    # buffers, each padded to SCRATCH_ALIGN), for every binary the launch may run
    for stem, (top, plan) in plans.items():
        for launch in plan.launches:
            ir = _graph_of(top, launch.index)
            example = {n: s.example for n, s in {**top.symbols, **ir.symbols}.items()}
            grid = [evaluate(parse(g, plan.symbols), example) for g in launch.grid]
            programs = grid[0] * grid[1] * grid[2]
            have = evaluate(parse(launch.workspace, plan.symbols), example)
            for case in launch.dispatch:
                for b in ir.kernels[case.kernel].binaries:
                    need = sum(-(-size * programs // SCRATCH_ALIGN) * SCRATCH_ALIGN
                               for size in (b.global_scratch_size, b.profile_scratch_size))
                    assert have >= need, (stem, launch.index, have, need)


def test_scalars_are_runtime_when_dynamic_and_baked_when_constant(plans):
    for stem, (ir, plan) in plans.items():
        for launch, ir_launch in zip(plan.launches, [l for g in ir.graphs() for l in g.launches]):
            by_name = {a.name: a for a in ir_launch.args}
            for s in launch.scalars:
                arg = by_name[s.param]
                if arg.expr is not None:
                    assert s.expr == arg.expr and s.constant is None, (stem, s)
                else:
                    assert s.expr is None and s.constant is not None, (stem, s)


def test_workspace_expression_at_synthetic_scratch_sizes():
    # scratch sizes made up (corpus kernels rarely use scratch), against a direct computation
    from types import SimpleNamespace

    from kernel_lens.codegen.plan import _workspace

    n = symbol("n")
    grid = [sympy.ceiling(n / 128), sympy.Integer(2), sympy.Integer(1)]
    small = SimpleNamespace(global_scratch_size=24, profile_scratch_size=0, num_ctas=1)
    large = SimpleNamespace(global_scratch_size=8, profile_scratch_size=100, num_ctas=1)
    expr = _workspace([small, large], grid)
    for value in (1, 128, 129, 5000):
        programs = -(-value // 128) * 2
        want = max(-(-24 * programs // 256) * 256,
                   -(-8 * programs // 256) * 256 + -(-100 * programs // 256) * 256)
        assert int(expr.subs(n, value)) == want
    assert _workspace([], grid) == 0


def test_a_symbol_only_in_an_input_shape_is_read_for_the_dim_checks():
    # conch's bev_pool: a launch whose grid and scalars do not use a dynamic dim of its inputs
    # still checks those dims against it, so it must read it (the C++ named an undeclared local)
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _first(x_ptr, y_ptr, out_ptr):
        tl.store(out_ptr, tl.load(x_ptr) + tl.load(y_ptr))

    class Model(torch.nn.Module):
        def forward(self, x, y):
            out = torch.empty(1, dtype=x.dtype, device=x.device)
            _first[(1,)](x, y, out)
            return out

    n = torch.export.Dim("n", min=2, max=64)
    ir = kl.compile(Model(), (torch.randn(8), torch.randn(8)), dynamic_shapes=({0: n}, {0: n}), arch=90).ir
    (launch,) = build_plan(ir).launches
    assert [s.name for s in launch.symbols] == ["n"]
    assert [(c.input, c.dim, c.expr) for c in launch.dim_checks] == [(1, 0, "n")]
    assert "sym_n = ctx.dim(0, 0)" in render_launches(ir).replace("const int64_t ", "")


def test_a_truth_guard_torch_gave_as_an_integer_prints_as_nonzero():
    """FlagGems' pointwise heuristics reached the emitter as the guard ``1`` (a truth value that is
    1/0 after torch's simplification, H200 run 2026-12-02): printed as C's truth of an integer."""
    from kernel_lens.errors import SymbolicError
    from kernel_lens.targets.common.emit import _Printer

    printer = _Printer(["s0"])
    assert printer.bool("1") == "(INT64_C(1) != 0)"
    assert printer.bool("0") == "(INT64_C(0) != 0)"
    assert printer.bool("s0 <= 4") == "(sym_s0 <= INT64_C(4))"
    assert printer.bool("Mod(s0, 2)") == "(kl_mod(sym_s0, INT64_C(2)) != 0)"
    with pytest.raises(SymbolicError, match="not a boolean"):
        printer.bool("1/3")


def test_guards_joined_by_and_or_not_print_as_cs_operators():
    from kernel_lens.targets.common.emit import _Printer

    printer = _Printer(["s0", "s1"])
    assert printer.bool("(s0 <= 4) & (s1 > 2)") == "((sym_s0 <= INT64_C(4)) && (sym_s1 > INT64_C(2)))"
    assert printer.bool("(s0 <= 4) | (s1 > 2)") == "((sym_s0 <= INT64_C(4)) || (sym_s1 > INT64_C(2)))"
    assert printer.bool("~Eq(Mod(s0, 2), 0)") in ("(!(kl_mod(sym_s0, INT64_C(2)) == INT64_C(0)))",
                                                 "(kl_mod(sym_s0, INT64_C(2)) != INT64_C(0))")
