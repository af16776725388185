"""``kernel_lens verify`` on a host without a GPU (issue 27 item 4): the size sets drawn from the
declared ranges, the call signature against the eager run through Triton's interpreter, a
mismatch reported as a failure, and what could not be checked said in the report. (On a GPU the
same code also compares values and times both; that path has not been run yet.)"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from kernel_lens.verify import size_sets, verify

from conftest import CORPUS, EXAMPLES, load_module, model_ir
from kernel_lens.compiler import CompiledModel

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-host report")


def test_size_sets_are_the_example_then_each_size_at_its_edges_and_an_odd_size():
    ir = model_ir(CORPUS / "size_branches.py")
    sets = size_sets(ir, cap=4096)
    assert sets[0] == {s: info.example for s, info in ir.symbols.items()}
    lows, odds, highs = sets[1], sets[2], sets[3]
    for s, info in ir.symbols.items():
        assert lows[s] == info.min and highs[s] == min(info.max, 4096)
        assert odds[s] % 2 == 1 and info.min < odds[s] < highs[s]


def test_the_cli_reports_every_size_set_and_what_it_could_not_check():
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "-q", "verify",
                           str(CORPUS / "size_branches.py")], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # the example, min, odd and max, then both ends of each of the 6 pieces not among those
    assert out.count("[ok] ") == 14 and "(piece 0)" in out and "rows=2, n=2" in out
    assert out.count("max abs ") == 14 * 3 and "values not compared" not in out  # values, on a CPU
    assert "rows=48, n=65 (piece 3)" in out and "rows=47, n=64 (piece 0)" in out
    assert "not checked: the compiled kernels (cubins) and timings" in out
    assert out.rstrip().endswith("result: ok")


def test_a_compiled_model_that_does_not_fit_the_eager_one_fails():
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = CompiledModel(model_ir(EXAMPLES / "toy_two_kernels.py"))

    def shorter(x, y):  # the same kernels, one output element fewer
        return module.model(x, y)[:-1]
    report = verify(shorter, module.example_inputs, module.dynamic_shapes, compiled, ["x", "y"])
    assert not report.ok and "result: FAILED" in report.text()
    assert all(o.problem.startswith("eager gives [") for s in report.sets for o in s.outputs)


def test_a_launch_result_is_compared_as_the_kernel_argument_saw_it():
    # the compiled node's output is the whole root; eager's argument may be a strided view of it
    from kernel_lens.verify_launches import compare_written

    root = torch.arange(24, dtype=torch.float32)
    view = root.view(4, 6)[1:, ::2]  # offset 6, strides (6, 2)
    same = compare_written("out_ptr", root.clone(), view)
    assert same.exact and same.max_abs == 0.0 and not same.problem
    changed = root.clone()
    changed[8] += 0.5  # inside the view (row 1, column 2)
    diff = compare_written("out_ptr", changed, view)
    assert diff.exact is False and diff.max_abs == 0.5
    outside = root.clone()
    outside[7] = -1.0  # a column the view skips: not the argument's business
    assert compare_written("out_ptr", outside, view).exact
    nan = root.clone()
    nan[6] = float("nan")
    assert compare_written("out_ptr", nan, view).max_abs == float("inf")
    assert "laid out unlike" in compare_written("out_ptr", root[:10], view).problem
    assert "laid out unlike" in compare_written("out_ptr", root.double(), view).problem
    assert "not a plain tensor" in compare_written("out_ptr", None, view).problem
    assert compare_written("out_ptr", root, torch.empty(0)).exact


def test_a_wrong_constant_planted_in_one_piece_fails_verify_by_value(tmp_path):
    """Issue 38: on a CPU host verify compares values (the compiled graph evaluated on the CPU):
    a piece whose kernel scales by 2.5 instead of 2.0 fails exactly at that piece's sizes, and
    the CLI exits non-zero."""
    module = load_module(CORPUS / "size_branches.py")
    ir = model_ir(CORPUS / "size_branches.py").model_copy(deep=True)
    planted = [k for k, p in enumerate(ir.pieces) if p.when[0].ranges.get("rows") == (48, 48)]
    assert planted, [p.when for p in ir.pieces]
    for k in planted:
        graph = ir.pieces[k].graph
        launch = next(l for l in graph.launches if graph.kernels[l.kernel].name == "scale_rows_kernel")
        next(a for a in launch.args if a.name == "scale").constant = 2.5
    compiled = CompiledModel(ir)
    report = verify(module.model, module.example_inputs, module.dynamic_shapes, compiled, ["x", "v"],
                    cap=64)
    failed = [s for s in report.sets if not s.ok]
    assert failed and all(s.piece in planted and s.sizes["rows"] == 48 for s in failed)
    assert all(s.ok for s in report.sets if s.piece not in planted)
    bad = next(o for o in failed[0].outputs if o.problem)
    assert bad.max_abs > 0.1 and "tolerance" in bad.problem
    compiled.write(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "-q", "verify", "--max-size", "64",
                           str(CORPUS / "size_branches.py"), str(tmp_path)],
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 1, proc.stderr
    assert "[FAIL] rows=48" in proc.stdout and proc.stdout.rstrip().endswith("result: FAILED")


def test_the_byte_comparison_is_bitwise():
    """Issue 39 item 11: identical NaN bits are equal, another NaN payload is not, -0.0 is not +0.0."""
    from kernel_lens.verify_launches import compare_written, same_bytes

    nan = torch.tensor([1.0, float("nan"), 3.0])
    assert same_bytes(nan, nan.clone())
    other_nan = nan.clone()
    other_nan.view(torch.int32)[1] ^= 1  # another NaN payload
    assert torch.isnan(other_nan[1]) and not same_bytes(nan, other_nan)
    assert not same_bytes(torch.tensor([-0.0]), torch.tensor([0.0]))
    assert torch.tensor([-0.0]) == torch.tensor([0.0])  # (equal as numbers)
    assert compare_written("out_ptr", nan.clone(), nan.clone()).exact
    assert compare_written("out_ptr", torch.tensor([0.0]), torch.tensor([-0.0])).exact is False


def test_a_node_output_shorter_than_the_argument_is_refused_at_the_boundary():
    """Issue 39 item 12: the view reaches element 22 of the root (offset 6, strides (6, 2), shape
    (3, 3)): a root of 23 elements holds it; one of 22 is refused, not read past its end."""
    from kernel_lens.verify_launches import compare_written

    root = torch.arange(24, dtype=torch.float32)
    view = root.view(4, 6)[1:, ::2]
    assert compare_written("out_ptr", root[:23].clone(), view).exact
    assert "laid out unlike" in compare_written("out_ptr", root[:22].clone(), view).problem


def test_no_size_past_the_cap_whatever_the_ranges_and_pieces_say():
    """Issue 42 item 4: a piece or range starting above the cap gets no point (and a note); every
    point but the example lies within the cap."""
    from kernel_lens.verify import above_cap

    ir = model_ir(CORPUS / "size_branches.py")
    example = {s: info.example for s, info in ir.symbols.items()}
    sets = size_sets(ir, cap=50)
    assert sets[0] == example and len(sets) == 8  # min, odd, max, and the ends of pieces 0, 2, 4
    assert all(v <= 50 for point in sets[1:] for s, v in point.items() if v != example[s])
    assert {point["rows"] for point in sets[1:]} == {2, 27, 47, 48, 49, 50} and \
        {point["n"] for point in sets[1:]} <= {2, 27, 50, 64, example["n"]}
    assert above_cap(ir, 50) == [f"size piece {k}: it starts at n=65, above the cap 50 (--max-size)"
                                 for k in (1, 3, 5)]


def test_verify_of_a_folder_claiming_huge_sizes_allocates_nothing_past_the_cap(monkeypatch):
    """Issue 42 item 4: the sizes verify makes inputs for come from the model file's examples and
    the cap, never from the folder's word (its example or minimum)."""
    import json

    import kernel_lens.verify as kl_verify
    from kernel_lens.ir import GraphIR

    module = load_module(EXAMPLES / "toy_two_kernels.py")
    doc = json.loads(model_ir(EXAMPLES / "toy_two_kernels.py").to_json())
    (name,) = doc["symbols"]
    doc["symbols"][name].update(example=2 ** 40, min=2 ** 30, max=None)
    compiled = CompiledModel(GraphIR.from_json(json.dumps(doc)))
    asked = []
    real = kl_verify.inputs_at

    def recording(ir, example, spec, names, sizes):
        asked.append(dict(sizes))
        return real(ir, example, spec, names, sizes)
    monkeypatch.setattr(kl_verify, "inputs_at", recording)
    report = verify(module.model, module.example_inputs, module.dynamic_shapes, compiled, ["x", "y"], cap=64)
    example = module.example_inputs[0].shape[0]
    assert asked == [{name: example}]  # the model file's example size, and nothing else
    assert not report.ok and f"its range starts at {2 ** 30}, above the cap 64" in report.text()


