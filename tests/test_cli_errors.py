"""Issue 18, second round: the command line and ``doctor`` as an attacker meets them.

Items 4 (doctor's probes run isolated), 8 (no tracebacks: forward raising, deeply nested
--roles, a model file named like a standard-library module) and 17 (--autotune naming an unknown
kernel, ``-o ''``, one-line errors with the details under --debug). The CLI runs in-process
(``cli.main``) except where the test is about a child process. Every test fails if the
protection it names is removed.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
import sys
from pathlib import Path

import pytest

import kernel_lens as kl
from kernel_lens import _gc, cli, doctor
from kernel_lens.errors import BuildError
from kernel_lens.model_file import load_model_file

from conftest import CORPUS, EXAMPLES, reseal_manifest

TOY = str(EXAMPLES / "toy_two_kernels.py")


@pytest.fixture
def run(capsys, monkeypatch):
    """``kernel_lens ARGS`` in this process: (exit status, stdout, stderr)."""
    monkeypatch.setattr(_gc, "FREEZE", _gc.FREEZE)  # main() sets it for its own process
    levels = {n: logging.getLogger(n).level for n in
              ("kernel_lens", "kernel_lens.toolchain.build", "kernel_lens.frontends.aot",
               "kernel_lens.compiler")}

    def call(*args: str) -> tuple[int, str, str]:
        capsys.readouterr()
        status = cli.main(["-q", *args])  # errors only: the progress lines are test_cli's
        out, err = capsys.readouterr()
        return status, out, err

    yield call
    for name, level in levels.items():
        logging.getLogger(name).setLevel(level)


def one_line_error(status: int, err: str, *kinds: str) -> str:
    lines = [l for l in err.splitlines() if l.startswith("kernel_lens:")]
    assert status == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(tuple(f"kernel_lens: error: {k}: " for k in kinds)), err
    return lines[0]


# --- item 4: doctor's probes run isolated from the caller's folder ------------------------------

def _plant_python(folder: Path, marker: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("onnx", "onnxruntime"):
        (folder / f"{name}.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + ' ran from ' + __file__ + '\\n')\n")


def test_doctor_ort_probe_imports_nothing_from_the_callers_folder(tmp_path, monkeypatch):
    """The CUDA EP check is a `python -c` child: it must not put the current folder (or
    PYTHONPATH) on sys.path, where a planted onnx.py would run."""
    marker = tmp_path / "planted_code_ran"
    _plant_python(tmp_path / "cwd", marker)
    _plant_python(tmp_path / "pythonpath", marker)
    monkeypatch.chdir(tmp_path / "cwd")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "pythonpath"))
    result = doctor._ort_cuda_ep()
    assert not marker.exists(), marker.read_text()
    assert isinstance(result, str) and result


def test_doctor_tool_probes_run_in_a_fresh_folder(tmp_path, monkeypatch):
    """A relative PATH entry ('.') would make `ptxas` resolve to ./ptxas: tools are looked up over
    PATH's absolute entries only, and the probe runs in an empty temporary folder, so the
    caller's ./ptxas is never executed."""
    marker = tmp_path / "planted_ptxas_ran"
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    planted = cwd / "ptxas"
    planted.write_text(f"#!/bin/sh\necho ran >> {marker}\necho 'Cuda compilation tools, "
                       f"release 99.9'\n")
    planted.chmod(planted.stat().st_mode | stat.S_IXUSR)
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("PATH", "." + os.pathsep + os.environ.get("PATH", ""))
    lines = dict(doctor._cuda_toolkit())
    assert not lines["ptxas"].startswith(("./", "ptxas:")), lines
    assert "99.9" not in lines["ptxas"] and not marker.exists()


# --- item 8: no tracebacks -----------------------------------------------------------------------

def test_forward_that_raises_is_one_capture_error_line(tmp_path, run):
    model = tmp_path / "raises_in_forward.py"
    model.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x):\n"
                     "        raise ValueError('forward exploded')\n"
                     "model = M()\nexample_inputs = (torch.randn(4),)\n")
    for command in (["dump-ir", str(model)], ["compile", str(model), "-o", str(tmp_path / "o")]):
        line = one_line_error(*run(*command)[::2], "CaptureError")
        assert "forward exploded" in line and "raises_in_forward.py:4" in line
    assert not (tmp_path / "o").exists()


