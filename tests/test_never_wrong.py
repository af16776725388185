"""Issue 38: never a silently wrong model. The models that compiled wrong (a value computed from a
size inside a piece, a size-1 path, a kernel writing part of a buffer torch filled) and the partial
write patterns, each compiled on this CPU host and evaluated against eager (kernels in Triton's
interpreter on both sides) at every size tried in its declared range: all sizes up to 9 and around
each power of two up to the maximum."""

from __future__ import annotations

import os
import random

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.compiler import CompiledModel
from kernel_lens.codegen.launch_io import launch_io
from kernel_lens.errors import KernelLensError, TraceError
from kernel_lens.frontends.capture.recorder import capture
from kernel_lens.frontends.trace.size_pieces import difference, piece_ends
from kernel_lens.ir.graph import ConstArg

from conftest import ROOT, evaluated_against_eager, example_files, load_module, model_ir

never_wrong = load_module(ROOT / "tests" / "models" / "never_wrong.py")


@pytest.fixture(scope="module", params=sorted(never_wrong.CASES))
def case(request):
    model, inputs, dims = never_wrong.CASES[request.param]
    compiled = kl.compile(model, tuple(t.clone() for t in inputs), dynamic_shapes=dims, arch=90)
    return request.param, model, inputs, compiled


def _at(inputs: tuple, rows: int) -> tuple:
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, inputs[0].shape[1], generator=g),)


def test_compiled_equals_eager_at_every_size_tried(case):
    name, model, inputs, compiled = case
    (symbol, info), = compiled.ir.symbols.items()
    scale = 2 if name == "strided_view_write" else 1
    tried = never_wrong.sizes_to_try(info.min, info.max)
    assert tried[0] == info.min and tried[-1] == info.max and len(tried) >= 9
    for size in tried:
        x = _at(inputs, size * scale)
        want = capture(model, tuple(t.clone() for t in x), 90).outputs
        got = compiled.run(*[t.clone() for t in x])
        assert torch.equal(got, want), (name, symbol, size, (got - want).abs().max())


def test_a_size_one_branch_and_a_table_of_sizes_are_pieces_of_their_own():
    """The size-1 path and each value of min(batch, 3) are traced where they hold (torch's 0/1
    assumption is off for a size declared to reach 1)."""
    def pieces(name):
        model, inputs, dims = never_wrong.CASES[name]
        ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
        return [p.when[0].ranges["batch"] for p in ir.pieces]
    assert pieces("size_one_fast_path") == [(1, 1), (2, 256)]
    assert pieces("table_scale") == [(1, 1), (2, 2), (3, 256)]


@pytest.mark.parametrize("name", ["partial_rotary", "zeros_first_rows", "every_other_row",
                                  "slice_write", "strided_view_write", "several_launches_one_buffer"])
def test_a_kernel_writing_part_of_a_buffer_takes_its_contents_in(name):
    """The launch node of every partial write reads the buffer's current contents (in/out): none
    is a fresh output, since torch wrote the buffer (or the kernel writes through a view)."""
    model, inputs, dims = never_wrong.CASES[name]
    ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
    for graph in ir.graphs():
        for launch in graph.launches:
            io = launch_io(graph, launch, "__v")
            assert io.outputs and all(io.copy_from[v] is not None for v, _ in io.outputs), \
                (name, launch.kernel, io.copy_from)


def test_a_kernel_filling_a_fresh_buffer_alone_is_still_a_fresh_output():
    """The other side of the rule: torch.empty written only by the kernel stays a fresh output
    (no copy of undefined contents into the node)."""
    model, inputs, dims = never_wrong.CASES["size_arithmetic"]
    ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
    launch = ir.graphs()[0].launches[0]
    io = launch_io(ir.graphs()[0], launch, "__v")
    assert [io.copy_from[v] for v, _ in io.outputs] == [None]


