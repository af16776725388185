"""Toolchain: header fetching/lookup, compiler lookup, and the cached shared-library builder.

The headers are fetched once, into the default cache (so reruns are fast), by running
scripts/fetch_headers.py exactly as a user would. No GPU or CUDA driver is needed.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import multiprocessing
import os
import re
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lens.errors import BuildError, CacheError, ToolchainError
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

    from kernel_lens.toolchain import build
    monkeypatch.setattr(build, "run_group", no_compiler)
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
    lib = Path(results[0])
    assert sorted(p.name for p in lib.parent.iterdir()) == [".lock", "shared.so", "shared.so.sha256"]
    assert (lib.parent / "shared.so.sha256").read_text() == \
        f"{hashlib.sha256(lib.read_bytes()).hexdigest()}  shared.so\n"


# --- cache hardening: only what this user wrote is reused ---

OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture
def compiles(monkeypatch):
    """Records each real compilation (the toolchain id is cached, so only builds run g++)."""
    from kernel_lens.toolchain import build

    calls = []
    real_run = build.run_group

    def counting_run(cmd, *args, **kwargs):
        if "-shared" in cmd:
            calls.append(cmd)
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(build, "run_group", counting_run)
    return calls


def _simple(cache, **kwargs):
    return build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[], cache_dir=cache,
                                **kwargs)


def _record_ok(lib):
    record = lib.with_name(lib.name + ".sha256")
    st = os.lstat(record)
    return (stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid()
            and record.read_text().split()[0] == hashlib.sha256(lib.read_bytes()).hexdigest())


def test_symlink_at_library_path_is_not_followed_nor_reused(tmp_path, compiles, caplog):
    cache = tmp_path / "cache"
    lib = _simple(cache)
    # The link points at a byte-identical copy, so only refusing the link itself catches it.
    victim = tmp_path / "victim.so"
    victim_bytes = lib.read_bytes()
    victim.write_bytes(victim_bytes)
    victim_stat = victim.stat()
    lib.unlink()
    lib.symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="kernel_lens.toolchain.build"):
        again = _simple(cache)
    assert again == lib and not lib.is_symlink() and stat.S_ISREG(os.lstat(lib).st_mode)
    assert len(compiles) == 2  # rebuilt
    assert victim.read_bytes() == victim_bytes and victim.stat().st_ino == victim_stat.st_ino
    assert victim.stat().st_mtime_ns == victim_stat.st_mtime_ns
    assert _record_ok(lib)
    assert f"{lib}: it is a symbolic link" in caplog.text


@pytest.mark.parametrize("tamper, why", [
    ("alter_bytes", "does not match the hash recorded"),
    ("chown_lib", f"owned by uid {OTHER_UID}, not by the current user"),
    ("chown_record", f"owned by uid {OTHER_UID}, not by the current user"),
    ("group_writable_lib", "writable by group or others"),
    ("world_writable_record", "writable by group or others"),
    ("no_record", "no content hash was recorded"),
    ("record_is_a_link", "it is a symbolic link"),
])
def test_untrusted_cache_entry_is_rebuilt(tamper, why, tmp_path, compiles, caplog):
    if tamper.startswith("chown") and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    cache = tmp_path / "cache"
    lib = _simple(cache)
    record = lib.with_name("simple.so.sha256")
    good = lib.read_bytes()
    if tamper == "alter_bytes":  # same size, same inode: only the content hash tells
        with open(lib, "r+b") as fh:
            fh.seek(len(good) - 1)
            fh.write(bytes([good[-1] ^ 0xFF]))
    elif tamper == "chown_lib":
        os.chown(lib, OTHER_UID, -1)
    elif tamper == "chown_record":
        os.chown(record, OTHER_UID, -1)
    elif tamper == "group_writable_lib":
        lib.chmod(0o775)
    elif tamper == "world_writable_record":
        record.chmod(0o666)
    elif tamper == "no_record":
        record.unlink()
    elif tamper == "record_is_a_link":
        fake = tmp_path / "fake.sha256"
        fake.write_text(record.read_text())  # a correct hash, but not a file this cache wrote
        record.unlink()
        record.symlink_to(fake)
    with caplog.at_level(logging.WARNING, logger="kernel_lens.toolchain.build"):
        again = _simple(cache)
    assert again == lib and len(compiles) == 2, caplog.text  # not reused: rebuilt
    assert why in caplog.text and "rebuilding" in caplog.text
    st = os.lstat(lib)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert _record_ok(lib) and not record.is_symlink()
    assert ctypes.CDLL(str(lib)).kl_answer() == 42
    caplog.clear()
    _simple(cache)  # and the rebuilt entry is trusted again
    assert len(compiles) == 2 and "rebuilding" not in caplog.text


@pytest.mark.parametrize("target_exists", [True, False])
def test_symlink_at_lock_path_is_a_cache_error(target_exists, tmp_path, compiles):
    cache = tmp_path / "cache"
    lib = _simple(cache)
    lib.unlink()  # so the next call must take the lock to rebuild
    victim = tmp_path / "victim"
    if target_exists:
        victim.write_text("precious\n")
        victim.chmod(0o644)
    lock = lib.parent / ".lock"
    lock.unlink()
    lock.symlink_to(victim)
    with pytest.raises(CacheError, match=r"lock file .*\.lock: it is a symbolic link"):
        _simple(cache)
    assert lock.is_symlink() and not lib.exists() and len(compiles) == 1
    if target_exists:
        assert victim.read_text() == "precious\n" and stat.S_IMODE(victim.stat().st_mode) == 0o644
    else:
        assert not victim.exists()  # O_CREAT did not go through the link


@pytest.mark.parametrize("where", ["root_link", "root_world_writable", "root_other_user",
                                   "key_link", "key_other_user", "key_world_writable",
                                   "key_group_writable"])
def test_untrusted_cache_folders_are_refused(where, tmp_path, monkeypatch):
    if "other_user" in where and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    real = tmp_path / "real"
    lib = _simple(real)
    key_dir = lib.parent
    cache = real
    if where == "root_link":
        cache = tmp_path / "link"
        cache.symlink_to(real)
    elif where == "root_world_writable":
        real.chmod(0o777)
    elif where == "root_other_user":
        os.chown(real, OTHER_UID, -1)
    elif where == "key_link":
        elsewhere = tmp_path / "elsewhere"
        key_dir.rename(elsewhere)
        key_dir.symlink_to(elsewhere)
    elif where == "key_other_user":
        os.chown(key_dir, OTHER_UID, -1)
    elif where == "key_world_writable":
        key_dir.chmod(0o777)
    elif where == "key_group_writable":
        key_dir.chmod(0o775)
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(cache))
    with pytest.raises(CacheError, match=r"refusing the build cache .*KERNEL_LENS_CACHE") as exc:
        build_shared_library("simple", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[])
    shown = cache if where.startswith("root") else cache / key_dir.name
    assert str(shown) in str(exc.value)


@pytest.mark.parametrize("mode", [0o1777, 0o775])
def test_sticky_world_writable_or_group_writable_root_is_refused(mode, tmp_path):
    # docs/security.md: a cache root anyone else can write is refused, sticky bit or not
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache").chmod(mode)
    with pytest.raises(CacheError, match=rf"refusing the build cache root .*mode {mode:o}.*KERNEL_LENS_CACHE"):
        _simple(tmp_path / "cache")
    assert not any((tmp_path / "cache").iterdir())


def test_header_contents_change_the_key_even_at_the_same_size_and_mtime(tmp_path):
    inc = tmp_path / "inc"
    (inc / "sub").mkdir(parents=True)
    header = inc / "sub" / "v.h"
    header.write_text("#define KL_V 1\n")
    src = {"v.cpp": '#include <sub/v.h>\n'
                    'extern "C" __attribute__((visibility("default"))) int kl_v() { return KL_V; }\n'}
    first_print = headers.header_fingerprint(inc)
    first = build_shared_library("hv", src, include_dirs=[inc], cache_dir=tmp_path / "cache")
    assert ctypes.CDLL(str(first)).kl_v() == 1
    before = header.stat()
    header.write_text("#define KL_V 2\n")  # same size
    os.utime(header, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the same mtime
    assert header.stat().st_size == before.st_size and header.stat().st_mtime_ns == before.st_mtime_ns
    assert headers.header_fingerprint(inc) != first_print
    second = build_shared_library("hv", src, include_dirs=[inc], cache_dir=tmp_path / "cache")
    assert second.parent != first.parent
    assert ctypes.CDLL(str(second)).kl_v() == 2


def test_header_fingerprint_hashes_contents_and_relative_names(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for root, text in ((a, "int x;\n"), (b, "int x;\n")):
        (root / "deep" / "er").mkdir(parents=True)
        (root / "deep" / "er" / "h.hpp").write_text(text)
        (root / "vector").write_text("// extensionless header\n")
    assert headers.header_fingerprint(a) == headers.header_fingerprint(b)  # not the folder's path
    (b / "deep" / "er" / "h.hpp").write_text("int y;\n")
    assert headers.header_fingerprint(a) != headers.header_fingerprint(b)
    (b / "deep" / "er" / "h.hpp").write_text("int x;\n")
    assert headers.header_fingerprint(a) == headers.header_fingerprint(b)
    (b / "vector").rename(b / "deep" / "vector")  # same bytes, other name
    assert headers.header_fingerprint(a) != headers.header_fingerprint(b)


@pytest.mark.parametrize("var, value", [("CPATH", "{tmp}/extra_include"), ("CXXFLAGS", "-DKL_EXTRA=1"),
                                        ("SOURCE_DATE_EPOCH", "1700000000")])
def test_compiler_environment_is_part_of_the_key(var, value, tmp_path, monkeypatch):
    (tmp_path / "extra_include").mkdir()
    for name in build.KEY_ENV_VARS:
        if name not in ("CXX", "KERNEL_LENS_CXX"):
            monkeypatch.delenv(name, raising=False)
    first = _simple(tmp_path / "cache")
    monkeypatch.setenv(var, value.format(tmp=tmp_path))
    second = _simple(tmp_path / "cache")
    assert second.parent != first.parent
    monkeypatch.delenv(var)
    assert _simple(tmp_path / "cache") == first


def test_toolchain_id_identifies_the_binary_not_just_its_version(tmp_path):
    ids = []
    for name in ("cxx-a", "cxx-b"):
        script = tmp_path / name
        script.write_text(f"#!/bin/sh\n# {name}\necho 'g++ (Fake) 1.0'\n")
        script.chmod(0o755)
        ids.append(compilers.toolchain_id(str(script)))
    assert ids[0] != ids[1] and all(i.startswith("g++ (Fake) 1.0") and "\n" not in i for i in ids)
    assert str(tmp_path / "cxx-a") in ids[0]
    (tmp_path / "cxx-a").write_text("#!/bin/sh\n# changed in place\necho 'g++ (Fake) 1.0'\n")
    assert compilers.toolchain_id(str(tmp_path / "cxx-a")) != ids[0]


def test_relative_path_entries_never_supply_a_compiler(tmp_path, monkeypatch):
    """A planted ./g++ (or ./nvcc, ./ptxas) in the current folder is not run through an empty or
    relative PATH entry (doctor and the build both look compilers up)."""
    import shutil as _shutil

    from kernel_lens.toolchain.compilers import find_cxx, find_nvcc
    from kernel_lens.toolchain.ptx_isa import find_ptxas

    for name in ("g++", "nvcc", "ptxas"):
        planted = tmp_path / name
        planted.write_text("#!/bin/sh\ntouch planted-ran\n")
        planted.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KERNEL_LENS_CXX", raising=False)
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("KERNEL_LENS_NVCC", raising=False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    real = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if os.path.isabs(p))
    for path in (f".{os.pathsep}{real}", f"{os.pathsep}{real}", f"bin{os.pathsep}.{os.pathsep}{real}"):
        monkeypatch.setenv("PATH", path)
        if path.startswith("."):  # the plain lookup runs the planted one
            assert Path(_shutil.which("g++")).resolve().parent == tmp_path.resolve()
        cxx = find_cxx()
        assert Path(cxx).resolve().parent != tmp_path.resolve(), cxx
        for found in (find_nvcc(), find_ptxas()):
            assert found is None or Path(found).resolve().parent != tmp_path.resolve(), found


@pytest.mark.parametrize("spoil", ["world-writable folder", "sticky world-writable folder",
                                   "group-writable header", "another user's folder"])
def test_an_include_folder_someone_else_can_edit_is_not_compiled_in(spoil, tmp_path):
    """issue 30, item 4: headers compiled into a library follow fetch-headers' trust rule."""
    include = tmp_path / "include"
    include.mkdir()
    header = include / "kl_spoiled.h"
    header.write_text("#define KL_SPOILED 1\n")
    header.chmod(0o644)
    include.chmod(0o755)
    if spoil == "world-writable folder":
        include.chmod(0o777)
    elif spoil == "sticky world-writable folder":
        include.chmod(0o1777)
    elif spoil == "group-writable header":
        header.chmod(0o664)
    else:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(include, 4321, 4321)
    sources = {"a.cpp": '#include "kl_spoiled.h"\nextern "C" int kl_a() { return KL_SPOILED; }\n'}
    with pytest.raises(BuildError, match=r"include folder .* is not trusted: .*(writable by group or "
                                         r"others|owned by uid 4321)"):
        build_shared_library("kl_spoiled", sources, include_dirs=[include], cache_dir=tmp_path / "cache")
    include.chmod(0o755)
    header.chmod(0o644)
    os.chown(include, os.geteuid(), os.getegid())
    assert build_shared_library("kl_spoiled", sources, include_dirs=[include],
                                cache_dir=tmp_path / "cache").is_file()