def test_a_size_the_model_fixes_is_refused_naming_the_line_that_fixes_it(tmp_path, run):
    """Issue 43 item 1: "the model's code fixes the size" names the line torch recorded."""
    model = tmp_path / "fixes_size.py"
    model.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\nimport torch\n"
                     "from toy_two_kernels import ToyModel\n"
                     "class M(ToyModel):\n    def forward(self, x, y):\n"
                     "        if x.shape[0] == 1000:\n            y = y + 1\n"
                     "        return super().forward(x, y)\n"
                     "model = M()\nexample_inputs = (torch.randn(1000), torch.randn(1000))\n"
                     "n = torch.export.Dim('n', min=2, max=4096)\n"
                     "dynamic_shapes = {'x': {0: n}, 'y': {0: n}}\n")
    line = one_line_error(*run("dump-ir", str(model))[::2], "TraceError", "SizeBranchError")
    assert f"at {model}:7 fixes it to the example's size" in line, line


def test_a_bf16_kernel_the_interpreter_cannot_run_names_its_line_and_the_way_past_it(tmp_path, run):
    """Issue 43 item 1: never a bare AttributeError from Triton's CPU interpreter."""
    model = tmp_path / "bf16_kernel.py"
    model.write_text("import torch, triton, triton.language as tl\n"
                     "@triton.jit\ndef k(x_ptr, y_ptr, B: tl.constexpr):\n"
                     "    o = tl.arange(0, B)\n"
                     "    tl.store(y_ptr + o, tl.load(x_ptr + o) * 2)\n"
                     "class M(torch.nn.Module):\n    def forward(self, x):\n"
                     "        y = torch.empty_like(x)\n        k[(1,)](x, y, B=16)\n        return y\n"
                     "model = M()\nexample_inputs = (torch.randn(16, dtype=torch.bfloat16),)\n")
    line = one_line_error(*run("compile", str(model), "-o", str(tmp_path / "o"))[::2], "CaptureError")
    assert f"kernel k at {model}:5: Triton's interpreter failed to run this launch" in line, line
    assert "no bfloat16: compute in fp32 there" in line and "a host with a CUDA GPU" in line, line


def test_a_missing_example_input_is_refused_before_the_capture_naming_the_parameter(tmp_path, run):
    """Issue 43 item 1: the forward's parameter left without an example, and the forward's own
    file:line, before anything runs (the forward would leave a mark)."""
    mark = tmp_path / "ran"
    model = tmp_path / "two_inputs.py"
    model.write_text("import torch\nclass M(torch.nn.Module):\n    def forward(self, x, scale, *, bias=0):\n"
                     f"        open({str(mark)!r}, 'w').close()\n        return x * scale\n"
                     "model = M()\nexample_inputs = (torch.randn(4),)\n")
    for command in (["dump-ir", str(model)], ["compile", str(model), "-o", str(tmp_path / "o")]):
        line = one_line_error(*run(*command)[::2], "InputError")
        assert "example_inputs give 1 input(s) but forward(x, scale, *, bias=0)" in line, line
        assert f"({model}:3) also needs 'scale'" in line, line
    assert not mark.exists()


@pytest.mark.parametrize("value, says", [
    ("[" * 20000 + "]" * 20000, "nested too deeply"),  # the JSON parser's RecursionError
    ('{"add_kernel": ' + '{"a": ' * 900 + '"input"' + "}" * 901, "must be a str, got dict"),
    ('{"add_kernel": {"x_ptr": ["input"]}}', "must be a str, got list"),
    ('["add_kernel"]', "must be a JSON object, got list"),
])
def test_roles_malformed_or_deeply_nested_is_one_short_input_error(run, value, says):
    status, _, err = run("dump-ir", TOY, "--roles", value)
    line = one_line_error(status, err, "InputError")
    assert "--roles" in line and says in line and len(line) < 400, line


def test_autotune_deeply_nested_is_one_short_input_error(run):
    status, _, err = run("compile", TOY, "--autotune", "{" * 5 + "[" * 20000)
    line = one_line_error(status, err, "InputError")
    assert "--autotune" in line and len(line) < 400, line