# --- pieces proven at their ends (issue 38 item 2) -----------------------------------------------
def test_each_piece_is_traced_again_at_both_ends_and_the_proof_is_recorded():
    model, inputs, dims = never_wrong.CASES["table_scale"]
    compiled = kl.compile(model, inputs, dynamic_shapes=dims, arch=90)
    proofs = [p.graph.proven_at for p in compiled.ir.pieces]
    assert proofs == [[], [], [{"batch": 3}, {"batch": 256}]]  # pieces 0, 1: one size each
    assert "traced at batch=4; proven at batch=3; batch=256" in compiled.summary()
    again = kl.ir.GraphIR.from_json(compiled.ir.to_json())
    assert [p.graph.proven_at for p in again.pieces] == proofs


def test_a_model_that_takes_another_path_at_an_end_is_refused_in_one_line():
    with pytest.raises(TraceError, match=r"never_wrong.py:\d+: the model takes another path at "
                       r"rows=2 than at rows=4 inside the piece of the declared range where rows in "
                       r"\[2, 64\].*launch 0 \(scale_kernel, defined at .*never_wrong.py:\d+\) "
                       r"argument 's' is [0-9.]+ there, [0-9.]+ in the piece") as err:
        kl.compile(never_wrong.Stateful(), never_wrong._x(4),
                   dynamic_shapes={"x": {0: torch.export.Dim("rows", min=1, max=64)}}, arch=90)
    assert "\n" not in str(err.value)


def test_an_end_beyond_the_budget_is_moved_inward_and_the_proof_says_where():
    ir = kl.compile(never_wrong.Stateless(), (torch.randn(4, 8),), arch=90,
                    dynamic_shapes={"x": {0: torch.export.Dim("rows", min=1, max=1 << 14)}}).ir
    assert [p.when[0].ranges["rows"] for p in ir.pieces] == [(1, 1), (2, 1 << 14)]  # 1 alone
    assert piece_ends(ir) == [(0, {"rows": 1}), (1, {"rows": 2}), (1, {"rows": 1 << 14})]
    assert piece_ends(ir, budget=1024) == [(0, {"rows": 1}), (1, {"rows": 2}), (1, {"rows": 128})]
    # the largest tensor within 1 << 16 elements on a CPU host, 8 columns: 8192 rows
    assert ir.pieces[1].graph.proven_at == [{"rows": 2}, {"rows": 8192}]


@pytest.mark.parametrize("plant, message", [
    (lambda g: setattr(g.launches[0], "grid", ("batch", "1", "1")), "has grid ('batch', '1', '1') there"),
    (lambda g: next(p for p in g.kernels[g.launches[0].kernel].params if p.name == "BLOCK")
     .__setattr__("constexpr_value", 32), "constexpr 'BLOCK' is 32 there, 64 in the piece"),
    (lambda g: next(a for a in g.launches[0].args if a.name == "s").__setattr__("constant", 2.5),
     "argument 's' is 2.5 there, 2.0 in the piece"),
    (lambda g: next(a for a in g.launches[0].args if a.name == "x_ptr").__setattr__("value", "x"),
     "argument 'x_ptr' is 'x' there, 'mul' in the piece"),
    (lambda g: next(a for a in g.launches[0].args if a.name == "n").__setattr__("expr", "4*batch"),
     "argument 'n' is '4*batch' there, '8*batch' in the piece"),
    (lambda g: g.ops[0].args.__setitem__(1, ConstArg(const=0.5)), "torch op 0 is aten.mul.Tensor"),
    (lambda g: g.ops.pop(), "torch ops there"),
    (lambda g: g.launches.append(g.launches[0].model_copy()), "kernel launches there"),
])
def test_every_difference_between_a_piece_and_its_trace_at_an_end_is_found(plant, message):
    model, inputs, dims = never_wrong.CASES["table_scale"]
    graph = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir.pieces[2].graph
    assert difference(graph, graph.model_copy(deep=True)) is None
    other = graph.model_copy(deep=True)
    plant(other)
    assert message in difference(graph, other)


def test_an_autotuned_constexpr_may_differ_at_an_end():
    """A tuner picks a config per size; any config computes the kernel: not a difference."""
    model, inputs, dims = never_wrong.CASES["table_scale"]
    graph = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir.pieces[2].graph
    kernel = graph.kernels[graph.launches[0].kernel]
    kernel.options.autotune_config = {"BLOCK": 64}
    other = graph.model_copy(deep=True)
    next(p for p in other.kernels[kernel.id].params if p.name == "BLOCK").constexpr_value = 128
    next(a for a in other.launches[0].args if a.name == "BLOCK").constant = 128
    assert difference(graph, other) is None


