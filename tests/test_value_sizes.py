"""Host code that reads tensor values (issue 40): sizes from values are run-time symbols, and a
branch on a value is checked at run time (the other branch is a typed refusal naming the line).
Every case is compiled once and evaluated on the CPU against the eager model."""

import json
from pathlib import Path

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import InputError, IRError, UnsupportedKernelError, UntracedBranchError
from kernel_lens.ir import GraphIR

from conftest import eager_on_cpu, load_module

MODELS = load_module(Path(__file__).parent / "models" / "value_sizes.py")
SOURCE = Path(MODELS.__file__).read_text().splitlines()


def line_of(marker: str) -> str:
    return f"value_sizes.py:{next(i for i, l in enumerate(SOURCE, 1) if marker in l)}"


def mask(*bits):
    return torch.tensor(bits, dtype=torch.bool)


@pytest.fixture(scope="module")
def compiled():
    made = {}

    def get(name, *example):
        if name not in made:
            made[name] = (getattr(MODELS, name)(), kl.compile(getattr(MODELS, name)(), example))
        return made[name]
    return get


def test_a_nonzero_count_sets_the_grid_and_the_rows_at_run_time(compiled):
    x = torch.randn(8, 16)
    model, c = compiled("NonzeroRows", x, mask(1, 0, 1, 1, 0, 0, 1, 0))
    (name, info), = c.ir.runtime_symbols.items()
    assert (info.dim, info.example, info.min) == (0, 4, 1)
    assert c.ir.launches[0].grid[0] == name
    for bits in [(1, 0, 1, 1, 0, 0, 1, 0), (1, 1, 1, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 0, 0, 1)]:
        got = c.run(x, mask(*bits))
        want = eager_on_cpu(model, (x, mask(*bits)))
        assert got.shape == (sum(bits), 16) and torch.equal(got, want)


def test_a_zero_count_the_example_never_took_is_refused_naming_the_branch(compiled):
    x = torch.randn(8, 16)
    _, c = compiled("NonzeroRows", x, mask(1, 0, 1, 1, 0, 0, 1, 0))
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-NONZERO")):
        c.run(x, mask(0, 0, 0, 0, 0, 0, 0, 0))


def test_an_item_used_as_a_size_follows_the_value(compiled):
    model, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    (name, info), = c.ir.runtime_symbols.items()
    assert info.dim is None and info.carrier and info.example == 12
    assert not c.ir.checks  # nothing branched on it
    for lengths in ([3, 4, 5], [100, 1, 5], [0, 0, 0], [1, 0, 0]):
        t = torch.tensor(lengths)
        got = c.run(t)
        assert got.shape == (sum(lengths),) and torch.equal(got, eager_on_cpu(model, (t,)))


def test_out_is_refused_for_an_output_shaped_by_values(compiled):
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    with pytest.raises(InputError, match="depends on tensor values"):
        c.run(torch.tensor([3, 4, 5]), out=[torch.empty(12)])


def test_a_branch_on_a_value_runs_the_traced_branch_and_refuses_the_other(compiled):
    x = torch.randn(100)
    model, c = compiled("ItemBranch", x, torch.zeros(100, dtype=torch.bool))
    assert [ch.where.split(": ")[0].endswith(line_of("BRANCH-ANY")) for ch in c.ir.checks] == [True]
    got = c.run(x, torch.zeros(100, dtype=torch.bool))
    assert torch.equal(got, eager_on_cpu(model, (x, torch.zeros(100, dtype=torch.bool))))
    other = torch.zeros(100, dtype=torch.bool)
    other[7] = True
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-ANY")):
        c.run(x, other)


def test_int_of_an_integer_tensor_is_a_run_time_size(compiled):
    """``int(lengths.sum())`` and ``int(t.item())``: torch would make the value a constant of
    the trace; in the modules that call int() on tensor values it stays a size."""
    model, c = compiled("IntSize", torch.tensor([3, 4, 5]))
    assert len(c.ir.runtime_symbols) == 2 and not c.ir.checks
    for t in ([3, 4, 5], [100, 1, 5], [0, 0, 0], [7, 0, 0]):
        t = torch.tensor(t)
        got = c.run(t)
        assert got.shape == (int(t.sum()),) and torch.equal(got, eager_on_cpu(model, (t,)))
    assert int.__module__ == "builtins" and "int" not in vars(MODELS)  # nothing left behind


def test_a_tensor_used_as_an_index_is_pinned_and_another_value_is_refused(compiled):
    model, c = compiled("IndexSize", torch.tensor([3, 4, 5]))
    # one check: the range asserts torch adds beside the equality are implied by it
    assert [ch.cond for ch in c.ir.checks] == [f"Eq({next(iter(c.ir.runtime_symbols))}, 12)"]
    t = torch.tensor([2, 5, 5])  # the same total: served
    assert torch.equal(c.run(t), eager_on_cpu(model, (t,)))
    with pytest.raises(UntracedBranchError, match=line_of("PINNED")):
        c.run(torch.tensor([1, 1, 5]))


def test_the_ir_keeps_sizes_and_checks_through_json(compiled):
    _, c = compiled("ItemBranch", torch.randn(100), torch.zeros(100, dtype=torch.bool))
    again = GraphIR.from_json(c.ir.to_json())
    assert again == c.ir and again.runtime_symbols and again.checks


