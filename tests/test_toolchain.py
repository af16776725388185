"""Toolchain: header fetching/lookup, compiler lookup, and the cached shared-library builder.

The headers are fetched once, into the default cache (so reruns are fast), by running
scripts/fetch_headers.py exactly as a user would. No GPU or CUDA driver is needed.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lens.errors import BuildError, ToolchainError
from kernel_lens.toolchain import build, compilers, headers
from kernel_lens.toolchain.build import build_shared_library

ROOT = Path(__file__).resolve().parents[1]
FETCH = ROOT / "scripts" / "fetch_headers.py"

ORT_SOURCE = r"""
#include "onnxruntime_cxx_api.h"

namespace {
float roundtrip(float x) { return Ort::Float16_t(x).ToFloat(); }
}  // namespace

extern "C" int kl_not_exported() { return 1; }  // hidden by -fvisibility=hidden

extern "C" __attribute__((visibility("default"))) int kl_ort_api_version() { return ORT_API_VERSION; }
extern "C" __attribute__((visibility("default"))) float kl_half_roundtrip(float x) { return roundtrip(x); }

// The shape of a custom-op library's entry point: links without libonnxruntime (-Wl,--no-undefined).
extern "C" __attribute__((visibility("default")))
OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  (void)options;
  Ort::InitApi(api_base->GetApi(ORT_API_VERSION));
  return nullptr;
}
"""

TRT_SOURCE = r"""
#include "NvInfer.h"
#include "NvInferRuntime.h"

namespace {
class CountingLogger final : public nvinfer1::ILogger {
 public:
  void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override {
    if (severity <= Severity::kWARNING && msg != nullptr) ++count;
  }
  int count = 0;
};
}  // namespace

extern "C" __attribute__((visibility("default"))) int kl_trt_version() {
  return NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH;
}

