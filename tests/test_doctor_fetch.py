"""`kernel_lens fetch-headers` and `kernel_lens doctor`, run as a user runs them.

fetch-headers really downloads the ONNX Runtime headers from the npm registry, once per module,
into a temporary folder (npm's own cache makes the refusal tests' second download quick).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lens import doctor
from kernel_lens.toolchain import fetch_headers, headers

from conftest import ROOT

SECTIONS = ["kernel_lens", "python", "torch", "triton", "onnxruntime", "tensorrt", "cuda driver",
            "gpus", "cuda toolkit", "c++ compiler", "headers", "build cache", "environment",
            "targets"]


def kl(*args: str, env: dict[str, str] | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kernel_lens.cli", *args], capture_output=True,
                          text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="module")
def ort_dest(tmp_path_factory):
    dest = tmp_path_factory.mktemp("headers")
    proc = kl("fetch-headers", "--ort", "--dest", str(dest), timeout=900)
    assert proc.returncode == 0, proc.stderr
    return dest


# --- fetch-headers ---

def test_fetch_headers_ort_fills_dest(ort_dest):
    ort = ort_dest / "onnxruntime"
    assert (ort / "onnxruntime_c_api.h").is_file() and (ort / "onnxruntime_cxx_api.h").is_file()
    assert "MIT License" in (ort / "LICENSE").read_text()
    assert headers.ort_api_version(ort) == 29
    assert not (ort_dest / "tensorrt").exists()  # --ort alone: only ONNX Runtime
    assert sorted(p.name for p in ort_dest.iterdir()) == ["onnxruntime"]  # no temporary folder left
    assert (ort_dest / "onnxruntime").stat().st_mode & 0o022 == 0  # a cache others cannot write


def test_fetch_headers_rerun_skips_and_prints_the_include_dir(ort_dest):
    proc = kl("fetch-headers", "--ort", "--dest", str(ort_dest), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ONNX Runtime headers already in" in proc.stderr and "npm pack" not in proc.stderr
    assert proc.stdout.strip() == f"ORT_INCLUDE_DIR={ort_dest / 'onnxruntime'}  (ORT_API_VERSION 29)"


def test_script_wrapper_runs_the_package_module_without_site_packages(ort_dest):
    # -S: no site-packages, so neither kernel_lens (installed) nor torch is importable; the script
    # must bring the checkout's src/ itself and need nothing beyond the standard library.
    if os.environ.get("MUTANT_UNDER_TEST"):  # mutmut's trampolines import mutmut itself
        pytest.skip("under mutation testing the sources import mutmut, which -S leaves out")
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "scripts" / "fetch_headers.py"),
                           str(ort_dest), "--ort"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"ORT_INCLUDE_DIR={ort_dest / 'onnxruntime'}" in proc.stdout
    assert "fetch_headers: ONNX Runtime headers already in" in proc.stderr


def _refused(dest: Path, capsys, argv: list[str]) -> str:
    status = fetch_headers.main(["--ort", "--dest", str(dest), *argv])
    err = capsys.readouterr().err
    assert status != 0
    assert not (dest / "onnxruntime").exists()
    assert not dest.exists() or list(dest.iterdir()) == []  # nothing half-extracted left behind
    return err


def test_archive_with_another_digest_than_the_pin_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(fetch_headers, "ORT_NPM_SHA256", "0" * 64)
    err = _refused(tmp_path / "dest", capsys, [])
    assert re.search(r"fetch_headers: error: .*\.tgz: sha256 [0-9a-f]{64} differs from the pinned 0{64}; "
                     r"refusing to install headers from an unexpected archive", err), err
    # the refusal is the digest check's doing: --no-verify installs the same archive
    assert fetch_headers.main(["--ort", "--dest", str(tmp_path / "dest"), "--no-verify"]) == 0
    assert (tmp_path / "dest" / "onnxruntime" / "onnxruntime_c_api.h").is_file()


def test_corrupted_archive_is_refused_by_the_real_pin(tmp_path, capsys, monkeypatch):
    real_pack = fetch_headers.npm_pack

    def pack_then_corrupt(folder, spec, hint):
        tgz = real_pack(folder, spec, hint)
        with open(tgz, "r+b") as fh:  # flip one byte in the middle
            fh.seek(tgz.stat().st_size // 2)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
        return tgz

    monkeypatch.setattr(fetch_headers, "npm_pack", pack_then_corrupt)
    err = _refused(tmp_path / "dest", capsys, [])
    assert f"differs from the pinned {fetch_headers.ORT_NPM_SHA256}" in err, err


def test_fetch_headers_help_lists_the_flags():
    proc = kl("fetch-headers", "--help")
    assert proc.returncode == 0
    for flag in ("--ort", "--trt", "--dest", "--no-verify"):
        assert flag in proc.stdout
    top = kl("--help").stdout
    assert "fetch-headers" in top and "doctor" in top


def test_installed_console_script_has_both_commands():
    exe = Path(sys.executable).parent / "kernel_lens"
    if not exe.is_file():
        pytest.skip("the kernel_lens console script is not installed next to this Python")
    proc = subprocess.run([str(exe), "fetch-headers", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "--no-verify" in proc.stdout
    proc = subprocess.run([str(exe), "doctor", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0


def test_missing_headers_error_points_to_the_fetch_command(tmp_path, monkeypatch):
    monkeypatch.setattr(headers, "_system_ort_dirs", lambda: [])
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)
    monkeypatch.setenv("KERNEL_LENS_HEADERS", str(tmp_path / "empty"))
    with pytest.raises(headers.ToolchainError, match="ORT_INCLUDE_DIR") as exc:
        headers.find_ort_include()
    assert "Run `kernel_lens fetch-headers`" in str(exc.value)


# --- doctor ---

def _sections(out: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line and not line.startswith(" "):
            assert line.endswith(":"), f"not a heading: {line!r}"
            current = line[:-1]
            found[current] = []
        else:
            assert current is not None, out
            found[current].append(line.strip())
    return found


def _value(lines: list[str], label: str) -> str:
    for line in lines:
        if line.startswith(label + " "):
            return line[len(label):].strip()
    raise AssertionError(f"no {label!r} line in {lines}")


@pytest.fixture
def compiler():
    if shutil.which("g++") is None and shutil.which("c++") is None and shutil.which("clang++") is None:
        pytest.skip("no C++ compiler on PATH")


def test_doctor_reports_found_headers_and_exits_zero(ort_dest, compiler):
    proc = kl("doctor", env={"ORT_INCLUDE_DIR": str(ort_dest / "onnxruntime")}, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    sections = _sections(proc.stdout)
    assert list(sections) == SECTIONS
    ort = _value(sections["headers"], "onnxruntime")
    assert ort == f"{(ort_dest / 'onnxruntime').resolve()} (ORT_API_VERSION 29)"
    assert _value(sections["targets"], "ort") == "can build"
    assert _value(sections["kernel_lens"], "version")
    assert _value(sections["python"], "version").endswith(".".join(map(str, sys.version_info[:3])))
    for name in ("trt-v2", "trt-v3"):
        assert re.match(r"(can build|cannot build: |target not implemented yet; TensorRT headers )",
                        _value(sections["targets"], name))
    assert os.environ["KERNEL_LENS_CACHE"] in _value(sections["build cache"], "folder")
    assert _value(sections["environment"], "ORT_INCLUDE_DIR") == str(ort_dest / "onnxruntime")


def test_doctor_gives_the_fix_when_ort_include_dir_is_empty(tmp_path, compiler):
    empty = tmp_path / "empty"
    empty.mkdir()
    proc = kl("doctor", env={"ORT_INCLUDE_DIR": str(empty)}, timeout=300)
    assert proc.returncode != 0, proc.stdout
    sections = _sections(proc.stdout)
    assert list(sections) == SECTIONS
    ort = _value(sections["headers"], "onnxruntime")
    assert ort.startswith(f"NOT FOUND: ORT_INCLUDE_DIR={empty} points to a folder without "
                          "onnxruntime_c_api.h")
    assert "`kernel_lens fetch-headers`" in ort
    assert _value(sections["targets"], "ort").startswith("cannot build: no ONNX Runtime headers (ORT_INCLUDE_DIR=")


def test_doctor_survives_a_broken_environment(tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    env = {"KERNEL_LENS_CXX": str(tmp_path / "no-cxx"), "KERNEL_LENS_NVCC": str(tmp_path / "no-nvcc"),
           "ORT_INCLUDE_DIR": str(tmp_path / "missing"), "TENSORRT_INCLUDE_DIR": str(not_a_folder),
           "CUDA_INCLUDE_DIR": str(tmp_path / "missing"), "KERNEL_LENS_CACHE": str(not_a_folder)}
    proc = kl("doctor", env=env, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    sections = _sections(proc.stdout)
    assert list(sections) == SECTIONS
    assert _value(sections["c++ compiler"], "c++").startswith("not found: KERNEL_LENS_CXX=")
    assert _value(sections["cuda toolkit"], "nvcc").startswith("error: ToolchainError: KERNEL_LENS_NVCC=")
    assert _value(sections["targets"], "ort").startswith("cannot build: no C++ compiler")


def test_report_reports_a_crashing_probe_and_goes_on(monkeypatch):
    def boom():
        raise RuntimeError("probe exploded")

    monkeypatch.setattr(doctor, "_triton", boom)
    monkeypatch.setattr(doctor, "_python", lambda: 1 / 0)
    text, status = doctor.report()
    sections = _sections(text)
    assert list(sections) == SECTIONS
    assert sections["triton"] == ["error  RuntimeError: probe exploded"]
    assert _value(sections["python"], "error").startswith("ZeroDivisionError")
    assert status in (0, 1)


@pytest.mark.parametrize("returncode, stdout, stderr, expected", [
    (0, "PROVIDERS=CUDAExecutionProvider,CPUExecutionProvider\n", "",
     "loads (a test session ran on CUDAExecutionProvider)"),
    (0, "PROVIDERS=CPUExecutionProvider\n",
     "2026 [E:onnxruntime:Default, provider_bridge_ort.cc:2195] Failed to load library "
     "libonnxruntime_providers_cuda.so with error: libcublasLt.so.12: cannot open shared object file\n"
     "2026 [W:onnxruntime:Default, onnxruntime_pybind_state.cc:1013] Failed to create "
     "CUDAExecutionProvider.\n",
     "does NOT load (fell back to CPUExecutionProvider): 2026 [E:onnxruntime:Default, "
     "provider_bridge_ort.cc:2195] Failed to load library libonnxruntime_providers_cuda.so with "
     "error: libcublasLt.so.12: cannot open shared object file"),
    (-11, "", "", "does NOT load (session creation failed, exit -11): (no message)"),
])
def test_ort_cuda_ep_check_reads_the_child_process(monkeypatch, returncode, stdout, stderr, expected):
    fake = subprocess.CompletedProcess([], returncode, stdout, stderr)
    monkeypatch.setattr(doctor.subprocess, "run", lambda *a, **k: fake)
    assert doctor._ort_cuda_ep() == expected


def test_doctor_asks_every_installed_target_what_it_needs(monkeypatch):
    """Issue 28: doctor loops over the targets (a third party's too) and probes each requirement
    the target reports; it knows no target's needs itself."""
    import kernel_lens as kl
    from kernel_lens.targets.base import Target

    class NeedsAWidget(Target):
        name = "needs-widget"

        def requirements(self, stop_after=None):
            def widget():
                raise RuntimeError("no widget in PATH; install widget")
            return [("widget", widget)]

        def build(self, ir, out_dir):
            return {}

    kl.register_target(NeedsAWidget)
    monkeypatch.setattr(doctor, "_available_targets",
                        lambda: {"ort": "kernel_lens.targets.ort:OrtTarget", "needs-widget": "test"})
    lines, _ = doctor._targets(doctor._State())
    assert dict(lines)["needs-widget"] == "cannot build: no widget (no widget in PATH)"