def test_ir_refuses_run_time_symbols_that_read_nothing(compiled):
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    name = next(iter(c.ir.runtime_symbols))
    raw = c.ir.model_dump(mode="json")
    bad = dict(raw, runtime_symbols={name: {**raw["runtime_symbols"][name], "value": "nowhere"}})
    with pytest.raises(IRError, match="nowhere"):
        GraphIR.from_json(json.dumps(bad))
    bad = dict(raw, values={**raw["values"], f"{name}_carrier": {
        **raw["values"][f"{name}_carrier"], "shape": ["7", "0"]}})
    with pytest.raises(IRError, match="carrier"):
        GraphIR.from_json(json.dumps(bad))
    bad = dict(raw, checks=[{"order": 1, "cond": "Eq(zz9, 1)", "where": ""}])
    with pytest.raises(IRError, match="undeclared symbols"):
        GraphIR.from_json(json.dumps(bad))


def test_tensorrt_targets_refuse_sizes_from_values_in_one_line(compiled, tmp_path):
    from kernel_lens.targets.base import get_target
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    with pytest.raises(UnsupportedKernelError, match="build --target ort") as info:
        get_target("trt-v3").build_until(c.ir, tmp_path, "lower")
    assert "\n" not in str(info.value)


# --- extra_examples: several traced branches, tried in order (issue 40, item 2) ---------------

def flags(*bits):
    return torch.tensor(bits, dtype=torch.bool)


@pytest.fixture(scope="module")
def branched():
    """Models compiled from several examples; each compiled once."""
    made = {}

    def get(name, example, extra):
        if name not in made:
            made[name] = (getattr(MODELS, name)(), kl.compile(getattr(MODELS, name)(), example,
                                                              extra_examples=extra))
        return made[name]
    return get


def item_branch(branched):
    x = torch.randn(100)
    off, on = torch.zeros(100, dtype=torch.bool), torch.zeros(100, dtype=torch.bool)
    on[7] = True
    # the third example takes the example's branch again: it adds no branch
    return (x, off, on) + branched("ItemBranch", (x, off), [(x, on), (x * 2, off)])


def test_extra_examples_serve_each_branch_they_took(branched):
    x, off, on, model, c = item_branch(branched)
    assert [b.example for b in c.ir.branches] == [0, 1]
    assert all(ch.where.split(": ")[0].endswith(line_of("BRANCH-ANY"))
               for b in c.ir.branches for ch in b.graph.checks)
    for mask in (off, on):
        assert torch.equal(c.run(x, mask), eager_on_cpu(model, (x, mask)))
    y = torch.randn(100)
    more = torch.zeros(100, dtype=torch.bool)
    more[50:] = True
    assert torch.equal(c.run(y, more), eager_on_cpu(model, (y, more)))
    text = c.summary()
    assert "branches:" in text and "branch 1 (taken by extra_examples[0])" in text
    assert "2 value branches" in repr(c)


def test_a_branch_attempt_runs_no_launch_before_its_check_holds(branched):
    """The lowered graph evaluates only what the first branch's condition needs before the
    If: every launch node sits inside a branch body, none at the top level."""
    from kernel_lens.onnx.context import DOMAIN
    from kernel_lens.onnx.lower import lower_to_onnx
    *_, c = item_branch(branched)
    model = lower_to_onnx(c.ir)
    top = [n.op_type for n in model.graph.node]
    assert not [n for n in model.graph.node if n.domain == DOMAIN] and top[-1] == "If"
    assert top.count("If") == 2  # the first branch's check, then the choice between branches


def test_the_branched_ir_round_trips_and_its_signature_knows_the_output_shape(branched):
    from kernel_lens.runtime.signature import CallSignature
    *_, c = item_branch(branched)
    again = GraphIR.from_json(c.ir.to_json())
    assert again == c.ir and len(again.branches) == 2
    assert CallSignature(c.ir, "cpu").outputs[0].dims is not None  # the branches agree on it


def test_a_count_of_zero_taken_by_an_extra_example_is_served(branched):
    x = torch.randn(8, 16)
    model, c = branched("NonzeroRows", (x, flags(1, 0, 1, 0, 0, 0, 0, 0)),
                        [(x, flags(0, 0, 0, 0, 0, 0, 0, 0))])
    assert len(c.ir.branches) == 2 and not c.ir.branches[1].graph.launches  # eager launches none
    for bits in [(0,) * 8, (1,) * 8, (0, 0, 0, 0, 0, 0, 0, 1)]:
        got = c.run(x, flags(*bits))
        assert got.shape == (sum(bits), 16) and torch.equal(got, eager_on_cpu(model, (x, flags(*bits))))


def test_a_path_no_example_took_is_refused_and_the_others_equal_eager(branched):
    x = torch.randn(100)
    no, yes = flags(0, 0), flags(0, 1)
    model, c = branched("TwoBranches", (x, no, no.clone()),
                        [(x, yes, no), (x, no, yes), (x, yes.clone(), no)])
    assert len(c.ir.branches) == 3
    for a, b in [(no, no), (yes, no), (no, yes)]:
        assert torch.equal(c.run(x, a, b.clone()), eager_on_cpu(model, (x, a, b.clone())))
    with pytest.raises(UntracedBranchError, match="no traced graph serves them"):
        c.run(x, yes, yes.clone())


