"""Targets on a CPU-only host: generated C++ for every corpus model compiles warning-free
against real ONNX Runtime headers, the library loads into onnxruntime and registers its
domain, and a separately installed third-party target plugs in through the entry point."""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import KernelLensError
from kernel_lens.targets.base import available_targets
from kernel_lens.targets.ort.target import OPSET as ORT_OPSET, ort_sources
from kernel_lens.toolchain.build import build_shared_library

from conftest import ROOT, assert_loads_in_ort, corpus_files, eager_on_cpu, example_files, load_module, model_ir

MODELS = {p.stem: p for p in corpus_files()}
MODELS.update({p.stem: p for p in example_files()})


@pytest.fixture(autouse=True)
def _headers(ort_headers):
    """Every test here builds libraries: the ORT headers (conftest's fixture) first."""
    return ort_headers


def _ir(name):
    return model_ir(MODELS[name])  # compiled once per session (shared with other test files)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_generated_cpp_compiles_warning_free_and_registers_with_onnxruntime(name, tmp_path, ort_headers):
    ir = _ir(name)
    sources = ort_sources(ir, 29)
    library = build_shared_library(f"kl_{name}", sources, include_dirs=[ort_headers])
    assert library.is_file()
    from kernel_lens.onnx import lower_to_onnx, save_onnx
    from kernel_lens.onnx.lower import MIN_OPSET, check_ops

    # The ORT target's own graph (opset 23: torchlib's opset-18 functions must be inlined with
    # version conversion, issue 17), and the opset-18 graph the TensorRT target starts from.
    for opset in (ORT_OPSET, MIN_OPSET):
        lowered = lower_to_onnx(ir, opset=opset)
        check_ops(lowered)
        model = save_onnx(lowered, tmp_path / f"model_{opset}.onnx")
        onnx.checker.check_model(str(model), full_check=True)
        assert_loads_in_ort(model, library)


def test_generated_cpp_compiles_with_nvcc(tmp_path, ort_headers):
    from kernel_lens.toolchain.compilers import find_nvcc

    nvcc = find_nvcc()
    if nvcc is None:
        pytest.fail("nvcc not found: the CPU host of this project has CUDA 13's nvcc on PATH")
    for name, text in ort_sources(_ir("toy_two_kernels"), 29).items():
        (tmp_path / name).write_text(text)
    cmd = [nvcc, "-std=c++17", "-shared", "-Xcompiler", "-fPIC,-Wall,-Wextra,-Werror", "-Werror",
           "all-warnings", f"-I{tmp_path}", "-isystem", str(ort_headers),
           str(tmp_path / "kl_launches.cpp"), str(tmp_path / "kl_ort.cpp"), "-ldl", "-o",
           str(tmp_path / "lib.so")]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_library_needs_no_cuda_driver_until_a_launch_runs(tmp_path, ort_headers):
    # libcuda.so.1 is absent on this host; the library builds and loads: check it links no CUDA.
    library = build_shared_library("kl_ldd", ort_sources(_ir("toy_two_kernels"), 29),
                                   include_dirs=[ort_headers], cache_dir=tmp_path)
    out = subprocess.run(["ldd", str(library)], capture_output=True, text=True).stdout
    assert "libdl" in out or "libc.so" in out  # ldd really read it
    assert "libcuda" not in out and "libcudart" not in out
    ctypes.CDLL(str(library))  # and it loads


def test_compile_with_ort_target_writes_artifacts_and_load_reopens(tmp_path):
    m = load_module(MODELS["toy_two_kernels"])
    compiled = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path)
    assert compiled.artifacts["ort.onnx"].is_file() and compiled.artifacts["ort.library"].is_file()
    manifest = json.loads((tmp_path / "kernel_lens.json").read_text())
    assert set(manifest["artifacts"]) >= {"ir", "summary", "ort.onnx", "ort.library"}
    again = kl.load(tmp_path)
    assert again.ir == compiled.ir
    with pytest.raises(KernelLensError, match="CUDAExecutionProvider|onnxruntime-gpu"):
        again.runner()  # CPU host: a clear error, not a crash
    # CPU tensors: the folder's graph is evaluated on the CPU, equal to eager
    for got, want in zip(again.run(*[t.clone() for t in m.example_inputs]),
                         eager_on_cpu(m.model, m.example_inputs)):
        assert torch.equal(got, want)
    with pytest.raises(KernelLensError, match="not a kernel_lens output folder"):
        kl.load(tmp_path / "nowhere")


def test_cli_compile_with_target_prints_paths(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile",
                           str(MODELS["toy_two_kernels"]), "--target", "ort", "-o", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for kind, suffix in (("ort.onnx", ".onnx"), ("ort.library", ".so"), ("ir", ".json")):
        line = next(l for l in proc.stdout.splitlines() if l.startswith(f"{kind}: "))
        path = Path(line.split(": ", 1)[1])
        assert path.is_file() and path.suffix == suffix
    bad = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile",
                          str(MODELS["toy_two_kernels"]), "--target", "nope"],
                         capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and "unknown target 'nope'" in bad.stderr and "ort" in bad.stderr