def _spoiled(folder, how: str) -> None:
    """``folder`` made "another user's" (uid 4321: needs root, else the test is skipped),
    "world-writable" (0777) or "sticky world-writable" (1777, as /tmp)."""
    folder.chmod(0o755)
    if how == "another user's":
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
        os.chown(folder, 4321, 4321)
    else:
        folder.chmod(0o777 if how == "world-writable" else 0o1777)


@pytest.mark.parametrize("parent", ["another user's", "world-writable", "sticky world-writable"])
def test_a_cache_root_whose_parent_someone_else_can_write_is_refused(parent, tmp_path, monkeypatch):
    """issue 30, item 3: a user owning (or able to write) the folder holding the cache root could
    swap the root between its check and its use; such a root is refused, /tmp-like is fine."""
    from kernel_lens.toolchain import cache as kl_cache

    holder = tmp_path / "holder"
    holder.mkdir()
    _spoiled(holder, parent)
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(holder / "cache"))
    if parent == "sticky world-writable":
        assert kl_cache.cache_folder("aot").is_dir()
        return
    with pytest.raises(CacheError, match=r"the folder holding it .*(owned by uid 4321|without the sticky bit)"):
        kl_cache.cache_folder("aot")


@pytest.mark.parametrize("user", ["kernel cache", "plugin-library cache"])
@pytest.mark.parametrize("above", ["world-writable", "another user's"])
def test_a_cache_root_with_a_folder_above_its_parent_others_can_write_is_refused(above, user, tmp_path,
                                                                                 monkeypatch):
    """Issue 42 item 5: whoever can write any folder on the way to the cache root can swap the
    whole subtree; refused for the small-entry caches and for the plugin libraries alike (a
    sticky /tmp-like folder on the way is fine: the root itself is private)."""
    from kernel_lens.toolchain import cache as kl_cache

    top = tmp_path / "top"
    (top / "mine").mkdir(parents=True)
    (top / "mine").chmod(0o755)
    _spoiled(top, above)
    root = top / "mine" / "cache"
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(root))
    use = (lambda: kl_cache.cache_folder("aot")) if user == "kernel cache" else \
        (lambda: build_shared_library("kl_above", {"a.cpp": SIMPLE_SOURCE}, include_dirs=[]))
    with pytest.raises(CacheError, match=rf"refusing the build cache root {root}: .*\({top}, above it\) is "
                                         r"(owned by uid 4321|writable by group or others without the sticky bit)"):
        use()
    top.chmod(0o1777)  # sticky, as /tmp: the folders below it cannot be renamed by others
    if above == "another user's":
        os.chown(top, os.geteuid(), os.getegid())
    assert use().exists()
