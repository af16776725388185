"""An IR document is data (docs/security.md): what it names is never imported, and what it holds is
bounded, on its word alone. Each test reproduces a finding of the third hardening round (issue 29)
and fails without the rule it names."""

from __future__ import annotations

import sys
import textwrap

import pytest

from kernel_lens.compiler import pass_context
from kernel_lens.errors import KernelSourceError
from kernel_lens.ir import GraphIR

from conftest import EXAMPLES, model_ir


@pytest.fixture(scope="module")
def toy_ir() -> GraphIR:
    return model_ir(EXAMPLES / "toy_two_kernels.py")


def _naming(ir: GraphIR, qualname: str):
    """A kernel of ``ir`` whose source names ``qualname`` (as a document read from disk may)."""
    kernel = next(iter(ir.kernels.values())).model_copy(deep=True)
    kernel.source = kernel.source.model_copy(update={"qualname": qualname})
    return kernel


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """A module on sys.path that leaves a mark when imported."""
    mark = tmp_path / "imported"
    (tmp_path / "kl_planted_kernels.py").write_text(textwrap.dedent(f"""
        import triton
        open({str(mark)!r}, "w").write("ran")

        @triton.jit
        def kern(x):
            pass
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kl_planted_kernels", raising=False)
    return mark


def test_compiling_a_loaded_ir_imports_nothing_it_names(toy_ir, planted):
    kernel = _naming(toy_ir, "kl_planted_kernels.kern")
    compile_binary = pass_context().compile_binary
    with pytest.raises(KernelSourceError, match=r"module 'kl_planted_kernels' is not imported.*"
                                                r"import_kernels=True"):
        compile_binary(kernel, 90, kernel.specialization, False)
    assert not planted.exists() and "kl_planted_kernels" not in sys.modules


def test_a_standard_module_with_import_side_effects_is_not_imported_either(toy_ir, monkeypatch):
    monkeypatch.delitem(sys.modules, "this", raising=False)  # imports print the Zen of Python
    kernel = _naming(toy_ir, "this.kern")
    with pytest.raises(KernelSourceError, match="'this' is not imported"):
        pass_context().compile_binary(kernel, 90, kernel.specialization, False)
    assert "this" not in sys.modules


def test_the_caller_may_ask_for_the_import(toy_ir, planted):
    kernel = _naming(toy_ir, "kl_planted_kernels.kern")
    with pytest.raises(KernelSourceError, match="source changed since the IR was captured"):
        pass_context(import_kernels=True).compile_binary(kernel, 90, kernel.specialization, False)
    assert planted.read_text() == "ran"


def test_a_module_the_process_imported_is_used_without_importing(toy_ir, planted):
    import kl_planted_kernels  # noqa: F401  (the user's own import)

    planted.unlink()
    kernel = _naming(toy_ir, "kl_planted_kernels.kern")
    with pytest.raises(KernelSourceError, match="source changed since the IR was captured"):
        pass_context().compile_binary(kernel, 90, kernel.specialization, False)
    assert not planted.exists()  # found in sys.modules, not imported again


# --- what a document holds is bounded, and cross-checked at load ----------------------------------
import copy  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

from kernel_lens.errors import IRError  # noqa: E402
from kernel_lens.ir import graph as ir_graph  # noqa: E402


def _doc(ir: GraphIR) -> dict:
    return json.loads(ir.to_json())


def _refused(doc: dict, match: str) -> None:
    start = time.perf_counter()
    with pytest.raises(IRError, match=match):
        GraphIR.from_json(json.dumps(doc))
    assert time.perf_counter() - start < 5


def test_counts_past_the_limits_are_refused(toy_ir):
    doc = _doc(toy_ir)
    doc["launches"] = doc["launches"] * (ir_graph.MAX_LAUNCHES // len(doc["launches"]) + 1)
    _refused(doc, rf"launches holds {len(doc['launches'])} entries; an IR holds at most 4096")
    doc = _doc(toy_ir)
    (sym,) = doc["symbols"].values()
    doc["symbols"].update({f"q{i}": dict(sym) for i in range(ir_graph.MAX_SYMBOLS)})
    _refused(doc, "symbols holds 257 entries")


def test_an_expression_reading_too_many_sizes_or_a_huge_power_is_refused(toy_ir):
    doc = _doc(toy_ir)
    (sym,) = doc["symbols"].values()
    doc["symbols"].update({f"q{i}": dict(sym) for i in range(40)})
    doc["launches"][0]["grid"][0] = "Max(" + ", ".join(f"q{i}" for i in range(40)) + ")"
    _refused(doc, "names 41 sizes; at most 32|reads 40 sizes; at most 32")
    doc = _doc(toy_ir)
    out = doc["outputs"][0]
    doc["values"][out]["shape"] = ["n**64"]
    _refused(doc, "a size to the power 64: at most 8")
    doc["values"][out]["shape"] = ["n**2"]  # a square is a size
    GraphIR.from_json(json.dumps(doc))


def test_a_symbol_whose_range_is_empty_is_refused(toy_ir):
    doc = _doc(toy_ir)
    doc["symbols"]["n"].update(min=10, max=5)
    _refused(doc, r"its range \[10, 5\] is empty")


def test_a_launch_argument_naming_no_value_is_refused(toy_ir):
    doc = _doc(toy_ir)
    doc["launches"][0]["args"][0]["value"] = "nope"
    _refused(doc, "argument 'x_ptr' names tensor 'nope', which is not a value of the graph")


@pytest.mark.parametrize("constant, why", [(1.5, "1.5, not a i32 value"), ("7", "'7', not a i32 value"),
                                           (2 ** 40, "1099511627776, not a i32 value")])
def test_a_scalar_constant_of_the_wrong_type_is_refused(toy_ir, constant, why):
    doc = _doc(toy_ir)
    arg = next(a for a in doc["launches"][0]["args"] if a["role"] == "scalar")
    arg.update(expr=None, constant=constant)
    _refused(doc, f"scalar argument {arg['name']!r} is {why}")
    arg.update(constant=7)  # an integer of the type loads
    GraphIR.from_json(json.dumps(doc))


def test_min_and_max_over_many_sizes_parse_in_linear_time(toy_ir):
    """sympy compares every pair of a Min's symbolic arguments (a Min of 32 sums took 2.3 s): the
    grammar reads them as written, so a document full of them loads at once (issue 30, item 2)."""
    from kernel_lens.ir.symbolic import parse, symbol

    start = time.perf_counter()
    expr = parse("Min(" + ", ".join(f"q{i} + {i}" for i in range(32)) + ")")
    assert time.perf_counter() - start < 0.5
    assert expr.xreplace({symbol(f"q{i}"): 100 - i for i in range(32)}) == 100
    assert parse("Max(b, a)") == parse("Max(a, b)") and parse("Min(3, 5)") == 3
    doc = _doc(toy_ir)
    (sym,) = doc["symbols"].values()
    doc["symbols"].update({f"q{i}": dict(sym) for i in range(31)})
    doc["launches"] = [copy.deepcopy(launch) for launch in doc["launches"] * 40]
    for k, launch in enumerate(doc["launches"]):  # each spelled differently: no parse is cached
        launch["grid"][1] = "Max(" + ", ".join(f"q{i} + {k}" for i in range(31)) + ", n)"
    start = time.perf_counter()
    loaded = GraphIR.from_json(json.dumps(doc))
    assert time.perf_counter() - start < 10
    assert len({launch.grid[1] for launch in loaded.launches}) == 80


def test_text_from_a_document_cannot_drive_the_terminal(toy_ir, tmp_path, capsys):
    """summary() of a loaded IR and the CLI's error line escape control characters (issue 30,
    item 7): a qualname, file or op name holding ESC sequences prints as text."""
    from kernel_lens import cli
    from kernel_lens.summary import summarize

    doc = _doc(toy_ir)
    kernel = next(iter(doc["kernels"].values()))
    kernel["source"]["qualname"] = "m.k\x1b]0;pwned\x07"
    kernel["source"]["file"] = "/x/\x1b[2J\x1b[H.py\nfake line"
    doc["ops"][0]["op"] = "aten.\x1b[31mred.default"
    text = summarize(GraphIR.from_json(json.dumps(doc)))
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text
    assert "fake line" in next(line for line in text.splitlines() if "\\x1b[2J" in line)
    bad = tmp_path / "m\x1b[2J.py"
    assert cli.main(["dump-ir", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\\x1b[2J" in err and len(err.strip().splitlines()) == 1


def test_untyped_errors_are_one_typed_line_naming_the_field_and_the_fix(toy_ir, tmp_path, capsys):
    """issue 30, item 8: an invalid IR's first line names the field and the fix; a string scalar
    constant is an IRError (not a ValueError later); a 300-character -o is an OutputPathError."""
    from kernel_lens import cli

    doc = _doc(toy_ir)
    arg = next(a for a in doc["launches"][0]["args"] if a["role"] == "scalar")
    arg.update(expr=None, constant="seven")
    with pytest.raises(IRError) as info:
        GraphIR.from_json(json.dumps(doc))
    first = str(info.value).splitlines()[0]
    assert "'seven', not a i32 value" in first and "regenerate it" in first
    doc = _doc(toy_ir)
    doc["symbols"]["n"]["min"] = "lots"
    with pytest.raises(IRError, match=r"^IR document is invalid at symbols\.n\.min: .*regenerate it"):
        GraphIR.from_json(json.dumps(doc))
    assert cli.main(["compile", str(EXAMPLES / "toy_two_kernels.py"), "-o", str(tmp_path / ("a" * 300))]) == 2
    err = capsys.readouterr().err
    assert "error: OutputPathError:" in err and "File name too long" in err and "internal" not in err