def test_example_tensors_that_share_memory_are_refused():
    """torch.export takes one tensor passed twice for one input: the graph would read ``a``
    where the forward reads ``b`` for every later call."""
    x, no = torch.randn(100), flags(0, 0)
    for example, extra, words in [((x, no, no), None, r"example_inputs\[1\] and example_inputs\[2\]"),
                                  ((x, no, no.clone()), [(x, no, no[:])], r"extra_examples\[0\]\[1\]")]:
        with pytest.raises(InputError, match=words):
            kl.compile(MODELS.TwoBranches(), example, extra_examples=extra)


def test_a_write_to_an_input_on_one_branch_only_is_made_on_that_branch(branched):
    x = torch.randn(100)
    model, c = branched("WritesInputInOneBranch", (x.clone(), flags(0)), [(x.clone(), flags(1))])
    for flag, added in [(flags(0), 0.0), (flags(1), 4.0)]:
        mine, theirs = x.clone(), x.clone()
        got = c.run(mine, flag)
        want = eager_on_cpu(model, (theirs, flag))
        assert torch.equal(got, want) and torch.equal(mine, x + added)


def test_extra_examples_that_describe_another_call_are_refused_in_one_line():
    x = torch.randn(100)
    off = torch.zeros(100, dtype=torch.bool)
    model = MODELS.ItemBranch()
    cases = [(torch.randn(100), "list of input tuples"),
             ([(x,)], "tuple of 2 tensors"),
             ([(x.double(), off)], "torch.float64"),
             ([(x, 3)], "is a int"),
             ([(torch.randn(50), torch.zeros(50, dtype=torch.bool))], "must be dynamic")]
    for extra, words in cases:
        with pytest.raises(InputError, match=words) as info:
            kl.compile(model, (x, off), extra_examples=extra)
        assert "\n" not in str(info.value)


def test_a_branched_ir_is_checked_at_load(branched):
    *_, c = item_branch(branched)
    raw = c.ir.model_dump(mode="json")
    one = dict(raw, branches=raw["branches"][:1])
    with pytest.raises(IRError, match="two or more"):
        GraphIR.from_json(json.dumps(one))
    unchecked = json.loads(json.dumps(raw))
    unchecked["branches"][1]["graph"]["checks"] = []
    with pytest.raises(IRError, match="branch 1 has no checks"):
        GraphIR.from_json(json.dumps(unchecked))
    clash = json.loads(json.dumps(raw))
    k0 = next(iter(clash["branches"][0]["graph"]["kernels"]))
    g1 = clash["branches"][1]["graph"]
    (k1, kernel), = g1["kernels"].items()
    g1["kernels"] = {k0: {**kernel, "id": k0}}
    for launch in g1["launches"]:
        launch["kernel"] = k0
        for case in launch["dispatch"]:
            case["kernel"] = k0
    with pytest.raises(IRError, match="unique across branches"):
        GraphIR.from_json(json.dumps(clash))
    half = json.loads(json.dumps(raw))
    g1 = half["branches"][1]["graph"]
    g1["values"][g1["outputs"][0]]["dtype"] = "fp16"
    with pytest.raises(IRError, match="branch 1: output 0 is fp16"):
        GraphIR.from_json(json.dumps(half))
    reshaped = json.loads(json.dumps(raw))
    reshaped["values"][reshaped["outputs"][0]]["shape"] = ["7"]
    with pytest.raises(IRError, match=r"output 0 has shape \['7'\], every branch \['100'\]"):
        GraphIR.from_json(json.dumps(reshaped))
    both = dict(raw, pieces=[{"when": [{"ranges": {}}], "graph": raw["branches"][0]["graph"]}])
    with pytest.raises(IRError, match="not both"):
        GraphIR.from_json(json.dumps(both))


def test_a_model_file_names_its_extra_examples_for_the_cli(tmp_path):
    from kernel_lens.model_file import load_model_file
    from kernel_lens.verify import verify_file
    source = Path(MODELS.__file__).read_text()
    path = tmp_path / "branchy.py"
    path.write_text(source + "\n\nmodel = ItemBranch()\n_x = torch.randn(64)\n"
                    "example_inputs = (_x, torch.zeros(64, dtype=torch.bool))\n"
                    "def extra_examples():\n    return [(_x, torch.ones(64, dtype=torch.bool))]\n")
    mf = load_model_file(path)
    assert len(mf.extra_examples) == 1 and mf.extra_examples[0][1].all()
    report = verify_file(str(path), cap=64)
    assert report.ok, report.text()
    assert len(report.sets) == 2  # the example's sizes, then the extra example
    assert report.text().startswith("verify ItemBranch on CPU (no CUDA GPU):")


def test_the_models_line_is_never_pythons_own_library_nor_a_test_tools_wrapper():
    """A check names the model's line: frames of the standard library (contextlib, functools)
    and of mutmut's trampolines are skipped; a library installed under the interpreter's own
    prefix is a library's code and is kept."""
    from kernel_lens.frontends.capture import data_values as dv
    from kernel_lens.frontends.capture.interpreter_bounds import _INTERNAL, users_file
    mutmut = next(p for p in _INTERNAL if p.rstrip("/").endswith("mutmut"))
    assert dv._not_model(dv._STDLIB + "contextlib.py") and not users_file(mutmut + "trampoline.py")
    assert not dv._not_model(dv._STDLIB + "site-packages/somelib/ops.py")
    assert not dv._not_model(dv._STDLIB + "dist-packages/somelib/ops.py")
    assert not dv._not_model("/home/me/model.py")