def test_a_difference_where_the_model_runs_its_own_kernels_names_them_and_the_way_out():
    """-O2 puts kernel_lens's own GEMM where eager runs F.linear: a value difference says so (on a
    GPU the sums differ in order); a model without own kernels gets no such words."""
    import kernel_lens as kl
    from kernel_lens.verify import own_kernels_note

    class Linear(torch.nn.Module):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.lin = torch.nn.Linear(64, 32).half()

        def forward(self, x):
            return self.lin(x)
    model, x = Linear(), torch.randn(2, 64).half()
    ir = kl.compile(model, (x,), optimize=2, arch=90).ir.model_copy(deep=True)
    (name, weight), = [(n, c) for n, c in ir.constants.items() if c.shape == [32, 64]]
    ir.constants[name] = weight.model_copy(update={"data": bytes(len(weight.data))})  # all zeros
    report = verify(model, (x,), None, CompiledModel(ir), ["x"])
    (bad,) = [o for s in report.sets for o in s.outputs]
    assert bad.problem.startswith("not within") and "own kernels (_skinny_gemm: optimize=2)" in bad.problem
    assert "--opt-level 1" in bad.problem
    assert own_kernels_note(model_ir(EXAMPLES / "toy_two_kernels.py")) == ""


def test_a_cpu_report_names_each_output_and_says_how_its_values_were_compared():
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = CompiledModel(model_ir(EXAMPLES / "toy_two_kernels.py"))
    report = verify(module.model, module.example_inputs, module.dynamic_shapes, compiled, ["x", "y"])
    assert report.ok and all([o.name for o in s.outputs] == compiled.ir.outputs for s in report.sets)
    text = report.text()
    assert f"      {compiled.ir.outputs[0]} [1000] float32: max abs 0, max rel 0, bit-exact" in text
    assert ("not checked: the compiled kernels (cubins) and timings: values were compared by evaluating "
            "the compiled graph on the CPU, each launch in Triton's interpreter; run verify on a GPU "
            "for the binaries themselves") in text