# --- differential checking: generated models, compiled vs eager (issue 38 item 4) ---------------
FAST_EXAMPLES = int(os.environ.get("KL_DIFFERENTIAL_EXAMPLES", "8"))  # generated models the fast set compiles; the GPU suite runs the same strategy


@st.composite
def programs(draw):
    """A generated model (never_wrong.Program) and its declared row range. Parts are picked
    uniformly by a random drawn from the data (hypothesis' own choices lean to the first
    option, and the fast set draws few examples)."""
    r = draw(st.randoms(use_true_random=False))
    model = never_wrong.Program(r.choice(sorted(never_wrong.SIZE_FUNCTIONS)), r.randint(1, 9),
                                tuple(r.choice([0.5, 1.0, 2.0, 3.0, 0.25]) for _ in range(r.randint(2, 5))),
                                r.random() < 0.5, r.random() < 0.5, r.choice(never_wrong.BUFFERS),
                                r.random() < 0.5)
    lo, hi = r.choice([1, 2]), r.choice([9, 17, 40])
    return model, lo, hi, r.randint(max(lo, 2), hi)


@settings(max_examples=FAST_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(programs(), st.randoms(use_true_random=False))
@example((never_wrong.Program("size_one", 1, (2.0, 0.5), True, True, "tail_copy", False), 1, 9, 4),
         random.Random(0))
@example((never_wrong.Program("table", 1, (3.0, 2.0, 0.5), False, True, "every_other", True), 1, 17, 5),
         random.Random(1))
def test_generated_models_equal_eager_inside_each_piece_and_at_its_ends(program, rng):
    model, lo, hi, example = program
    x = torch.randn(example, 8, generator=torch.Generator().manual_seed(example))
    dims = {"x": {0: torch.export.Dim("rows", min=lo, max=hi)}}
    try:
        compiled = kl.compile(model, (x,), dynamic_shapes=dims, arch=90)
    except KernelLensError as exc:  # a typed refusal naming why: allowed, never wrong
        assert str(exc).strip(), exc
        print(f"refused: {model}: {str(exc).splitlines()[0][:200]}")
        return
    boxes = [p.when[0].ranges["rows"] for p in compiled.ir.pieces] or [(lo, hi)]
    assert sorted(b for box in boxes for b in range(box[0], box[1] + 1)) == list(range(lo, hi + 1))
    sizes = sorted({s for a, b in boxes for s in (a, b, rng.randint(a, b))})
    for rows in sizes:
        xs = torch.randn(rows, 8, generator=torch.Generator().manual_seed(rows))
        want = capture(model, (xs.clone(),), 90).outputs
        got = compiled.run(xs.clone())
        assert torch.equal(got, want), (model, rows, (got - want).abs().max())
    print(f"checked {model} at rows={sizes} over {len(boxes)} pieces")


def test_bf16_dot_is_computed_not_bit_patterns_and_compiled_equals_it():
    """Triton 3.6's interpreter matmuls bf16 operands as uint16 bit patterns (garbage on both
    sides of a CPU comparison, which would pass as a check): kernel_lens widens them to fp32."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(32, 16, generator=g).bfloat16(), torch.randn(16, 16, generator=g).bfloat16()
    want = a.float() @ b.float()
    got = capture(never_wrong.Bf16Dot(), (a, b), 90).outputs
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    dims = {"a": {0: 16 * torch.export.Dim("blocks", min=1, max=4)}, "b": None}
    compiled = kl.compile(never_wrong.Bf16Dot(), (a, b), dynamic_shapes=dims, arch=90)
    for rows in (16, 48, 64):
        x = torch.randn(rows, 16, generator=g).bfloat16()
        torch.testing.assert_close(compiled.run(x, b), x.float() @ b.float(), rtol=1e-6, atol=1e-5)


# --- the bundled examples, as the fast set compiles them ----------------------------------------
@pytest.mark.parametrize("path", [p for p in example_files()], ids=lambda p: p.stem)
def test_each_example_equals_eager_on_the_cpu_at_the_example_and_each_piece_end(path):
    module = load_module(path)
    compiled = CompiledModel(model_ir(path))
    checked = evaluated_against_eager(module, compiled)
    assert checked and checked[0] == {s: i.example for s, i in compiled.ir.symbols.items()}
    assert len(checked) >= 2 or not compiled.ir.symbols, checked


# --- issue 39's pins on the CPU ------------------------------------------------------------------
def test_a_tuple_of_tensors_is_bound_in_order():
    """The kernel writes the tuple element the user passed (the second), never another."""
    dims = {"x": {0: torch.export.Dim("rows", min=2, max=64)}}
    compiled = kl.compile(never_wrong.TupleWrite(), never_wrong._x(4), dynamic_shapes=dims, arch=90)
    for rows in (2, 5, 64):
        x = never_wrong._x(rows)[0]
        a, b = compiled.run(x.clone())
        assert torch.equal(a, torch.zeros_like(x)) and torch.equal(b, 2 * x)


def test_the_graph_picks_the_right_piece_at_the_top_and_bottom_of_each_box():
    """Each piece of size_branches made to compute its own function (its scale kernel scales by
    10 + its index): evaluated at both corners of every box, the output says which piece ran."""
    from conftest import CORPUS

    module = load_module(CORPUS / "size_branches.py")
    ir = model_ir(CORPUS / "size_branches.py").model_copy(deep=True)
    assert len(ir.pieces) >= 4
    for k, piece in enumerate(ir.pieces):
        graph = piece.graph
        launch = next(l for l in graph.launches if graph.kernels[l.kernel].name == "scale_rows_kernel")
        next(a for a in launch.args if a.name == "scale").constant = 10.0 + k
    compiled = CompiledModel(ir)
    tried = []
    for k, piece in enumerate(ir.pieces):
        for box in piece.when:
            for end in (0, 1):
                sizes = {"rows": 40, "n": 100, **{s: r[end] for s, r in box.ranges.items()}}
                sizes = {s: min(v, 1024 if s == "rows" else 4096) for s, v in sizes.items()}
                x, v = module._make_inputs(rows=sizes["rows"], n=sizes["n"])
                y = compiled.run(x, v)[0]
                assert torch.equal(y, (10.0 + k) * x), (k, sizes)
                tried.append(sizes)
    assert {"rows": 47, "n": 64} in tried  # the top of the piece below rows == 48


def test_a_size_without_an_upper_bound_stays_unbounded_across_its_pieces():
    """A Dim with no max, split at 2 (sizes 0 and 1 alone): the top-level symbol has no max
    either, not the sentinel the pieces are cut with."""
    ir = kl.compile(never_wrong.Stateless(), (torch.randn(4, 8),), arch=90,
                    dynamic_shapes={"x": {0: torch.export.Dim("rows", min=1)}}).ir
    assert len(ir.pieces) == 2 and ir.pieces[0].when[0].ranges["rows"] == (1, 1)
    assert ir.symbols["rows"].min == 1 and ir.symbols["rows"].max is None


def test_a_constexpr_differing_at_an_end_is_found_for_a_launch_without_variants():
    """A launch whose IR lists no variants (``dispatch`` empty, valid IR: the launch's own
    kernel runs): its kernel's constexprs are still compared with the trace at the end."""
    graph = kl.compile(never_wrong.Stateless(), (torch.randn(4, 8),), arch=90,
                       dynamic_shapes={"x": {0: torch.export.Dim("rows", min=2, max=64)}}).ir
    assert not graph.pieces
    graph.launches[0].dispatch = []
    assert difference(graph, graph.model_copy(deep=True)) is None
    other = graph.model_copy(deep=True)
    next(p for p in other.kernels[other.launches[0].kernel].params if p.name == "BLOCK").constexpr_value = 32
    assert "constexpr 'BLOCK' is 32 there, 64 in the piece" in difference(graph, other)