def test_a_launch_inside_a_torch_compiled_helper_is_captured_like_a_plain_one():
    """Capture and trace run a @torch.compile'd helper as written (its backend is never asked)."""
    x = torch.randn(100)
    model = MODELS.CompiledHelper()
    c = kl.compile(model, (x,))
    assert [l.kernel for l in c.ir.launches] == ["ramp"] and not MODELS.COMPILER_CALLS
    with torch.compiler.set_stance("force_eager"):  # the eager reference, as written too
        assert torch.equal(c.run(x), eager_on_cpu(model, (x,)))


def test_the_ort_target_of_a_branched_model_resolves_and_its_folder_equals_eager(branched, tmp_path, ort_headers):
    """The ORT target's own graph (opset 23, the custom-op library, a KernelLensCheck in the last
    branch) is what a loaded folder evaluates; ONNX Runtime resolves every op of every branch."""
    from conftest import assert_loads_in_ort
    x, off, on, model, c = item_branch(branched)
    c.write(tmp_path, ["ort"])
    assert_loads_in_ort(c.artifacts["ort.onnx"], c.artifacts["ort.library"])
    again = kl.load(tmp_path)
    assert len(again.ir.branches) == 2
    for mask in (off, on):
        assert torch.equal(again.run(x, mask), eager_on_cpu(model, (x, mask)))


def test_a_dim_range_holding_one_splits_into_pieces_and_values_are_read_in_each(branched, tmp_path, ort_headers):
    """Dim(min=1): size 1 is a piece of its own (torch's 0/1 specialization); each piece reads
    values and checks its branches, and each extra example joins the piece of its sizes."""
    from torch.export import Dim
    n = Dim("n", min=1, max=4096)
    x, off = torch.randn(100), torch.zeros(100, dtype=torch.bool)
    model = MODELS.ItemBranch()
    c = kl.compile(model, (x, off), dynamic_shapes=({0: n}, {0: n}),
                   extra_examples=[(x, off.logical_not()), (torch.randn(1), torch.ones(1, dtype=torch.bool))])
    assert [len(p.graph.branches) for p in c.ir.pieces] == [2, 2]
    kernels = [k for g in c.ir.graphs() for k in g.kernels]
    assert len(kernels) == len(set(kernels)) == 4
    for size in (1, 2, 37):
        for value in (False, True):
            y, mask = torch.randn(size), torch.full((size,), value, dtype=torch.bool)
            assert torch.equal(c.run(y, mask), eager_on_cpu(model, (y, mask)))
    assert "piece 1: n in [2, 4096]" in c.summary() and "  branch 1 (taken by" in c.summary()
    from conftest import assert_loads_in_ort  # pieces of branches: nested Ifs ORT resolves
    c.write(tmp_path, ["ort"])
    assert_loads_in_ort(c.artifacts["ort.onnx"], c.artifacts["ort.library"])
    y, mask = torch.randn(1), torch.ones(1, dtype=torch.bool)
    assert torch.equal(kl.load(tmp_path).run(y, mask), eager_on_cpu(model, (y, mask)))


def test_a_value_shaped_output_in_pieces_follows_the_values_and_an_untraced_branch_is_refused():
    from torch.export import Dim
    r = Dim("r", min=1, max=64)
    x, mask = torch.randn(8, 16), flags(1, 0, 1, 0, 0, 0, 0, 1)
    model = MODELS.NonzeroRows()
    c = kl.compile(model, (x, mask), dynamic_shapes=({0: r}, {0: r}))
    assert len(c.ir.pieces) == 2 and all(g.runtime_symbols for g in c.ir.graphs())
    from kernel_lens.runtime.signature import CallSignature
    assert CallSignature(c.ir, "cpu").outputs[0].dims is None  # its shape follows the values
    for rows, bits in [(1, (1,)), (5, (0, 1, 1, 0, 1)), (8, (1,) * 8)]:
        y = torch.randn(rows, 16)
        got = c.run(y, flags(*bits))
        assert got.shape == (sum(bits), 16) and torch.equal(got, eager_on_cpu(model, (y, flags(*bits))))
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-NONZERO")):
        c.run(torch.randn(5, 16), flags(0, 0, 0, 0, 0))


def test_a_count_compared_with_a_size_is_checked_not_assumed(branched):
    """torch would decide ``valids.numel() != n`` from the example and replace the count by
    ``n`` everywhere (no check left: a silently wrong graph for any other mask). The count
    stays a run-time size and the comparison a check; an extra example serves the other path."""
    x = torch.randn(100)
    every = torch.ones(100, dtype=torch.bool)
    some = every.clone()
    some[::3] = False
    model, c = branched("CountEqualsTotal", (x, every), [(x, some)])
    assert all(g.runtime_symbols and g.checks for g in c.ir.graphs())
    for keep in (every, some, torch.zeros(100, dtype=torch.bool)):
        assert torch.equal(c.run(x, keep), eager_on_cpu(model, (x, keep)))
    alone = kl.compile(MODELS.CountEqualsTotal(), (x, every))
    assert torch.equal(alone.run(x, every), eager_on_cpu(model, (x, every)))
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-COUNT")):
        alone.run(x, some)