def test_stop_after_emit_writes_the_sources_and_builds_nothing(tmp_path):
    from kernel_lens.targets.common.emit import render_launches

    m = load_module(MODELS["toy_two_kernels"])
    compiled = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path, stop_after="emit")
    src = tmp_path / "src"
    assert sorted(p.name for p in src.iterdir()) == sorted(ort_sources(compiled.ir, 29))
    assert (src / "kl_launches.cpp").read_text() == render_launches(compiled.ir)
    assert compiled.artifacts["ort.onnx"].is_file() and "ort.library" not in compiled.artifacts
    assert not list(tmp_path.glob("*.so"))
    assert compiled.timings[-1].name == "ptx-isa-clamp"  # every pass ran
    lowered = tmp_path / "lowered"
    only = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes,
                      targets=["ort"], output_dir=lowered, stop_after="lower")
    assert "ort.onnx" in only.artifacts and not (lowered / "src").exists()
    with pytest.raises(KernelLensError, match="give output_dir"):
        kl.compile(m.model, m.example_inputs, targets=["ort"], stop_after="emit")


def test_cli_stop_after_and_target_stages(tmp_path):
    cli = [sys.executable, "-m", "kernel_lens.cli"]
    proc = subprocess.run([*cli, "compile", str(MODELS["toy_two_kernels"]), "--target", "ort",
                           "--stop-after", "emit", "-o", str(tmp_path)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "ort.source.kl_launches.cpp: " in proc.stdout and (tmp_path / "src" / "kl_ort.cpp").is_file()
    assert not list(tmp_path.glob("*.so"))
    for args, message in ((["--target", "ort", "--stop-after", "link"], "its stages: lower, emit, build"),
                          (["--stop-after", "emit"], "give --target too")):
        bad = subprocess.run([*cli, "compile", str(MODELS["toy_two_kernels"]), *args, "-o",
                              str(tmp_path / "bad")], capture_output=True, text=True, timeout=600)
        assert bad.returncode == 2 and message in bad.stderr, bad.stderr
    listed = subprocess.run([*cli, "targets"], capture_output=True, text=True, timeout=300)
    assert "stages: lower -> emit -> build" in listed.stdout


@pytest.fixture(scope="module")
def third_party(tmp_path_factory):
    """Install the separate kl-c-launcher distribution into a private folder on sys.path."""
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(site), str(ROOT / "tests" / "third_party_target")], check=True)
    sys.path.insert(0, str(site))
    yield site
    sys.path.remove(str(site))


def test_third_party_target_via_entry_point(third_party, tmp_path):
    assert "c-launcher" in available_targets() and "ort" in available_targets()
    m = load_module(MODELS["toy_two_kernels"])
    compiled = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes,
                          targets=["c-launcher"], output_dir=tmp_path)
    lib = ctypes.CDLL(str(compiled.artifacts["c-launcher.library"]))
    P = ctypes.c_void_p
    lib.kl_c_launch.argtypes = [ctypes.c_int, P, ctypes.c_int, P, P, P, ctypes.c_int, P, P,
                                ctypes.c_char_p, ctypes.c_size_t]
    assert lib.kl_c_launch_count() == len(compiled.ir.launches) == 2
    # Launching on this host reaches the driver loader and fails cleanly, naming libcuda.
    err = ctypes.create_string_buffer(512)
    shape = (ctypes.c_int64 * 1)(1000)
    shapes = (ctypes.POINTER(ctypes.c_int64) * 1)(shape)
    ptrs = (ctypes.c_char_p * 1)(None)
    ranks, numel = (ctypes.c_int * 1)(1), (ctypes.c_int64 * 1)(1000)
    rc = lib.kl_c_launch(0, None, 1, ctypes.cast(ptrs, P), ctypes.cast(shapes, P), ctypes.cast(ranks, P),
                         1, ctypes.cast(ptrs, P), ctypes.cast(numel, P), err, 512)
    assert rc == 1 and b"libcuda.so.1" in err.value
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(third_party), *sys.path])}
    out = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "targets"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert "c-launcher" in out.stdout and "plain C launcher" in out.stdout
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile",
                           str(MODELS["toy_two_kernels"]), "--target", "c-launcher", "-o",
                           str(tmp_path / "cli")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "cli" / "libkl_ToyModel_c.so").is_file()
    assert "kernel_lens: c-launcher: build: " in proc.stderr  # issue 43: a third party's target reports


def test_artifacts_reused_from_the_cache_say_so(third_party, caplog):
    """Issue 43 item 2: a compile whose artifacts come from the cache says so (a progress line)."""
    import logging

    m = load_module(MODELS["toy_two_kernels"])
    with caplog.at_level(logging.INFO, logger="kernel_lens.progress"):
        for _ in range(2):
            compiled = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes,
                                  targets=["c-launcher"])
    reused = [r.getMessage() for r in caplog.records if "reused from cache" in r.getMessage()
              and r.getMessage().startswith("c-launcher: ")]
    assert len(reused) >= 1 and str(compiled.folder) in reused[-1], reused


def test_each_target_names_what_it_needs_for_each_stage():
    # doctor and the preflight print these names: what is missing, in the user's words
    from kernel_lens.targets.base import get_target

    names = lambda target, stop=None: [what for what, _ in get_target(target).requirements(stop)]  # noqa: E731
    assert names("ort") == ["C++ compiler", "ONNX Runtime headers"]
    assert names("ort", "emit") == ["ONNX Runtime headers"] and names("ort", "lower") == []
    assert names("trt") == ["C++ compiler", "TensorRT headers", "CUDA runtime headers"]
    assert names("trt", "emit") == ["TensorRT headers"] and names("trt", "lower") == []