def test_nan_in_the_same_places_passes_a_tolerance_and_a_nan_for_a_number_does_not():
    from kernel_lens.verify import _judged

    want = torch.tensor([float("nan"), 1.0, 2.0])
    near = torch.tensor([float("nan"), 1.0 + 1e-6, 2.0])
    within = _judged("y", near, want, (1e-5, 1e-5))
    assert not within.problem and 0 < within.max_abs < 1e-5 and within.max_rel < 1e-5  # NaN = NaN: 0 apart
    assert _judged("y", near, want, None).problem.startswith("not bit-exact")
    number = _judged("y", torch.tensor([0.0, 1.0, 2.0]), want, (1e-5, 1e-5))
    assert "not within the tolerance" in number.problem and number.max_abs == number.max_rel == float("inf")
    exact = _judged("y", want.clone(), want, None)
    assert exact.exact and not exact.problem and exact.max_abs == exact.max_rel == 0.0
    half = _judged("y", torch.tensor([2.0, float("nan")]), torch.tensor([4.0, float("nan")]), None)
    assert (half.max_abs, half.max_rel) == (2.0, 0.5)  # relative to eager's value
    inf = torch.tensor([float("inf"), -1.0])
    assert _judged("y", inf.clone(), inf, None).max_abs == 0.0  # the same infinity


def test_a_launch_result_with_nan_where_eager_has_nan_differs_by_nothing():
    from kernel_lens.verify_launches import compare_written

    want = torch.tensor([float("nan"), 1.0, float("-inf")])
    assert compare_written("out_ptr", want.clone(), want).max_abs == 0.0
    assert compare_written("out_ptr", torch.tensor([0.0, 1.0, float("-inf")]), want).max_abs == float("inf")
    assert compare_written("out_ptr", torch.tensor([float("nan"), 1.5, float("-inf")]), want).max_abs == 0.5