def test_torch_check_equating_a_count_with_a_size_stays_a_run_time_check():
    x = torch.randn(64)
    every = torch.ones(64, dtype=torch.bool)
    model = MODELS.CheckedCount()
    c = kl.compile(model, (x, every))
    (name, info), = c.ir.runtime_symbols.items()
    assert info.dim == 0 and f"Eq({name}, 64)" in [ch.cond for ch in c.ir.checks]
    assert torch.equal(c.run(x, every), eager_on_cpu(model, (x, every)))
    with pytest.raises(UntracedBranchError, match=line_of("CHECKED-COUNT")):
        c.run(x, torch.arange(64) < 10)


def test_a_piece_whose_tiled_example_takes_another_value_branch_at_an_end_is_refused_so():
    """A piece is proven at its ends with the example's values tiled there; when those values
    take another branch on values, the refusal says so (not that torch recorded no condition)."""
    from torch.export import Dim
    from kernel_lens.errors import TraceError
    r = Dim("r", min=1, max=64)
    x, mask = torch.randn(8, 16), flags(0, 0, 0, 0, 0, 0, 0, 1)  # 2 rows of it hold no True
    with pytest.raises(TraceError, match="another branch on tensor values") as info:
        kl.compile(MODELS.NonzeroRows(), (x, mask), dynamic_shapes=({0: r}, {0: r}))
    assert line_of("BRANCH-NONZERO") in str(info.value) and "\n" not in str(info.value)


def test_an_item_only_a_kernel_scalar_reads_is_computed_at_run_time():
    """torch.export would drop the .item() as dead code (only the launch reads it): the launch
    marker takes such sizes, so the graph keeps what makes them."""
    x, counts = torch.randn(64), torch.tensor([3, 4, 5])
    model = MODELS.ItemScalar()
    c = kl.compile(model, (x, counts))
    (name, _), = c.ir.runtime_symbols.items()
    assert [a.expr for a in c.ir.launches[0].args if a.name == "k"] == [name]
    for t in (counts, torch.tensor([100, -7, 0]), torch.zeros(3, dtype=torch.long)):
        assert torch.equal(c.run(x, t), eager_on_cpu(model, (x, t)))


def test_masked_select_with_a_broadcast_mask_gives_a_run_time_length():
    x, keep = torch.randn(4, 32), torch.randint(0, 4, (32,))
    model = MODELS.MaskedSelect()
    c = kl.compile(model, (x, keep))
    for k in (keep, torch.zeros(32, dtype=torch.long), torch.full((32,), 3)):
        got = c.run(x, k)
        assert got.shape == (int((k > 1).sum()) * 4,) and torch.equal(got, eager_on_cpu(model, (x, k)))


@pytest.mark.parametrize("name", ["NonzeroAsTuple", "RepeatInterleave"])
def test_a_decomposed_op_making_a_count_reads_the_forwards_count(name):
    """The front end decomposes these ops and the decomposition makes new sizes: they are the
    op's own (its eager value, one run-time symbol for both)."""
    x = torch.randn(16)
    model = getattr(MODELS, name)()
    c = kl.compile(model, (x, torch.randint(0, 4, (16,))))
    assert len(c.ir.runtime_symbols) == 1
    for counts in (torch.randint(0, 4, (16,)), torch.zeros(16, dtype=torch.long), torch.full((16,), 3)):
        got = c.run(x, counts)
        assert torch.equal(got, eager_on_cpu(model, (x, counts)))


def test_item_values_are_sizes_at_least_zero_and_a_negative_one_is_refused():
    """Conditions on .item() values reason as sizes (>= 0): a negative value in the example is
    refused at compile time, one at run time stops the call before anything reads it."""
    x = torch.randn(64)
    model = MODELS.NegativeItem()
    with pytest.raises(UnsupportedKernelError, match="negative in the example"):
        kl.compile(model, (x, torch.tensor([-1, -5])))
    c = kl.compile(model, (x, torch.tensor([5, 1])))
    assert torch.equal(c.run(x, torch.tensor([7, 0])), eager_on_cpu(model, (x, torch.tensor([7, 0]))))
    with pytest.raises(UntracedBranchError, match=r"\.item\(\) at .*value_sizes\.py:\d+.* is negative"):
        c.run(x, torch.tensor([-10, -20]))


def test_only_conditions_on_pinned_symbols_alone_are_dropped_as_implied():
    from kernel_lens.frontends.lift import _without_implied
    from kernel_lens.ir import RuntimeCheck
    checks = [RuntimeCheck(order=k, cond=c) for k, c in
              enumerate(["Eq(u0, 12)", "u0 >= 12", "u0 <= 12", "u0 + u1 >= 12", "u1 >= 3"])]
    assert [c.cond for c in _without_implied(checks)] == ["Eq(u0, 12)", "u0 + u1 >= 12", "u1 >= 3"]


def test_branches_giving_an_output_another_dtype_are_refused():
    x = torch.randn(64)
    with pytest.raises(UnsupportedKernelError, match="output 0 is fp16 .* fp32") as info:
        kl.compile(MODELS.HalfOnOneBranch(), (x, flags(0)), extra_examples=[(x, flags(1))])
    assert "\n" not in str(info.value)