extern "C" __attribute__((visibility("default"))) int kl_trt_probe() {
  CountingLogger logger;
  nvinfer1::ILogger& base = logger;
  base.log(nvinfer1::ILogger::Severity::kERROR, "e");
  base.log(nvinfer1::ILogger::Severity::kINFO, "i");
  nvinfer1::Dims dims{};
  dims.nbDims = 3;
  return logger.count * 100 + dims.nbDims;  // 103
}
"""

SIMPLE_SOURCE = """extern "C" __attribute__((visibility("default"))) int kl_answer() { return 42; }\n"""


# --- headers ---

@pytest.fixture(scope="session")
def fetched():
    """Run scripts/fetch_headers.py once (default cache location) and parse what it prints."""
    proc = subprocess.run([sys.executable, str(FETCH)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"fetch_headers.py failed:\n{proc.stdout}\n{proc.stderr}"
    ort = re.search(r"^ORT_INCLUDE_DIR=(\S+)\s+\(ORT_API_VERSION (\d+)\)$", proc.stdout, re.M)
    trt = re.search(r"^TENSORRT_INCLUDE_DIR=(\S+)\s+\(TensorRT ([\d.]+)\)$", proc.stdout, re.M)
    assert ort and trt, proc.stdout
    return {"ort": Path(ort.group(1)), "ort_api": int(ort.group(2)),
            "trt": Path(trt.group(1)), "trt_version": trt.group(2)}


@pytest.fixture
def no_system_headers(monkeypatch):
    """Pretend no system-wide ONNX Runtime / TensorRT install exists."""
    monkeypatch.setattr(headers, "_system_ort_dirs", lambda: [])
    monkeypatch.setattr(headers, "_system_tensorrt_dirs", lambda: [])
    monkeypatch.delenv("ORT_INCLUDE_DIR", raising=False)
    monkeypatch.delenv("TENSORRT_INCLUDE_DIR", raising=False)


def test_fetch_headers_gives_ort_29_and_tensorrt_10_14_1(fetched):
    ort, trt = fetched["ort"], fetched["trt"]
    assert ort == headers.headers_cache_dir().absolute() / "onnxruntime"
    assert trt == headers.headers_cache_dir().absolute() / "tensorrt"
    assert fetched["ort_api"] == 29 and headers.ort_api_version(ort) == 29
    assert (ort / "onnxruntime_cxx_api.h").is_file() and (ort / "LICENSE").is_file()
    assert "MIT License" in (ort / "LICENSE").read_text()
    assert (trt / "NvInfer.h").is_file() and (trt / "NvInferRuntime.h").is_file()
    assert not (trt / "NvOnnxParser.h").exists()
    assert fetched["trt_version"] == "10.14.1" == headers.tensorrt_version(trt)
    assert "Apache-2.0" in (trt / "NvInferVersion.h").read_text()


def test_fetch_headers_is_idempotent(fetched):
    start = time.monotonic()
    proc = subprocess.run([sys.executable, str(FETCH)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "ONNX Runtime headers already in" in proc.stderr
    assert "TensorRT headers already in" in proc.stderr
    assert "npm pack" not in proc.stderr and "pip download" not in proc.stderr
    assert f"ORT_INCLUDE_DIR={fetched['ort']}" in proc.stdout
    assert time.monotonic() - start < 10


def test_find_includes_fall_back_to_the_fetch_cache(fetched, no_system_headers, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_HEADERS", str(fetched["ort"].parent))
    assert headers.find_ort_include() == fetched["ort"].resolve()
    assert headers.find_tensorrt_include() == fetched["trt"].resolve()


def test_include_env_vars_take_precedence(fetched, tmp_path, monkeypatch):
    monkeypatch.setattr(headers, "_system_ort_dirs", lambda: [tmp_path / "elsewhere"])
    monkeypatch.setenv("ORT_INCLUDE_DIR", str(fetched["ort"]))
    monkeypatch.setenv("TENSORRT_INCLUDE_DIR", str(fetched["trt"]))
    monkeypatch.setenv("KERNEL_LENS_HEADERS", str(tmp_path / "empty"))
    assert headers.find_ort_include() == fetched["ort"].resolve()
    assert headers.find_tensorrt_include() == fetched["trt"].resolve()


@pytest.mark.parametrize("var, find, marker", [
    ("ORT_INCLUDE_DIR", headers.find_ort_include, "onnxruntime_c_api.h"),
    ("TENSORRT_INCLUDE_DIR", headers.find_tensorrt_include, "NvInfer.h"),
    ("CUDA_INCLUDE_DIR", headers.find_cuda_include, "cuda_runtime_api.h"),
])
def test_env_var_pointing_at_folder_without_header(var, find, marker, tmp_path, monkeypatch):
    (tmp_path / "other.h").write_text("// not the header\n")
    monkeypatch.setenv(var, str(tmp_path))
    with pytest.raises(ToolchainError, match=rf"{var}=.*points to a folder without {re.escape(marker)}"):
        find()


def test_missing_headers_name_the_variable_and_the_fetch_script(no_system_headers, tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_HEADERS", str(tmp_path / "empty"))
    with pytest.raises(ToolchainError, match=r"ORT_INCLUDE_DIR") as exc:
        headers.find_ort_include()
    assert "python scripts/fetch_headers.py" in str(exc.value)
    assert str(tmp_path / "empty" / "onnxruntime") in str(exc.value)
    with pytest.raises(ToolchainError, match=r"TensorRT headers \(NvInfer\.h\) not found") as exc:
        headers.find_tensorrt_include()
    assert "TENSORRT_INCLUDE_DIR" in str(exc.value) and "scripts/fetch_headers.py" in str(exc.value)


def test_version_parsing_of_both_nvinferversion_layouts(tmp_path):
    legacy, modern = tmp_path / "legacy", tmp_path / "modern"
    legacy.mkdir()
    modern.mkdir()
    (legacy / "NvInferVersion.h").write_text(
        "#define NV_TENSORRT_MAJOR 8 //!< major\n#define NV_TENSORRT_MINOR 6\n"
        "#define NV_TENSORRT_PATCH 1 /* patch */\n#define NV_TENSORRT_BUILD 5\n")
    (modern / "NvInferVersion.h").write_text(
        "#define TRT_MAJOR_ENTERPRISE 10\n#define TRT_MINOR_ENTERPRISE 14\n#define TRT_PATCH_ENTERPRISE 1\n"
        "#define NV_TENSORRT_MAJOR TRT_MAJOR_ENTERPRISE //!< alias\n"
        "#define NV_TENSORRT_MINOR TRT_MINOR_ENTERPRISE\n#define NV_TENSORRT_PATCH TRT_PATCH_ENTERPRISE\n")
    assert headers.tensorrt_version(legacy) == "8.6.1"
    assert headers.tensorrt_version(modern) == "10.14.1"
    (tmp_path / "onnxruntime_c_api.h").write_text("// #define ORT_API_VERSION 1\n#define ORT_API_VERSION 23\n")
    assert headers.ort_api_version(tmp_path) == 23


# --- compilers ---

def test_missing_compiler_is_a_toolchain_error(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_CXX", "/nonexistent")
    with pytest.raises(ToolchainError, match=r"KERNEL_LENS_CXX=/nonexistent"):
        compilers.find_cxx()
    with pytest.raises(ToolchainError, match=r"KERNEL_LENS_CXX"):
        build_shared_library("x", {"x.cpp": SIMPLE_SOURCE}, include_dirs=[], cache_dir=tmp_path)


def test_no_compiler_on_path_names_the_variables(monkeypatch, tmp_path):
    for var in ("KERNEL_LENS_CXX", "CXX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolchainError, match=r"KERNEL_LENS_CXX.*CXX"):
        compilers.find_cxx()


def test_compiler_and_nvcc_lookup(monkeypatch):
    monkeypatch.delenv("KERNEL_LENS_CXX", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    cxx = compilers.find_cxx()
    assert os.path.isabs(cxx) and os.access(cxx, os.X_OK)
    ident = compilers.toolchain_id(cxx)
    assert ident and "\n" not in ident
    monkeypatch.setenv("KERNEL_LENS_NVCC", "/nonexistent/nvcc")
    with pytest.raises(ToolchainError, match="KERNEL_LENS_NVCC"):
        compilers.find_nvcc()
    monkeypatch.setenv("KERNEL_LENS_CCBIN", cxx)
    assert compilers.find_ccbin() == cxx


# --- building ---

def test_build_ort_custom_op_library(fetched, tmp_path):
    lib = build_shared_library("kl_ort_probe", {"probe.cpp": ORT_SOURCE}, include_dirs=[fetched["ort"]],
                               extra_flags=["-DORT_API_MANUAL_INIT"], cache_dir=tmp_path)
    assert lib.is_file() and lib.name == "kl_ort_probe.so" and lib.parent.parent == tmp_path
    dll = ctypes.CDLL(str(lib))
    assert dll.kl_ort_api_version() == 29
    dll.kl_half_roundtrip.restype = ctypes.c_float
    dll.kl_half_roundtrip.argtypes = [ctypes.c_float]
    assert dll.kl_half_roundtrip(1.5) == 1.5
    assert dll.kl_half_roundtrip(1.0 + 2.0 ** -12) == 1.0  # really went through float16
    assert hasattr(dll, "RegisterCustomOps")
    with pytest.raises(AttributeError):  # -fvisibility=hidden
        dll.kl_not_exported


def test_build_tensorrt_plugin_library(fetched, tmp_path):
    cuda = headers.find_cuda_include()
    lib = build_shared_library("kl_trt_probe", {"probe.cpp": TRT_SOURCE},
                               include_dirs=[fetched["trt"], cuda], cache_dir=tmp_path)
    dll = ctypes.CDLL(str(lib))
    assert dll.kl_trt_version() == 101401
    assert dll.kl_trt_probe() == 103


def test_tensorrt_builds_without_a_cuda_toolkit(fetched, tmp_path, monkeypatch):
    """Triton (a kernel_lens dependency) bundles cuda_runtime_api.h: enough for NvInfer.h."""
    for var in ("CUDA_INCLUDE_DIR", "CUDA_HOME", "CUDA_PATH", "CUDA_ROOT", "CONDA_PREFIX"):
        monkeypatch.delenv(var, raising=False)
    everywhere = headers._system_cuda_dirs
    monkeypatch.setattr(headers, "_system_cuda_dirs",
                        lambda: [d for d in everywhere() if "triton" in d.parts])
    cuda = headers.find_cuda_include()
    assert "triton" in cuda.parts
    lib = build_shared_library("kl_trt_probe", {"probe.cpp": TRT_SOURCE},
                               include_dirs=[fetched["trt"], cuda], cache_dir=tmp_path)
    assert ctypes.CDLL(str(lib)).kl_trt_probe() == 103


def test_warnings_in_generated_sources_are_errors(tmp_path):
    with pytest.raises(BuildError, match=r"gen\.cpp:1:\d+: error: unused parameter 'x'"):
        build_shared_library("warn", {"gen.cpp": "int f(int x) { return 0; }\n"},
                             include_dirs=[], cache_dir=tmp_path)


def test_cache_hit_does_not_invoke_the_compiler(tmp_path, monkeypatch):
    first = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[], cache_dir=tmp_path)
    mtime = first.stat().st_mtime_ns
    calls = []

    def no_compiler(cmd, *args, **kwargs):
        calls.append(cmd)
        raise AssertionError(f"compiler invoked on a cache hit: {cmd}")

    monkeypatch.setattr(subprocess, "run", no_compiler)
    second = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[], cache_dir=tmp_path)
    assert second == first and second.stat().st_mtime_ns == mtime and calls == []
    assert ctypes.CDLL(str(second)).kl_answer() == 42
    monkeypatch.undo()
    # Anything that changes the output changes the key.
    other_extra = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[],
                                       cache_dir=tmp_path, key_extra="sm_90")
    other_flags = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[],
                                       cache_dir=tmp_path, extra_flags=["-DX=1"])
    other_source = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE + "\n"}, include_dirs=[],
                                        cache_dir=tmp_path)
    assert len({first, other_extra, other_flags, other_source}) == 4


def test_cache_root_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "envcache"))
    lib = build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[])
    assert lib.parent.parent == tmp_path / "envcache"


def test_header_sources_are_written_and_checked(tmp_path):
    sources = {"kernel.h": "#pragma once\ninline int answer() { return 42; }\n",
               "main.cpp": '#include "kernel.h"\n'
                           'extern "C" __attribute__((visibility("default"))) int kl_answer() { return answer(); }\n'}
    lib = build_shared_library("withheader", sources, include_dirs=[], cache_dir=tmp_path)
    assert ctypes.CDLL(str(lib)).kl_answer() == 42


def test_compile_error_names_file_line_command_and_kept_sources(tmp_path):
    broken = 'extern "C" int ok() { return 1; }\n\nint broken() { return undeclared_name; }\n'
    with pytest.raises(BuildError) as exc:
        build_shared_library("broken_lib", {"good.cpp": SIMPLE_SOURCE, "broken.cpp": broken},
                             include_dirs=[], cache_dir=tmp_path)
    msg = str(exc.value)
    assert re.search(r"broken\.cpp:3:\d+: error: 'undeclared_name' was not declared", msg), msg
    assert "-Wall -Wextra -Werror" in msg and "-fvisibility=hidden" in msg and "-Wl,--no-undefined" in msg
    kept = Path(re.search(r"the failing sources are kept in (\S+)", msg).group(1))
    assert (kept / "broken.cpp").read_text() == broken and (kept / "good.cpp").is_file()
    assert "undeclared_name" in (kept / "stderr.txt").read_text()
    assert not list(tmp_path.glob("*/broken_lib.so")) and not list(tmp_path.glob("*/.broken_lib.*"))


def test_long_compiler_output_is_trimmed(tmp_path):
    body = "\n".join(f"int f{i}() {{ return undeclared{i}; }}" for i in range(80))
    with pytest.raises(BuildError) as exc:
        build_shared_library("many_errors", {"m.cpp": body}, include_dirs=[], cache_dir=tmp_path)
    msg = str(exc.value)
    assert "more lines in" in msg and "stderr.txt" in msg
    assert len(msg.splitlines()) < build.MAX_STDERR_LINES + 10


def _concurrent_worker(cache_dir: str, barrier, queue) -> None:
    barrier.wait()
    try:
        queue.put(str(build_shared_library("shared", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[],
                                           cache_dir=Path(cache_dir))))
    except BaseException as exc:  # reported to the parent
        queue.put(f"error: {exc!r}")


def test_two_processes_building_the_same_key(tmp_path, monkeypatch):
    # A compiler wrapper that logs each real compilation and is slow, so the two builds overlap.
    real_cxx = compilers.find_cxx()
    calls = tmp_path / "calls.log"
    wrapper = tmp_path / "slow-cxx"
    wrapper.write_text(f'#!/bin/sh\ncase "$1" in --version) exec "{real_cxx}" "$@";; esac\n'
                       f'echo build >> "{calls}"\nsleep 1\nexec "{real_cxx}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("KERNEL_LENS_CXX", str(wrapper))
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_worker, args=(str(tmp_path / "cache"), barrier, queue))
             for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1] and not results[0].startswith("error"), results
    assert calls.read_text().splitlines() == ["build"]  # the second waited and reused the library
    assert ctypes.CDLL(results[0]).kl_answer() == 42
    assert [p.name for p in Path(results[0]).parent.iterdir()] in (["shared.so", ".lock"],
                                                                    [".lock", "shared.so"])