@pytest.fixture
def restore_modules(monkeypatch, tmp_path):
    """Undo what importing a model file does to sys.path / sys.modules (even a broken fix):
    drop the modules imported from tmp_path, put back any module one of them replaced."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = dict(sys.modules)
    yield
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None) or "").startswith(str(tmp_path)):
            del sys.modules[name]
    sys.modules.update({n: m for n, m in before.items() if n not in sys.modules})


def test_model_file_named_like_a_stdlib_module_works(tmp_path, run, restore_modules):
    """json.py used to replace the standard json module in sys.modules for the whole process
    (kernel_lens and torch then failed with AttributeErrors)."""
    model = tmp_path / "json.py"
    shutil.copy(TOY, model)
    real_json = sys.modules["json"]
    status, out, err = run("dump-ir", str(model), "--json", "--after", "none")
    assert status == 0, err
    assert sys.modules["json"] is real_json
    ir = json.loads(out)
    assert sorted(ir["kernels"]) == ["add_kernel", "scale_relu_kernel"]
    assert ir["kernels"]["add_kernel"]["source"]["file"] == str(model)


def test_model_folder_cannot_shadow_a_stdlib_module(tmp_path, restore_modules):
    """The model's folder goes at the end of sys.path: a sibling colorsys.py is not the
    standard library's colorsys for the rest of the process."""
    sys.modules.pop("colorsys", None)
    (tmp_path / "colorsys.py").write_text("PLANTED = True\n")
    (tmp_path / "sibling_helper.py").write_text("VALUE = 7\n")
    model = tmp_path / "uses_sibling.py"
    model.write_text("import torch\nfrom sibling_helper import VALUE\n"
                     "model = torch.nn.Identity()\nexample_inputs = (torch.full((2,), VALUE),)\n")
    mf = load_model_file(model)
    assert mf.example_inputs[0].tolist() == [7, 7]  # sibling imports still work
    import colorsys

    assert not hasattr(colorsys, "PLANTED") and Path(colorsys.__file__).parent != tmp_path


def test_model_files_with_one_stem_do_not_clash(tmp_path, restore_modules):
    first, second = tmp_path / "a" / "model_x.py", tmp_path / "b" / "model_x.py"
    for path, value in ((first, 1), (second, 2)):
        path.parent.mkdir()
        path.write_text(f"import torch\nmodel = torch.nn.Identity()\n"
                        f"example_inputs = (torch.tensor([{value}]),)\n")
    assert load_model_file(first).example_inputs[0].item() == 1
    mf2 = load_model_file(second)
    assert mf2.example_inputs[0].item() == 2
    assert sys.modules["model_x"].__file__ == str(first)  # not replaced by the second file


# --- item 17: --autotune, -o '', one-line errors -------------------------------------------------

def test_autotune_naming_an_unknown_kernel_lists_the_kernels(run):
    status, _, err = run("dump-ir", TOY, "--after", "none", "--autotune",
                         '{"no_such_kernel": {"BLOCK_SIZE": 128}}')
    line = one_line_error(status, err, "InputError")
    assert "'no_such_kernel'" in line and "add_kernel, scale_relu_kernel" in line, line
    status, _, err = run("dump-ir", TOY, "--after", "none", "--autotune",
                         '{"add_kernel": {"BLOCK_SIZE": 128}}')
    line = one_line_error(status, err, "InputError")
    assert "'add_kernel', which is not autotuned" in line, line


def test_autotune_naming_an_unknown_kernel_is_refused_before_writing(tmp_path, run):
    out = tmp_path / "out"
    status, _, err = run("compile", TOY, "-o", str(out), "--autotune", '{"nope": {"B": 1}}')
    one_line_error(status, err, "InputError")
    assert not out.exists()


def test_autotune_naming_an_autotuned_kernel_still_works(run):
    status, out, err = run("dump-ir", str(CORPUS / "autotune.py"), "--json", "--after", "none",
                           "--autotune", '{"scaled_add_kernel": {"BLOCK_SIZE": 32}}')
    assert status == 0, err
    kernel = next(k for k in json.loads(out)["kernels"].values() if k["name"] == "scaled_add_kernel")
    assert kernel["options"]["autotune_config"] == {"BLOCK_SIZE": 32}


