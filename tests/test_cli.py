"""The kernel_lens command line, as a user runs it."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from kernel_lens.ir import GraphIR

from conftest import EXAMPLES, ROOT

TOY = str(EXAMPLES / "toy_two_kernels.py")


def kl(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", *args], capture_output=True,
                          text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"kernel_lens {' '.join(args)} failed:\n{proc.stderr}")
    return proc


def test_version():
    out = kl("--version").stdout
    assert out.startswith("kernel_lens ")


def test_passes_lists_pipeline_in_order():
    lines = kl("passes").stdout.splitlines()
    assert [l.split()[1] for l in lines] == ["role-inference", "grid-canonicalization",
                                             "specialization", "ptx-isa-clamp"]


def test_schema():
    schema = json.loads(kl("dump-ir", "--schema").stdout)
    assert schema["title"] == "GraphIR" and "launches" in schema["properties"]


@pytest.fixture(scope="module")
def toy_json():
    return json.loads(kl("dump-ir", TOY, "--json").stdout)


def test_dump_ir_json_contract(toy_json):
    assert toy_json["symbols"] == {"n": {"input": 0, "dim": 0, "min": 2, "max": 1 << 20,
                                         "example": 1000, "scale": 1, "offset": 0}}
    first = toy_json["launches"][0]
    assert first["kernel"] == "add_kernel"
    assert first["grid"] == ["floor(n/256 + 255/256)", "1", "1"]
    assert [(a["name"], a["role"]) for a in first["args"]] == [
        ("x_ptr", "input"), ("y_ptr", "input"), ("out_ptr", "output"),
        ("n_elements", "scalar"), ("BLOCK_SIZE", "constexpr")]
    GraphIR.model_validate(toy_json)


def test_dump_ir_after_a_pass_and_before_all(toy_json):
    after = json.loads(kl("dump-ir", TOY, "--json", "--after", "role-inference").stdout)
    assert after["passes_run"] == ["role-inference"]
    raw = json.loads(kl("dump-ir", TOY, "--json", "--after", "none").stdout)
    assert raw["passes_run"] == [] and raw["launches"][0]["args"][0]["role"] is None


def test_dump_ir_readable():
    out = kl("dump-ir", TOY).stdout
    assert "launch add_kernel[grid=((n + 255)//256, 1, 1)]" in out
    assert "x_ptr=%x:input" in out and "pass timings:" in out


def test_compile_writes_and_prints_artifacts(tmp_path):
    out = kl("compile", TOY, "--arch", "sm_80", "-o", str(tmp_path),
             "--dump-after", "role-inference").stdout
    ir_path = tmp_path / "ToyModel.ir.json"
    assert f"ir: {ir_path}" in out and f"summary: {tmp_path / 'ToyModel.summary.txt'}" in out
    ir = GraphIR.load(ir_path)
    assert ir.arch == 80 and all(".target sm_80" in b.ptx for k in ir.kernels.values()
                                 for b in k.binaries)
    assert (tmp_path / "dumps" / "01-role-inference.json").is_file()


def test_ptx_clamp_from_cli(tmp_path):
    kl("compile", TOY, "--cuda-version", "12.4", "-o", str(tmp_path))
    ir = GraphIR.load(tmp_path / "ToyModel.ir.json")
    for k in ir.kernels.values():
        for b in k.binaries:
            assert b.ptx_version == "8.4" and ".version 8.4" in b.ptx


def test_errors_exit_nonzero_with_a_message(tmp_path):
    missing = kl("compile", str(tmp_path / "nope.py"), check=False)
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    empty = tmp_path / "empty_model.py"
    empty.write_text("x = 1\n")
    proc = kl("dump-ir", str(empty), check=False)
    assert proc.returncode == 2 and "must define model and example_inputs" in proc.stderr
    proc = kl("dump-ir", TOY, "--after", "bogus", check=False)
    assert proc.returncode == 2 and "no pass named 'bogus'" in proc.stderr
    proc = kl("compile", TOY, "--arch", "banana", check=False)
    assert proc.returncode == 2 and "--arch" in proc.stderr
    bad = str(ROOT / "tests" / "models" / "bad_kernels.py")
    assert kl("dump-ir", bad, check=False).returncode == 2


def test_help_imports_nothing_heavy():
    code = ("import sys\n"
            "from kernel_lens import cli\n"
            "try:\n    cli.main(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = ('torch', 'triton', 'onnx', 'onnxruntime', 'onnxscript', 'sympy', 'pydantic',"
            " 'networkx', 'numpy', 'jinja2')\n"
            "print('loaded', [m for m in heavy if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("loaded []"), out.stdout[-500:]


def test_dump_ir_after_none_honours_dynamic():
    plain = kl("dump-ir", TOY, "--after", "none").stdout  # without --json: the summary
    assert plain.startswith("graph ") and "symbols:" in plain and not plain.lstrip().startswith("{")
    declared = json.loads(kl("dump-ir", TOY, "--json", "--after", "none").stdout)
    auto = kl("dump-ir", TOY, "--json", "--after", "none", "--dynamic")
    ir = json.loads(auto.stdout)
    assert list(declared["symbols"]) == ["n"]  # the file's Dim
    assert list(ir["symbols"]) != ["n"] and ir["symbols"]  # Dim.AUTO: named after the input
    assert "dynamic dims (--dynamic)" in auto.stderr and ir["passes_run"] == []


@pytest.mark.parametrize("command", [["compile", TOY, "-o", "OUT"], ["dump-ir", TOY],
                                     ["dump-ir", TOY, "--after", "none"],
                                     ["dump-ir", TOY, "--after", "specialization"]])
def test_every_flag_that_changes_the_trace_reaches_it(command, tmp_path, monkeypatch):
    """--arch, --roles, --autotune, --dynamic (and --ptx-version / --cuda-version where passes
    run) reach the capture and trace, for every command that lifts a model file."""
    import kernel_lens.compiler as compiler
    from kernel_lens import cli

    seen = {}

    class Reached(Exception):
        pass

    def record(model, example_inputs, **kwargs):
        seen.update(kwargs)
        raise Reached

    monkeypatch.setattr(compiler, "compile", record)
    monkeypatch.setattr(compiler, "lift", record)
    command = [str(tmp_path / "out") if c == "OUT" else c for c in command]
    flags = ["--arch", "80", "--roles", '{"add_kernel": {"out_ptr": "output"}}',
             "--autotune", '{"scaled_add_kernel": {"BLOCK_SIZE": 32}}', "--dynamic",
             "--ptx-version", "8.4", "--cuda-version", "12.4"]
    cli.main([*command, *flags])
    assert seen["arch"] == (80,) and seen["dynamic"] is True and "dynamic_shapes" not in seen
    assert seen["roles"] == {"add_kernel": {"out_ptr": "output"}}
    assert seen["autotune"] == {"scaled_add_kernel": {"BLOCK_SIZE": 32}}
    if "none" not in command:  # no pass runs on a bare lift: nothing to lower
        assert seen["options"] == {"ptx_version": "8.4", "cuda_version": "12.4"}


# ------------------------------------------------------------------ progress, -q/-v, signals, OS errors


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def test_compile_reports_each_stage_with_its_time_the_cache_and_the_next_step(tmp_path):
    first = kl("compile", TOY, "-o", str(tmp_path / "a")).stderr.splitlines()
    again = kl("compile", TOY, "-o", str(tmp_path / "b"), "-v").stderr  # -v after the command
    for stage in ("load model", "capture", "trace", "aot add_kernel", "pass role-inference",
                  "pass specialization"):
        assert any(line.startswith(f"kernel_lens: {stage}") and " s" in line for line in first), stage
    assert "aot add_kernel (sm_90, specialized): " in again and "reused from cache" in again
    if not torch_cuda():  # which arch, and how to choose, on a host without a GPU
        assert any(line.startswith("kernel_lens: no CUDA GPU here: compiling for sm_90 (H100/H200); "
                                   "choose another with --arch") for line in first)
    assert first[-2].startswith("kernel_lens: next: check it with kernel_lens verify ")
    assert first[-1].startswith("kernel_lens: done in ")


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_before_or_after_the_command_prints_only_results(where, tmp_path):
    args = ["compile", TOY, "-o", str(tmp_path)]
    proc = kl(*(["-q", *args] if where == "before" else [*args, "-q"]))
    assert proc.stderr == "" and "ir: " in proc.stdout


def test_ctrl_c_is_one_line_exit_130_and_leaves_no_manifest(tmp_path):
    import signal
    import time

    slow = tmp_path / "slow_model.py"
    loading = tmp_path / "loading"  # the model file is being loaded: the compile is under way
    slow.write_text(f"import pathlib, time\npathlib.Path({str(loading)!r}).touch()\ntime.sleep(60)\n")
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lens.cli", "compile", str(slow), "-o", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (loading.exists() or time.monotonic() > deadline):
        time.sleep(0.1)
    assert loading.exists()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines()[-1] == "kernel_lens: interrupted (Ctrl-C)"
    assert "Traceback" not in err and not list(out.glob("*.json"))


def test_a_closed_pipe_is_not_an_internal_error():
    proc = subprocess.run(f"{sys.executable} -m kernel_lens.cli dump-ir {TOY} | head -1", shell=True,
                          capture_output=True, text=True, timeout=600, executable="/bin/bash")
    assert proc.stdout.count("\n") == 1
    assert "internal error" not in proc.stderr and "Traceback" not in proc.stderr \
        and "Exception ignored" not in proc.stderr


@pytest.mark.parametrize("code,fix", [(28, "free disk space"), (13, "check the permissions"),
                                      (30, "read-only")])
def test_os_errors_are_one_line_with_the_fix(code, fix, tmp_path, monkeypatch, capsys):
    import errno
    import os

    from kernel_lens import cli, compiler

    assert code in (errno.ENOSPC, errno.EACCES, errno.EROFS)

    def refuse(self, directory, *args, **kwargs):
        raise OSError(code, os.strerror(code), str(directory))
    monkeypatch.setattr(compiler.CompiledModel, "write", refuse)
    assert cli.main(["-q", "compile", TOY, "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("kernel_lens: error: ") and fix in err[0]
    assert "internal error" not in err[0] and str(tmp_path / "o") in err[0]


def test_on_a_terminal_progress_is_a_spinner_and_a_line_per_finished_stage():
    import io
    import logging

    from rich.console import Console

    from kernel_lens import cli, progress

    handler = cli._RichProgress()
    buffer = io.StringIO()
    handler.console = Console(file=buffer, force_terminal=True, width=100)
    logger = logging.getLogger(progress.log.name)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)  # (setLevel, not .level =: it clears logging's enabled cache)
    try:
        with progress.stage("pass specialization"):
            with progress.stage("aot k (sm_90, generic)") as inner:
                inner.note = "reused from cache"
    finally:
        handler.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    text = buffer.getvalue()
    assert "✓" in text and re.search(r"aot k \(sm_90, generic\): \d+\.\d\d s, reused from cache", text)
    assert "pass specialization: " in text and not handler.running


def test_in_a_log_a_long_stage_is_named_at_once_then_again_while_it_runs(capsys, monkeypatch):
    """Issue 43 item 2: the first stage is said within FIRST, and a stage that runs long is named
    again each QUIET seconds without a line: a log is never silent for long."""
    import logging
    import time

    from kernel_lens import cli, progress

    monkeypatch.setattr(cli._PlainProgress, "FIRST", 0.1)
    monkeypatch.setattr(cli._PlainProgress, "SLOW", 0.2)
    monkeypatch.setattr(cli._PlainProgress, "QUIET", 0.6)
    monkeypatch.setattr(cli._PlainProgress, "TICK", 0.05)
    handler = cli._PlainProgress()
    logger = logging.getLogger(progress.log.name)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with progress.stage("load model m.py"):
            time.sleep(0.3)  # past FIRST: said while it runs
        with progress.stage("capture"):
            time.sleep(2.2)
    finally:
        handler.close()
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "kernel_lens: load model m.py ..." and lines[1].startswith("kernel_lens: load model m.py: ")
    assert lines[2] == "kernel_lens: capture ..."  # after SLOW
    still = [line for line in lines if line.startswith("kernel_lens: capture ... still running (")]
    assert 2 <= len(still) <= 4, lines
    assert lines[-1].startswith("kernel_lens: capture: 2.")


@pytest.mark.parametrize("command", ["verify", "export-triton"])
def test_verify_and_export_say_something_at_once_and_are_never_silent_for_long(command, tmp_path):
    """Issue 43 item 2, as a user runs them (stderr a pipe): a first line within 3 s of the
    start, then never 12 s without one."""
    import time

    if command == "verify":
        args = ["verify", TOY, "--max-size", "64"]
    else:
        kl("compile", TOY, "--target", "ort", "-o", str(tmp_path / "built"))
        args = ["export-triton", str(tmp_path / "built"), "-o", str(tmp_path / "repo")]
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lens.cli", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stamps = [(time.monotonic() - start, line) for line in proc.stderr]
    assert proc.wait(timeout=600) == 0, stamps
    assert stamps and stamps[0][0] < 3.0, stamps
    gaps = [b[0] - a[0] for a, b in zip(stamps, stamps[1:])]
    assert max(gaps, default=0) < 12, stamps
    assert any("start up" in line for _, line in stamps) and stamps[-1][1].startswith("kernel_lens: done in")


def test_a_compiled_model_prints_in_one_short_line(toy_json):
    from kernel_lens.compiler import CompiledModel

    text = repr(CompiledModel(GraphIR.model_validate(toy_json)))
    assert "\n" not in text and len(text) < 300
    assert text.startswith("CompiledModel(ToyModel: 2 inputs, 1 outputs, 2 launches of ") and "sm_90" in text


def test_missing_headers_are_reported_before_the_capture(tmp_path):
    import os

    env = {**os.environ, "ORT_INCLUDE_DIR": str(tmp_path / "nowhere")}
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile", TOY, "--target", "ort",
                           "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 2
    assert "error: ToolchainError: ORT_INCLUDE_DIR=" in proc.stderr and "capture" not in proc.stderr


@pytest.mark.parametrize("flags,api", [
    (["--target", "ort", "--stop-after", "bogus"], {"targets": ["ort"], "stop_after": "bogus"}),
    (["--target", "no-such-target"], {"targets": ["no-such-target"]}),
])
def test_a_bad_target_or_stage_is_the_same_line_from_the_cli_and_the_api(flags, api, tmp_path, monkeypatch):
    """Issue 28: target and stage names are checked once (by compile(), before the capture)."""
    import kernel_lens
    import kernel_lens.frontends.lift as lift_module
    from kernel_lens.errors import KernelLensError
    from kernel_lens.model_file import load_model_file

    proc = kl_run = kl("compile", TOY, "-o", str(tmp_path / "cli"), *flags, check=False)
    assert proc.returncode == 2
    cli_line = proc.stderr.strip().splitlines()[-1]
    monkeypatch.setattr(lift_module, "capture", lambda *a: (_ for _ in ()).throw(AssertionError("capture ran")))
    mf = load_model_file(TOY)
    with pytest.raises(KernelLensError) as err:
        kernel_lens.compile(mf.model, mf.example_inputs, dynamic_shapes=mf.dynamic_shapes,
                            output_dir=tmp_path / "api", **api)
    api_line = f"kernel_lens: error: {type(err.value).__name__}: {err.value}"
    # (the list of installed targets after ';' may differ: other tests register targets here)
    assert cli_line.split(";")[0] == api_line.split(";")[0] and "; " in cli_line
    assert "capture" not in kl_run.stderr


def test_a_compile_says_what_it_replaces_and_keeps_the_other_target_of_the_same_model(tmp_path):
    """Issue 43 item 4: the same model for another target keeps the first target's files (the
    manifest lists both, load checks both); another version of it drops them and says so; another
    model's build is replaced with one line. Item 3: a TensorRT build names the trtexec command."""
    import json

    import kernel_lens

    out = tmp_path / "out"
    kl("compile", TOY, "--target", "ort", "-o", str(out))
    second = kl("compile", TOY, "--target", "trt", "-o", str(out))
    assert f"kernel_lens: {out}: kept the ort artifacts of the earlier build of this model" in second.stderr
    assert f"next: build a TensorRT engine on the GPU that will run it (its TensorRT): trtexec " \
           f"--onnx={out}/ToyModel.trt.onnx --dynamicPlugins={out}/libkl_ToyModel_trt_v3.so " \
           f"--saveEngine={out}/ToyModel.plan --stronglyTyped --minShapes=x:2,y:2" in second.stderr
    manifest = json.loads((out / "kernel_lens.json").read_text())
    assert {"ort.onnx", "ort.library", "trt.onnx", "trt.library"} <= set(manifest["artifacts"])
    assert set(kernel_lens.load(out).artifacts) == set(manifest["artifacts"])
    ort_library = out / manifest["artifacts"]["ort.library"]
    third = kl("compile", TOY, "--target", "trt", "--arch", "sm_80", "-o", str(out))  # another IR
    assert "the earlier ort artifacts are removed: they were built from another version of the model" in third.stderr
    assert not ort_library.exists() and "ort.library" not in json.loads((out / "kernel_lens.json").read_text())["artifacts"]
    other = kl("compile", str(EXAMPLES / "llama_block.py"), "-o", str(out))
    lines = [line for line in other.stderr.splitlines() if "held the build of model" in line]
    assert lines == [f"WARNING kernel_lens.artifact_folder: {out} held the build of model ToyModel; it is "
                     f"replaced by the build of LlamaBlock"], other.stderr
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == \
        ["LlamaBlock.ir.json", "LlamaBlock.summary.txt", "kernel_lens.json"]