def test_a_hoisted_weight_never_takes_a_graph_inputs_name():
    """An ONNX initializer named like a graph input is only the input's default: the caller's
    tensor would replace the weight in every branch."""
    import onnx
    from onnx import TensorProto, helper
    from kernel_lens.onnx.pieces import branch_body
    weight = helper.make_tensor("mul", TensorProto.FLOAT, [1], [2.0])
    graph = helper.make_graph([helper.make_node("Mul", ["w_mul", "mul"], ["output_0"])], "g",
                              [helper.make_tensor_value_info("w_mul", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("output_0", TensorProto.FLOAT, [1])],
                              initializer=[weight])
    shared: dict = {}
    body = branch_body(graph, 0, {"w_mul"}, ["output_0"], [], shared, tag="b")
    assert list(shared) == ["w_w_mul"] and list(body.node[0].input) == ["w_mul", "w_w_mul"]


def test_the_int_the_trace_gives_a_models_module_is_int_for_everything_but_tensor_values():
    from kernel_lens.frontends.capture.data_values import _SymbolicInt as Int
    assert isinstance(3, Int) and issubclass(bool, Int) and not isinstance(3.0, Int)
    assert (Int("12"), Int("ff", 16), Int(3.7), Int(), Int(torch.tensor(5))) == (12, 255, 3, 0, 5)
    assert type(Int(torch.tensor(5))) is int and Int(torch.tensor(2.5)) == 2


def test_a_module_using_int_as_a_dtype_is_traced_with_pythons_int():
    """``dtype=int`` takes only Python's own ``int``: the trace runs again with it, and int()
    of the value is then pinned (checked), never wrong."""
    model = MODELS.IntAsDtype()
    c = kl.compile(model, (torch.tensor([3, 4, 5]),))
    t = torch.tensor([2, 5, 5])
    got, want = c.run(t), eager_on_cpu(model, (t,))
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert [ch.cond for ch in c.ir.checks] == [f"Eq({next(iter(c.ir.runtime_symbols))}, 12)"]
    with pytest.raises(UntracedBranchError, match=line_of("INT-DTYPE")):  # pinned: refused
        c.run(torch.tensor([1, 1, 1]))


def test_a_count_that_is_not_dim_0_is_read_from_its_own_dim():
    x, keep = torch.randn(4, 32), torch.randint(0, 4, (32,))
    model = MODELS.ColumnsKept()
    c = kl.compile(model, (x, keep))
    assert [s.dim for s in c.ir.runtime_symbols.values()] == [1]
    for k in (keep, torch.full((32,), 3), torch.zeros(32, dtype=torch.long)):
        got = c.run(x, k)
        assert got.shape == (int((k > 1).sum()),) and torch.equal(got, eager_on_cpu(model, (x, k)))


def test_tolist_values_are_run_time_sizes():
    """``.tolist()`` reads memory in eager (no ATen op) and is one ``.item()`` per element under
    torch.export: the capture records it as the trace makes it, so each element is a size."""
    x = torch.randn(64)
    model = MODELS.ToList()
    c = kl.compile(model, (x, torch.tensor([3, 4, 5])))
    assert len(c.ir.runtime_symbols) >= 3
    for lengths in ([3, 4, 5], [0, 0, 9], [10, 1, 1], [0, 0, 0], [30, 20, 14]):
        t = torch.tensor(lengths)
        got = c.run(x, t)
        assert got.shape == (sum(lengths),) and torch.equal(got, eager_on_cpu(model, (x, t)))
    from kernel_lens.frontends.capture import data_values as dv
    assert torch.Tensor.tolist is not dv._tolist  # torch's own again


def test_torch_equal_is_a_checked_branch_and_extra_examples_serve_both_sides():
    x = torch.randn(64)
    model = MODELS.Equal()
    same, other = (torch.tensor([1, 2]), torch.tensor([1, 2])), (torch.tensor([1, 2]), torch.tensor([1, 3]))
    alone = kl.compile(model, (x, *same))
    assert torch.equal(alone.run(x, *same), eager_on_cpu(model, (x, *same)))
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-EQUAL")):
        alone.run(x, *other)
    both = kl.compile(model, (x, *same), extra_examples=[(x, *other)])
    for a, b in [([1, 2], [1, 2]), ([1, 2], [2, 2]), ([5, 5], [5, 5]), ([7, 7], [7, 8])]:
        args = (x, torch.tensor(a), torch.tensor(b))
        assert torch.equal(both.run(*args), eager_on_cpu(model, args))
    from kernel_lens.frontends.capture import data_values as dv
    assert torch.equal is dv._EQUAL and torch.Tensor.equal is not dv._equal  # torch's own again


def test_no_node_after_a_check_runs_before_the_check_holds():
    """ONNX Runtime runs nodes in any order their inputs allow: a launch that does not read a
    check's result ran before it on the GPU (its own range check refused it; an input written
    in place would have been written). Everything after a check sits in the ``then`` body of an
    ``If`` on the check's condition; the ``else`` body is the check, which fails the call."""
    from kernel_lens.onnx.context import CHECK_OP, DOMAIN
    from kernel_lens.onnx.lower import lower_to_onnx
    c = kl.compile(MODELS.CheckedCount(), (torch.randn(64), torch.ones(64, dtype=torch.bool)))
    model = lower_to_onnx(c.ir)
    top = model.graph.node
    assert not [n for n in top if n.domain == DOMAIN] and top[-1].op_type == "If"
    gate = top[-1]
    then, other = (next(a.g for a in gate.attribute if a.name == k) for k in ("then_branch", "else_branch"))
    assert [n.op_type for n in then.node if n.domain == DOMAIN] == ["ramp"]
    assert [n.op_type for n in other.node if n.domain == DOMAIN] == [CHECK_OP]
    assert [o.name for o in model.graph.output] == ["output_0"]
    # the refused body's outputs get their shape from the check's result (ORT's If fixes an
    # output whose shape it can infer before running the body, against the bound output)
    check = next(n for n in other.node if n.domain == DOMAIN)
    made = {o: n for n in other.node for o in n.output}
    for out in other.output:
        reshape = made[out.name]
        assert reshape.op_type == "Reshape" and made[reshape.input[1]].op_type == "Tile"
        assert made[made[reshape.input[1]].input[0]].input == [check.output[0]]
    onnx_checker = __import__("onnx").checker
    onnx_checker.check_model(model, full_check=True)


def test_a_negative_item_is_refused_before_a_branch_on_it_is_checked():
    """The ``>= 0`` check of an .item() value comes before any condition on it, and gates it."""
    from kernel_lens.onnx.context import CHECK_OP, DOMAIN
    from kernel_lens.onnx.lower import lower_to_onnx
    c = kl.compile(MODELS.NegativeItem(), (torch.randn(64), torch.tensor([5, 1])))
    gate = lower_to_onnx(c.ir).graph.node[-1]
    other = next(a.g for a in gate.attribute if a.name == "else_branch")
    (check,) = [n for n in other.node if n.domain == DOMAIN and n.op_type == CHECK_OP]
    assert "is negative" in next(a.s for a in check.attribute if a.name == "message").decode()


def test_dims_of_one_name_are_one_size_and_other_ranges_are_refused():
    from torch.export import Dim
    x, off = torch.randn(100), torch.zeros(100, dtype=torch.bool)
    dims = ({0: Dim("n", min=1, max=4096)}, {0: Dim("n", min=1, max=4096)})  # two objects, one name
    c = kl.compile(MODELS.ItemBranch(), (x, off), dynamic_shapes=dims,
                   extra_examples=[(x, ~off), (torch.randn(1), torch.ones(1, dtype=torch.bool))])
    assert [p.when[0].ranges for p in c.ir.pieces] == [{"n": (1, 1)}, {"n": (2, 4096)}]
    with pytest.raises(InputError, match=r"two Dims named 'n', with ranges \[1, 4096\] and \[1, 200\]"):
        kl.compile(MODELS.ItemBranch(), (x, off),
                   dynamic_shapes=({0: Dim("n", min=1, max=4096)}, {0: Dim("n", min=1, max=200)}))


def test_a_constexpr_from_a_value_serves_the_step_of_the_example_and_refuses_others():
    """``BLOCK = next_power_of_2(max_len)`` of an .item(): the example's binary, the value
    checked to lie in its step ([17, 32] for 28) at run time; extra_examples add other steps."""
    x = torch.randn(40)
    model = MODELS.LongestSegmentBlock()
    c = kl.compile(model, (x, torch.tensor([0, 5, 12, 40])))
    (name, _), = c.ir.runtime_symbols.items()
    assert sorted(ch.cond for ch in c.ir.checks) == sorted([f"{name} >= 17", f"{name} <= 32"])
    for cu in ([0, 5, 12, 40], [0, 17, 40, 40], [0, 32, 33, 40], [0, 8, 25, 40]):
        t = torch.tensor(cu)
        assert torch.equal(c.run(x, t), eager_on_cpu(model, (x, t)))
    for cu in ([0, 1, 2, 3], [0, 40, 40, 40], [0, 16, 32, 40]):  # 1, 40 and 16: other binaries
        with pytest.raises(UntracedBranchError, match=line_of("BLOCK-FROM-VALUE") + r".*u0 in \[17, 32\]"):
            c.run(x, torch.tensor(cu))
    more = kl.compile(model, (x, torch.tensor([0, 5, 12, 40])), extra_examples=[(x, torch.tensor([0, 1, 2, 3]))])
    assert len(more.ir.branches) == 2
    for cu in ([0, 1, 2, 3], [0, 5, 12, 40], [0, 0, 1, 2]):
        t = torch.tensor(cu)
        assert torch.equal(more.run(x, t), eager_on_cpu(model, (x, t)))


def test_slices_with_bounds_from_values_get_their_lengths_from_the_ops_meta_function():
    """``x[a:b]`` with ``a, b`` from ``.tolist()``: torch names the clamped length with a new
    size that follows from the values; the slice's own meta function at the example's values
    gives it (the sums are ONNX's ReduceSum: float noise, not bits)."""
    x = torch.randn(40)
    model = MODELS.SegmentSums()
    c = kl.compile(model, (x, torch.tensor([0, 5, 12, 40])))
    for cu in ([0, 5, 12, 40], [0, 20, 20, 40], [0, 1, 39, 40], [0, 0, 0, 40]):
        t = torch.tensor(cu)
        got, want = c.run(x, t), eager_on_cpu(model, (x, t))
        assert got.shape == want.shape and torch.allclose(got, want, rtol=1e-6, atol=1e-6), (cu, got, want)


def test_a_kernel_given_a_slice_at_an_offset_from_values_is_refused_in_one_line():
    from kernel_lens.errors import TraceError
    with pytest.raises(TraceError, match="not a dimension of any graph input") as info:
        kl.compile(MODELS.SegmentLaunches(), (torch.randn(40), torch.tensor([0, 5, 12, 40])))
    assert line_of("SLICE-LAUNCH") in str(info.value) and "\n" not in str(info.value)


def test_a_derived_dim_over_another_dim_object_of_the_same_name_is_that_size():
    from torch.export import Dim
    a, b = Dim("n", min=2, max=64), Dim("n", min=2, max=64)
    c = kl.compile(MODELS.TiledSum(), (torch.randn(8), torch.randn(16)), dynamic_shapes=({0: a}, {0: 2 * b}))
    assert list(c.ir.symbols) == ["n"]
    x, y = torch.randn(5), torch.randn(10)
    assert torch.equal(c.run(x, y), eager_on_cpu(MODELS.TiledSum(), (x, y)))


def test_a_constexpr_torch_proves_constant_over_a_dynamic_dim_compiles():
    """``next_power_of_2(x.numel() // (B * S))`` is 32 for every S: one binary, no refusal."""
    from torch.export import Dim
    x = torch.randn(2, 8, 32)
    model = MODELS.RowBlock()
    c = kl.compile(model, (x,), dynamic_shapes={"x": {1: Dim("seq", min=2, max=64)}})
    (kernel,) = c.ir.kernels.values()
    assert [p.constexpr_value for p in kernel.params if p.name == "BD"] == [32]
    y = torch.randn(2, 5, 32)
    assert torch.equal(c.run(y), eager_on_cpu(model, (y,)))


def test_a_constexpr_truth_value_from_a_value_is_checked_and_extra_examples_add_the_other():
    """``IS_ONE = longest == 1`` of an .item(): the example's binary, the truth value checked at
    run time (the other one refused naming the launch's line); an extra example traces it."""
    x = torch.randn(40)
    model = MODELS.DecodeFlag()
    c = kl.compile(model, (x, torch.tensor([0, 5, 12, 40])))
    assert [p.constexpr_value for p in c.ir.kernels["shift_or_copy"].params if p.name == "IS_ONE"] == [False]
    for cu in ([0, 5, 12, 40], [0, 2, 3, 4]):
        t = torch.tensor(cu)
        assert torch.equal(c.run(x, t), eager_on_cpu(model, (x, t)))
    with pytest.raises(UntracedBranchError, match=line_of("FLAG-FROM-VALUE") + r".*'IS_ONE' = False"):
        c.run(x, torch.tensor([0, 1, 2, 3]))
    more = kl.compile(model, (x, torch.tensor([0, 5, 12, 40])), extra_examples=[(x, torch.tensor([0, 1, 2, 3]))])
    for cu in ([0, 1, 2, 3], [0, 5, 12, 40], [0, 1, 1, 2]):
        t = torch.tensor(cu)
        assert torch.equal(more.run(x, t), eager_on_cpu(model, (x, t))), cu
    assert not torch.equal(more.run(x, torch.tensor([0, 1, 2, 3])), more.run(x, torch.tensor([0, 2, 3, 4])))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_repeat_interleave_of_counts_alone_keeps_their_dtype_and_follows_them(dtype):
    """torchlib's translation compares int64 positions with int32 counts (ill-typed ONNX):
    kernel_lens's own gives index i counts[i] times in the counts' dtype, zeros and all."""
    x = torch.randn(6)
    model = MODELS.SegmentIds()
    c = kl.compile(model, (x, torch.tensor([2, 0, 3, 1, 0, 1], dtype=dtype)))
    for counts in ([2, 0, 3, 1, 0, 1], [0, 0, 0, 0, 0, 0], [5, 1, 0, 0, 0, 4], [0, 0, 0, 0, 0, 1]):
        t = torch.tensor(counts, dtype=dtype)
        got, want = c.run(x, t), eager_on_cpu(model, (x, t))
        assert got[1].dtype == dtype and all(torch.equal(a, b) for a, b in zip(got, want)), counts


def test_a_buffer_sized_by_a_value_is_dense_though_torchs_strides_read_max_1_u():
    """``torch.zeros(2, m, 4)`` with m from a value has strides (4*Max(1, m), 4, 1): dense for
    every m (at m = 0 nothing is stored), so a kernel may fill it."""
    model, x = MODELS.PaddedBuffer(), torch.ones(8)
    c = kl.compile(model, (x, torch.tensor([3, 1])))
    for count in ([3, 1], [0, 0], [5, 2], [1, 1]):
        t = torch.tensor(count)
        got = c.run(x, t)
        assert got.shape == (2, max(count), 4) and torch.equal(got, eager_on_cpu(model, (x, t)))


def test_a_dim_of_size_one_over_a_piece_has_any_stride():
    """A [4, cdiv(n, 512)] table: in the piece n <= 512 torch gives strides (1, 1), dense there
    because the dim is 1 for every n in the piece; the piece above has (cdiv, 1)."""
    from torch.export import Dim
    model = MODELS.TileTable()
    c = kl.compile(model, (torch.randn(600),), dynamic_shapes={"x": {0: Dim("n", min=2, max=4096)}})
    assert sorted(v.strides[0] for g in c.ir.graphs() for n, v in g.values.items() if "empty" in n)[0] == "1"
    for n in (2, 511, 512, 513, 1500, 4096):
        x = torch.randn(n)
        assert torch.equal(c.run(x), eager_on_cpu(model, (x,))), n