@pytest.mark.parametrize("empty", ["", "  "])
def test_empty_output_is_refused(tmp_path, monkeypatch, run, empty):
    monkeypatch.chdir(tmp_path)
    line = one_line_error(*run("compile", TOY, "-o", empty)[::2], "OutputPathError")
    assert "current folder" in line
    one_line_error(*run("export-triton", str(tmp_path), "-o", empty)[::2], "OutputPathError")
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def toy_folder(tmp_path_factory):
    toy = load_model_file(TOY)
    out = tmp_path_factory.mktemp("toy") / "out"
    kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
               output_dir=out)
    return out


def test_invalid_ir_is_one_line_and_the_details_come_with_debug(toy_folder, tmp_path, run):
    folder = tmp_path / "bad"
    shutil.copytree(toy_folder, folder)
    ir_path = folder / "ToyModel.ir.json"
    doc = json.loads(ir_path.read_text())
    doc["arch"], doc["name"] = "x", 5
    ir_path.write_text(json.dumps(doc))
    reseal_manifest(folder)  # past load's sha256 check, to the IR's own validation
    status, _, err = run("export-triton", str(folder), "-o", str(tmp_path / "repo"))
    line = one_line_error(status, err, "IRError", "ArtifactError")  # the folder's IR
    assert "ToyModel.ir.json" in line and "more lines: run again with --debug" in line, line
    assert "validation error" not in err
    status, _, err = run("--debug", "export-triton", str(folder), "-o", str(tmp_path / "repo"))
    assert status == 2 and "Traceback" in err and "validation errors for GraphIR" in err, err


def test_torch_export_failure_is_one_line_and_the_details_come_with_debug(tmp_path, run):
    model = tmp_path / "data_dependent_branch.py"
    model.write_text(f"import sys\nsys.path.insert(0, {str(EXAMPLES)!r})\n"
                     "from toy_two_kernels import ToyModel, example_inputs\n"
                     "class M(ToyModel):\n    def forward(self, x, y):\n"
                     "        out = super().forward(x, y)\n"
                     "        return out * 2 if out.sum().item() > 0.5 else out\n"
                     "model = M()\n")
    line = one_line_error(*run("dump-ir", str(model))[::2], "TraceError")
    assert "depends on tensor values" in line or "tensor values" in line, line
    assert "Could not guard on data-dependent expression" in line  # torch's reason, condensed
    assert f"(in the model at {model}:7: return out * 2 if out.sum().item() > 0.5 else out)" in line
    assert "--debug" in line
    for args in (("--debug", "dump-ir", str(model)), ("dump-ir", "--debug", str(model)),
                 ("dump-ir", str(model), "--debug")):  # issue 43 item 5: before or after the command
        status, _, err = run(*args)
        assert status == 2 and "Traceback" in err and "GuardOnDataDependent" in err, (args, err)


def test_build_error_is_one_line_and_the_compiler_output_comes_with_debug(monkeypatch, run):
    output = "\n".join(f"kl_ort.cpp:{i}: error: something went wrong" for i in range(40))

    def failing_build(args):
        raise BuildError(f"building target ort failed (g++ exit 1); fix the compiler or report "
                         f"it\n{output}")

    monkeypatch.setattr(cli, "cmd_compile", failing_build)
    line = one_line_error(*run("compile", TOY)[::2], "BuildError")
    assert "building target ort failed" in line and "40 more lines" in line and "kl_ort.cpp" not in line
    status, _, err = run("--debug", "compile", TOY)
    assert status == 2 and "Traceback" in err and err.count("something went wrong") == 40


def test_a_very_long_message_is_cut_to_one_readable_line(monkeypatch, run):
    def long_error(args):
        raise BuildError("x" * 50000)

    monkeypatch.setattr(cli, "cmd_compile", long_error)
    line = one_line_error(*run("compile", TOY)[::2], "BuildError")
    assert len(line) < 1200 and "message is cut" in line


def test_an_unexpected_exception_is_one_line_too(monkeypatch, run):
    def bug(args):
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(cli, "cmd_compile", bug)
    status, _, err = run("compile", TOY)
    assert status == 1 and "Traceback" not in err
    assert err.startswith("kernel_lens: internal error: RecursionError: maximum recursion") and "--debug" in err
    status, _, err = run("--debug", "compile", TOY)
    assert status == 1 and "Traceback" in err


