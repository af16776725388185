"""Untrusted IR and artifact folders run nothing; names cannot escape or inject; bad input gets
a typed error (issue: hardening). Every test here fails if the protection it names is removed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sympy
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.errors import (ArchError, ArtifactError, InputError, IRError,
                                ModelFileError, OutputPathError, PassError, SymbolicError)
from kernel_lens.fileio import atomic_write, inside
from kernel_lens.ir import GraphIR, format_expr, parse, symbol
from kernel_lens.ir.names import safe_identifier
from kernel_lens.ir.symbolic import MAX_SIZE_EXPONENT, PATTERN

from conftest import EXAMPLES, ROOT, load_module, reseal_manifest

toy = load_module(EXAMPLES / "toy_two_kernels.py")


@pytest.fixture(scope="module")
def toy_compiled(tmp_path_factory):
    out = tmp_path_factory.mktemp("toy") / "out"
    return kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                      output_dir=out), out


# --- 1. the expression grammar ---------------------------------------------------------------
n, m = symbol("n"), symbol("m")
leaf = st.one_of(st.sampled_from([n, m]), st.integers(-(2 ** 40), 2 ** 40).map(sympy.Integer))
ints = st.recursive(leaf, lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] - t[1]),
    st.tuples(inner, st.integers(1, 4)).map(lambda t: t[0] ** t[1]),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.floor(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.ceiling(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.Mod(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Min(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Max(t[0], t[1])),
), max_leaves=8)
exprs = st.one_of(
    ints,
    st.tuples(ints, ints).map(lambda t: sympy.Eq(t[0], t[1])),
    st.tuples(ints, ints).map(lambda t: sympy.Lt(t[0], t[1])),
    st.tuples(ints, ints, ints).map(lambda t: sympy.And(t[0] >= t[1], sympy.Ne(t[1], t[2]))),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(expr=exprs, nv=st.integers(0, 10 ** 6), mv=st.integers(0, 10 ** 6))
def test_random_expressions_round_trip_exactly(expr, nv, mv):
    text = format_expr(expr)
    assert re.match(PATTERN, text)
    assume(all(p.exp <= MAX_SIZE_EXPONENT for p in sympy.sympify(expr).atoms(sympy.Pow)
               if p.base.free_symbols))  # (n**3)**3 is outside the IR grammar
    back = parse(text)
    # Exact: the same value everywhere, and what kernel_lens writes reads back to itself.
    values = {"n": sympy.Integer(nv), "m": sympy.Integer(mv)}
    assert sympy.simplify(back.xreplace({n: values["n"], m: values["m"]})
                          - expr.xreplace({n: values["n"], m: values["m"]})) == 0 \
        if not isinstance(expr, sympy.logic.boolalg.Boolean) else \
        bool(back.xreplace({n: values["n"], m: values["m"]})) == bool(expr.xreplace({n: values["n"], m: values["m"]}))
    assert parse(format_expr(back)) == back
    assert format_expr(parse(format_expr(back))) == format_expr(back)


def test_boolean_guards_round_trip():
    for expr in [sympy.And(sympy.Eq(sympy.Mod(n, 16), 0), n >= 1), sympy.Or(n < 3, sympy.Ne(m, 0)),
                 sympy.Not(sympy.And(n > 1, m > 1)), sympy.true, sympy.false]:
        assert parse(format_expr(expr)) == expr


SENTINEL = Path(os.environ.get("TMPDIR", "/tmp")) / f"kl_pwned_{os.getpid()}"
ADVERSARIAL = [
    f"(__import__('os').system('touch {SENTINEL}'), 300)[1]",
    f"__import__('os').system('touch {SENTINEL}')",
    "lambda: 1", "(lambda x: x)(1)", "n.__class__", "n.__class__.__mro__", "__builtins__",
    "globals()", "eval('1')", "exec('1')", "open('/etc/passwd')", "getattr(n, 'x')",
    "n[0]", "[n]", "(n, m)", "{n: 1}", "{n}", "n if m else 1", "n and m", "not n",
    "2**10**10", "10**100000", "n**n", "n**1000", "(2**64)**64", "9" * 1300, "1.5", "1e9", "'s'",
    "b'x'", "None", "...", "f'{n}'", "n @ m", "n << 2", "n ^ m", "x := 3", "n; m", "n\nm",
    "oo", "zoo", "nan", "pi", "E", "I", "S", "Symbol('x')", "sympify('1')", "Integer(1)",
    "Mod(n)", "Min(n)", "floor(n, m)", "floor(x=n)", "Min(*[n, m])", "n < m < 3",
    "Mod(n, 0)", "n // 0", "n / 0", "0 ** -1", "_n", "__n__", "(" * 500 + "n" + ")" * 500,
    "n +" * 3000 + "n", "", "   ",
]


@pytest.mark.parametrize("text", ADVERSARIAL, ids=range(len(ADVERSARIAL)))
def test_adversarial_strings_are_refused_and_never_run(text):
    with pytest.raises(SymbolicError):
        parse(text)
    assert not SENTINEL.exists()


@settings(max_examples=500, deadline=None)
@given(text=st.text(alphabet=st.characters(codec="ascii"), max_size=60))
def test_random_text_is_refused_or_parses_to_a_fixed_point(text):
    try:
        expr = parse(text)
    except SymbolicError:
        return
    assert parse(format_expr(expr)) == expr


def test_parser_never_calls_sympify(monkeypatch):
    real = sympy.sympify

    def boom(a, *rest, **k):  # sympy calls sympify on its own objects; never on text
        if isinstance(a, str):
            raise AssertionError("sympify called on a string")
        return real(a, *rest, **k)

    monkeypatch.setattr(sympy, "sympify", boom)
    monkeypatch.setattr(sys.modules["sympy.core.sympify"], "sympify", boom)
    from kernel_lens.ir.symbolic import _parse

    _parse.cache_clear()
    assert parse("floor((n + 255)/256) + Mod(m, 16)") == sympy.floor((n + 255) / 256) + sympy.Mod(m, 16)


def test_schema_publishes_the_grammar_as_a_pattern():
    schema = json.dumps(kl.GraphIR.model_json_schema())
    assert json.dumps(PATTERN)[1:-1] in schema


def _tamper(ir_json: str, shape_text: str) -> str:
    doc = json.loads(ir_json)
    first = next(iter(doc["values"]))
    doc["values"][first]["shape"][0] = shape_text
    return json.dumps(doc)


def test_malicious_ir_json_runs_nothing(toy_compiled, tmp_path):
    compiled, out = toy_compiled
    evil = f"(__import__('os').system('touch {SENTINEL}'), 300)[1]"
    text = _tamper(compiled.ir.to_json(), evil)
    with pytest.raises(IRError, match="pattern|IR grammar"):
        GraphIR.from_json(text)
    with pytest.raises(Exception, match="pattern|IR grammar"):
        GraphIR.model_validate_json(text)
    # Past the character pattern, the grammar itself refuses what would run.
    with pytest.raises(IRError, match="IR grammar"):
        GraphIR.from_json(_tamper(compiled.ir.to_json(), "getattr(n, n)"))
    # The same document inside an artifact folder: load() refuses it, running nothing.
    folder = tmp_path / "copied"
    folder.mkdir()
    for p in out.iterdir():
        if p.is_file():
            (folder / p.name).write_bytes(p.read_bytes())
    (folder / f"{compiled.ir.name}.ir.json").write_text(text)
    reseal_manifest(folder)  # as the document's author would: past the sha256 check
    with pytest.raises(ArtifactError, match="pattern|IR grammar"):
        kl.load(folder)
    assert not SENTINEL.exists()


# --- 2. names ----------------------------------------------------------------------------------
def test_safe_identifier():
    assert safe_identifier("../../escaped") == "escaped"
    assert safe_identifier("a\n__attribute__((constructor)) void f()") == "a_attribute_constructor_void_f"
    assert safe_identifier("9lives") == "model_9lives"
    assert safe_identifier("///") == "model"


@pytest.mark.parametrize("field,value", [
    ("name", "../../escaped"), ("name", "x\n__attribute__((constructor))"), ("name", "a b"),
])
def test_ir_refuses_unsafe_graph_names(toy_compiled, field, value):
    doc = json.loads(toy_compiled[0].ir.to_json())
    doc[field] = value
    with pytest.raises(IRError):
        GraphIR.from_json(json.dumps(doc))


def test_ir_refuses_unsafe_kernel_ids_param_names_entry_names_and_c_types(toy_compiled):
    base = json.loads(toy_compiled[0].ir.to_json())
    kid = next(iter(base["kernels"]))

    def variant(edit):
        doc = json.loads(json.dumps(base))
        edit(doc)
        with pytest.raises(IRError):
            GraphIR.from_json(json.dumps(doc))

    variant(lambda d: d["kernels"][kid].__setitem__("id", 'k"); system("x'))
    variant(lambda d: d["kernels"][kid]["params"][0].__setitem__("name", "x;\n"))
    variant(lambda d: d["kernels"][kid]["binaries"][0].__setitem__("entry_name", 'e"+"'))
    variant(lambda d: d["kernels"][kid]["binaries"][0]["abi"][0].__setitem__("c_type", "int; evil()"))
    variant(lambda d: d["launches"][0]["args"][0].__setitem__("name", "a-b"))
    variant(lambda d: d["symbols"].__setitem__("pi", d["symbols"][next(iter(d["symbols"]))]))


def _evil_model():
    name = "../../escaped\n__attribute__((constructor)) static void pwn() { __builtin_trap(); }"
    cls = type(name, (toy.ToyModel,), {})
    return cls()


def test_model_name_becomes_a_safe_identifier_and_reaches_no_cpp(tmp_path):
    from kernel_lens.targets.ort.target import ort_sources

    out = tmp_path / "a" / "b" / "out"
    compiled = kl.compile(_evil_model(), toy.example_inputs, dynamic_shapes=toy.dynamic_shapes,
                          arch=90, output_dir=out)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", compiled.ir.name)
    assert compiled.ir.display_name.startswith("../../escaped")
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file())
    assert written and all(str(p).startswith("a/b/out/") for p in written), written
    sources = "\n".join(ort_sources(compiled.ir, 29).values())
    assert "__attribute__((constructor))" not in sources and "escaped" not in sources
    for line in sources.splitlines():  # no user text in comments: only kernel ids / fixed text
        assert "pwn" not in line


def test_c_quote_escapes_everything_that_could_end_a_literal():
    from kernel_lens.targets.common.emit import c_quote

    q = c_quote('a"b\\c\nd??=\x00é')
    assert q == '"a\\"b\\\\c\\012d\\?\\?=\\000\\303\\251"'
    assert "\n" not in q


def test_pass_names_cannot_escape_the_dump_folder():
    class Evil(kl.Pass):
        name = "../../evil"
        requires = frozenset()
        provides = frozenset()

        def run(self, ir, ctx):
            raise AssertionError

    with pytest.raises(PassError, match="pass name"):
        kl.default_pipeline().add(Evil())


def test_inside_refuses_paths_outside(tmp_path):
    for bad in ["../x", "/etc/passwd", "a/../../x", ""]:
        with pytest.raises(OutputPathError):
            inside(tmp_path, bad)
    os.symlink("/", tmp_path / "root")
    with pytest.raises(OutputPathError):
        inside(tmp_path, "root/x")
    assert inside(tmp_path, "ok.txt") == tmp_path / "ok.txt"


# --- 3. writes -----------------------------------------------------------------------------------
def test_atomic_write_replaces_a_link_instead_of_writing_through_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "out.txt"
    os.symlink(victim, link)
    atomic_write(link, "new")
    assert victim.read_text() == "precious"
    assert not link.is_symlink() and link.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_compile_never_writes_through_planted_links(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ["ToyModel.ir.json", "ToyModel.summary.txt", "kernel_lens.json",
                 "ToyModel.ir.json.tmp", "ToyModel.onnx"]:
        victim = tmp_path / f"victim_{name}"
        victim.write_text("precious")
        os.symlink(victim, out / name)
        victims[name] = victim
    kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
               output_dir=out)
    for name, victim in victims.items():
        assert victim.read_text() == "precious", name
    for name in ["ToyModel.ir.json", "ToyModel.summary.txt", "kernel_lens.json"]:
        assert not (out / name).is_symlink() and (out / name).stat().st_size > 0


def test_output_that_is_a_file_is_refused_before_any_work(tmp_path, monkeypatch):
    target = tmp_path / "a_file"
    target.write_text("x")
    import kernel_lens.compiler as compiler

    monkeypatch.setattr(compiler, "lift_with_outputs",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("front half ran")))
    with pytest.raises(OutputPathError, match="not a folder"):
        kl.compile(toy.model, toy.example_inputs, output_dir=target)
    assert target.read_text() == "x"


# --- 4. loading ----------------------------------------------------------------------------------
def _copy_folder(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("path", ["/etc/passwd", "../outside.json", "sub/../ToyModel.ir.json",
                                  "./ToyModel.ir.json", "", 7])
def test_load_accepts_only_normalized_relative_manifest_paths(toy_compiled, tmp_path, path):
    folder = _copy_folder(toy_compiled[1], tmp_path / "f")
    (tmp_path / "outside.json").write_text(toy_compiled[0].ir.to_json())
    manifest = json.loads((folder / "kernel_lens.json").read_text())
    manifest["artifacts"]["ir"] = path
    (folder / "kernel_lens.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="kernel_lens.json"):
        kl.load(folder)


def test_load_refuses_links_leading_out_of_the_folder(toy_compiled, tmp_path):
    folder = _copy_folder(toy_compiled[1], tmp_path / "f")
    outside = tmp_path / "elsewhere.json"
    outside.write_text(toy_compiled[0].ir.to_json())
    (folder / "ToyModel.ir.json").unlink()
    os.symlink(outside, folder / "ToyModel.ir.json")
    with pytest.raises(ArtifactError, match="outside"):
        kl.load(folder)


@pytest.mark.parametrize("text", ["{not json", "[]", '{"artifacts": 3}', '{"name": "x"}'])
def test_malformed_manifest_is_a_typed_error_naming_the_file(toy_compiled, tmp_path, text):
    folder = _copy_folder(toy_compiled[1], tmp_path / "f")
    (folder / "kernel_lens.json").write_text(text)
    with pytest.raises(ArtifactError, match="kernel_lens.json"):
        kl.load(folder)


def test_load_round_trips_a_good_folder(toy_compiled):
    loaded = kl.load(toy_compiled[1])
    assert loaded.ir == toy_compiled[0].ir


# --- 6. typed errors, fast -------------------------------------------------------------------------
def test_non_tensor_example_inputs():
    with pytest.raises(InputError, match=r"example_inputs\[1\] is a int"):
        kl.compile(toy.model, (toy.example_inputs[0], 3))
    with pytest.raises(InputError, match="empty"):
        kl.compile(toy.model, ())


@pytest.mark.parametrize("arch", [0, 1, 42, 91, -90, True, "90"])
def test_unknown_arch_is_refused_listing_the_valid_ones(arch):
    with pytest.raises(ArchError, match="sm_90"):
        kl.compile(toy.model, toy.example_inputs, arch=arch)


def test_invalid_role_value():
    with pytest.raises(InputError, match="'sideways' is not a role"):
        kl.compile(toy.model, toy.example_inputs, roles={"add_kernel": {"x_ptr": "sideways"}})


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kernel_lens.cli", *args], capture_output=True,
                          text=True, timeout=600, env=env)


def test_cli_errors_exit_2_without_traceback_unless_debug(tmp_path):
    bad = tmp_path / "bad_inputs.py"
    bad.write_text("import torch\nmodel = torch.nn.Identity()\n"
                   "def example_inputs():\n    raise RuntimeError('no data here')\n")
    proc = _cli("dump-ir", str(bad))
    assert proc.returncode == 2
    assert proc.stderr.startswith("kernel_lens: error:") and "no data here" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _cli("--debug", "dump-ir", str(bad))
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "ModelFileError" in proc.stderr


@pytest.mark.parametrize("arch", ["0", "sm_42", "banana", "sm_91"])
def test_cli_arch_refused_before_any_work(arch):
    proc = _cli("compile", str(EXAMPLES / "toy_two_kernels.py"), "--arch", arch)
    assert proc.returncode == 2 and proc.stderr.startswith("kernel_lens: error:")
    assert "sm_90" in proc.stderr and "Traceback" not in proc.stderr


def test_cli_output_file_refused_before_any_work(tmp_path):
    target = tmp_path / "file"
    target.write_text("x")
    proc = _cli("compile", str(EXAMPLES / "toy_two_kernels.py"), "-o", str(target))
    assert proc.returncode == 2 and "not a folder" in proc.stderr
    assert target.read_text() == "x"


def test_a_data_dependent_grid_dumps_its_run_time_size_quietly(tmp_path):
    model = tmp_path / "dd.py"
    model.write_text(f"import sys\nsys.path.insert(0, {str(ROOT / 'tests' / 'models')!r})\n"
                     "import torch\nfrom bad_kernels import ValueDependentGrid\n"
                     "model = ValueDependentGrid()\nexample_inputs = (torch.randn(100),)\n")
    proc = _cli("dump-ir", str(model))
    assert proc.returncode == 0, proc.stderr
    assert "def forward" not in proc.stderr + proc.stdout  # torch's graph dump stays quiet
    assert "run-time size u0 = " in proc.stdout and "grid=((u0)//16 + 1, 1, 1)" in proc.stdout
    assert "bad_kernels.py:" in proc.stdout and "run-time check" not in proc.stdout  # int(): a size


def test_model_file_errors_are_typed(tmp_path):
    from kernel_lens.model_file import load_model_file

    bad = tmp_path / "m.py"
    bad.write_text("model = 1\ndef example_inputs():\n    raise ValueError('boom')\n")
    with pytest.raises(ModelFileError, match="boom"):
        load_model_file(bad)