# --- mutation-sample gaps (issues 29/31): behaviours the sample's survivors showed untested -------
def test_a_long_first_line_is_cut_and_the_report_says_so(capsys):
    status = cli._report_error(ValueError("x" * (cli._LINE + 50) + "\nsecond line"), debug=False, status=3)
    err = capsys.readouterr().err
    assert status == 3
    assert "x" * cli._LINE + "..." in err and "x" * (cli._LINE + 1) not in err
    assert "[the message is cut, 1 more line: run again with --debug to see all]" in err


def test_export_triton_hands_every_flag_to_the_export(tmp_path, monkeypatch, capsys):
    import types

    import kernel_lens.serving as serving

    seen = {}

    def export(directory, output, **kwargs):
        seen.update(kwargs, directory=directory, output=output)
        return types.SimpleNamespace(config="repo/m/config.pbtxt", files={"model": "repo/m/1"}, notes=["n"])
    monkeypatch.setattr(serving, "export_triton", export)
    status = cli.main(["-q", "export-triton", str(tmp_path / "art"), "-o", str(tmp_path / "repo"),
                       "--name", "m", "--backend", "tensorrt", "--instances", "3", "--max-batch-size", "4"])
    assert status == 0
    assert seen == {"directory": str(tmp_path / "art"), "output": str(tmp_path / "repo"), "name": "m",
                    "backend": "tensorrt", "instances": 3, "max_batch_size": 4}
    out = capsys.readouterr()
    assert "config: repo/m/config.pbtxt" in out.out and "model: repo/m/1" in out.out
    assert "note: n" in out.err


def test_compile_with_dynamic_reports_the_dims_torch_settled_on(tmp_path, monkeypatch, capsys):
    import types

    import kernel_lens.compiler as compiler
    import kernel_lens.frontends.lift as lift

    ir = types.SimpleNamespace(name="toy")
    compiled = types.SimpleNamespace(ir=ir, artifacts={}, summary=lambda: "")
    monkeypatch.setattr(compiler, "compile", lambda *a, **k: compiled)
    monkeypatch.setattr(lift, "describe_dims", lambda got: "n = x.shape[0] in [2, 1048576]" if got is ir else "?")
    cli.main(["compile", str(EXAMPLES / "toy_two_kernels.py"), "--dynamic", "-o", str(tmp_path / "o")])
    assert "dynamic dims (--dynamic):\n  n = x.shape[0] in [2, 1048576]" in capsys.readouterr().err


def test_doctor_probes_say_what_they_found(monkeypatch):
    assert doctor._kernel_lens() == [("version", kl.__version__),
                                     ("location", str(Path(kl.__file__).resolve().parent))]
    monkeypatch.setattr(doctor, "_installed", lambda module: False)
    assert doctor._onnxruntime() == [("onnxruntime", "not installed")]

    def unreachable(cmd):
        raise OSError(2, "no such interpreter")
    monkeypatch.setattr(doctor, "_run_isolated", unreachable)
    assert doctor._ort_cuda_ep() == "check failed: FileNotFoundError: [Errno 2] no such interpreter"

    def broken():
        raise RuntimeError("entry points unreadable")
    monkeypatch.setattr(doctor, "_available_targets", broken)
    lines, status = doctor._targets(doctor._State())
    assert status == 1
    assert lines[0] == ("ort", "cannot build: target not installed (entry point kernel_lens.targets: "
                               "ort); listing targets failed: RuntimeError: entry points unreadable")


def test_an_unknown_opt_level_is_one_line_before_any_work(tmp_path, run):
    out = tmp_path / "out"
    status, _, err = run("compile", TOY, "-o", str(out), "--opt-level", "3")
    line = one_line_error(status, err, "InputError")
    assert "optimize=3: the levels are 0, 1" in line and "gqa_without_expand" in line, line
    assert not out.exists() or not any(out.iterdir())  # refused before the capture wrote anything


def test_opt_level_reaches_the_ir_and_the_summary(tmp_path, run):
    for level, shown in (("0", "(none: optimize=0)"), ("1", "fuse_sibling_matmuls, gqa_without_expand")):
        status, out, err = run("dump-ir", TOY, "--opt-level", level)
        assert status == 0, err
        assert f"graph passes (at lowering): {shown}" in out
