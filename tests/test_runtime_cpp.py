"""The C++ runtime (kl_runtime.h) on a CPU-only host, through the fake CUDA driver.

tests/fake_cuda/fake_cuda.c stands in for libcuda.so.1 (loaded through the test-only
KERNEL_LENS_TEST_CUDA_DRIVER variable, docs/testing.md) and records module loads, unloads,
context pushes and launches; tests/fake_cuda/harness.cpp drives kl::launch, kl::ModuleCache,
kl::ContextGuard, kl::copy_device and the rank checks over host buffers, one scenario per
process, printing ``key=value`` lines asserted on here. The harness is built warning-free
(-Wall -Wextra -Werror) and once more under AddressSanitizer + UBSan; every scenario runs on both.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import ROOT

FAKE = ROOT / "tests" / "fake_cuda"
RUNTIME = ROOT / "src" / "kernel_lens" / "targets" / "common"
WARNINGS = ["-Wall", "-Wextra", "-Werror"]
SANITIZE = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def _tool(*names: str) -> str:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    pytest.fail(f"none of {names} on PATH: the runtime tests need gcc and g++")


def _build(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr}"


@pytest.fixture(scope="session")
def fake_drivers(tmp_path_factory) -> dict[str, Path]:
    """The fake driver, and a variant without cuCtxGetId (a pre-12.0 driver)."""
    out = tmp_path_factory.mktemp("fake_cuda")
    cc = _tool("gcc", "cc")
    libs = {"full": out / "libfake_cuda.so", "no_ctx_id": out / "libfake_cuda_no_ctx_id.so"}
    _build([cc, "-std=c11", "-O1", "-shared", "-fPIC", *WARNINGS, str(FAKE / "fake_cuda.c"), "-o", str(libs["full"])])
    _build([cc, "-std=c11", "-O1", "-shared", "-fPIC", *WARNINGS, "-DFAKE_NO_CTX_GET_ID", str(FAKE / "fake_cuda.c"),
            "-o", str(libs["no_ctx_id"])])
    return libs


@pytest.fixture(scope="session", params=["plain", "sanitized"])
def harness(request, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp(f"harness_{request.param}")
    exe = out / "harness"
    flags = ["-O1"] if request.param == "plain" else ["-O1", *SANITIZE]
    _build([_tool("g++", "c++"), "-std=c++17", *flags, *WARNINGS, f"-I{RUNTIME}", str(FAKE / "harness.cpp"),
            "-o", str(exe), "-ldl"])
    return exe


@pytest.fixture(scope="session")
def toy_launches(tmp_path_factory) -> Path:
    """The generated kl_launches.cpp of the toy example model (two kernels, dynamic length)."""
    import kernel_lens as kl
    from kernel_lens.targets.common.emit import render_launches

    from conftest import EXAMPLES, load_module

    m = load_module(EXAMPLES / "toy_two_kernels.py")
    ir = kl.compile(m.model, tuple(t.clone() for t in m.example_inputs), dynamic_shapes=m.dynamic_shapes,
                    arch=90).ir
    path = tmp_path_factory.mktemp("toy") / "kl_launches.cpp"
    path.write_text(render_launches(ir))
    return path


@pytest.fixture(scope="session", params=["plain", "sanitized"])
def generated_harness(request, tmp_path_factory, toy_launches) -> Path:
    """The harness linked with the toy model's generated launches (kl::run_launch)."""
    exe = tmp_path_factory.mktemp(f"gen_harness_{request.param}") / "harness"
    flags = ["-O1"] if request.param == "plain" else ["-O1", *SANITIZE]
    _build([_tool("g++", "c++"), "-std=c++17", *flags, *WARNINGS, "-DKL_HARNESS_GENERATED", f"-I{RUNTIME}",
            str(FAKE / "harness.cpp"), str(toy_launches), "-o", str(exe), "-ldl"])
    return exe


def run(harness: Path, scenario: str, driver: Path | str) -> dict[str, str]:
    env = {**os.environ, "KERNEL_LENS_TEST_CUDA_DRIVER": str(driver),
           "ASAN_OPTIONS": "abort_on_error=0:halt_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    proc = subprocess.run([str(harness), scenario], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, f"harness {scenario} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "runtime error" not in proc.stderr and "Sanitizer" not in proc.stderr, proc.stderr
    values = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    return values


def test_module_cache_is_keyed_by_context_id_not_address(harness, fake_drivers):
    r = run(harness, "cache", fake_drivers["full"])
    assert r["status"] == ""
    assert r["loads_same_id"] == "1"       # same context, same id: loaded once
    assert r["loads_new_id"] == "2"        # same address, new id (recreated context): loaded again
    assert r["loads_new_id_again"] == "2"  # ... and cached for the new id
    assert r["launches"] == "4"
    assert r["id_fail_status"] == "kernel add_kernel: cuCtxGetId: CUDA_ERROR_INVALID_CONTEXT"


def test_context_guard_pushes_and_pops_the_streams_context(harness, fake_drivers):
    r = run(harness, "push_pop", fake_drivers["full"])
    assert r["status"] == "" and r["launches"] == "1"
    assert (r["pushes"], r["pops"], r["depth"], r["current_is_a"]) == ("1", "1", "1", "1")


def test_failed_context_push_is_an_error_and_nothing_runs(harness, fake_drivers):
    r = run(harness, "push_fail", fake_drivers["full"])
    why = "cuCtxPushCurrent failed to make the stream's CUDA context current: CUDA_ERROR_INVALID_CONTEXT"
    assert r["guard_error"] == why
    assert r["status"] == f"kernel add_kernel: {why}"
    assert r["copy_status"] == f"kernel_lens: copying an in-place tensor: {why}"
    assert (r["launches"], r["loads"], r["copies"], r["copied"], r["scratch_calls"]) == ("0", "0", "0", "0", "0")
    assert (r["pushes"], r["pops"], r["depth"]) == ("0", "0", "1")


def test_no_context_is_a_clear_error(harness, fake_drivers):
    r = run(harness, "no_context", fake_drivers["full"])
    assert "no CUDA context to launch in" in r["status"]
    assert "cuStreamGetCtx failed with CUDA_ERROR_INVALID_CONTEXT" in r["status"]
    assert "cuCtxGetCurrent found no current context" in r["status"]
    assert r["launches"] == "0" and r["loads"] == "0"


def test_scratch_and_grid_overflow_are_errors_and_nothing_runs(harness, fake_drivers):
    r = run(harness, "overflow", fake_drivers["full"])
    assert r["global_status"] == ("kernel add_kernel: global scratch of 1099511627776 bytes per program for "
                                  "16777216 programs (grid (16777216, 1, 1)) overflows size_t")
    assert r["profile_status"].startswith("kernel add_kernel: profile scratch of 1099511627776 bytes")
    assert r["profile_status"].endswith("overflows size_t")
    assert r["ctas_status"] == ("kernel add_kernel: grid (4611686018427387903, 1, 1) with num_ctas 4 "
                                "exceeds CUDA's limits")
    assert r["grid_status"].endswith("with num_ctas 4 exceeds CUDA's limits")
    assert r["scratch_calls"] == "0"
    # Without overflow the same binary asks for its exact scratch size (2 programs x 2^40 bytes).
    assert r["small_scratch"] == str(2 << 40) and r["small_status"].startswith("harness: refusing")
    assert r["launches"] == "0"


def test_rank_checks_name_the_launch_input_and_rank(harness, fake_drivers):
    r = run(harness, "rank", fake_drivers["full"])
    assert r["ok_status"] == ""
    assert r["rank_status"] == ("kernel_lens launch 3 (add_kernel): input 1 has rank 1, the model was "
                                "compiled for rank 2")
    assert r["count_status"] == "kernel_lens launch 3 (add_kernel): the node has 2 inputs, the model was compiled for 3"
    assert r["dim_error"].startswith("input 1 has rank 1, but the model reads its dim 1")
    assert r["dim_input_error"] == "input 2 does not exist: the node has 2 inputs"
    assert r["input_error"] == "input 5 does not exist: the node has 2 inputs"
    assert r["dim_ok"] == "8"
    assert "dim" not in r and "input" not in r


def test_ort_context_uses_the_checked_rank_helpers():
    # OrtLaunchContext needs a running ONNX Runtime CUDA EP to instantiate; check that it reads
    # dims and inputs through the helpers the harness tests, not through vector::at.
    text = (ROOT / "src" / "kernel_lens" / "targets" / "ort" / "kl_ort.cpp.j2").read_text()
    assert "kl::checked_dim(shapes_, input, d)" in text and "kl::checked_input(data_, i)" in text
    assert "shapes_.at(" not in text and "data_.at(" not in text
    assert "{{" not in text.splitlines()[0]  # no user text in the first-line comment


def test_get_function_failure_unloads_the_module(harness, fake_drivers):
    r = run(harness, "get_function_fail", fake_drivers["full"])
    assert r["status"] == "kernel add_kernel: cuModuleGetFunction: CUDA_ERROR_NOT_FOUND"
    assert (r["loads"], r["unloads"], r["live_modules"], r["last_unloaded"]) == ("1", "1", "0", "0")
    assert r["launches"] == "0"


def test_shared_memory_above_optin_is_refused_and_unloaded(harness, fake_drivers):
    r = run(harness, "shared", fake_drivers["full"])
    assert r["too_much_status"] == ("kernel add_kernel: needs 307200 bytes of shared memory, the device allows "
                                    f"{227 * 1024}")
    assert r["too_much_unloads"] == "1"
    assert r["big_status"] == "" and r["func_attribute"] == str(100 * 1024)
    assert r["launches"] == "1"


def test_normal_launch_records_grid_block_shared_and_params(harness, fake_drivers):
    r = run(harness, "normal", fake_drivers["full"])
    assert r["status"] == ""
    assert (r["grid"], r["block"], r["shared"]) == ("3,2,1", "128,1,1", "1024")
    assert r["scratch_sizes"] == str(64 * 6)  # global scratch per program x 6 programs
    expected = (bytes.fromhex(r["x_ptr"]) + struct.pack("<i", 1234) + bytes.fromhex(r["scratch_ptr"]) +
                bytes(8))  # no profile scratch: a null pointer
    assert bytes.fromhex(r["params"]) == expected
    assert r["image"] == "KLCUBIN-sm90-fak" and r["image_is_cubin"] == "1"
    assert r["function"] == "add_kernel_entry"
    assert r["zero_grid_status"] == ""  # nothing launched for an empty grid
    assert r["negative_grid_status"] == "kernel add_kernel: negative grid (-1, 2, 1)"
    assert (r["launches"], r["loads"]) == ("1", "1")


def test_normal_launch_goes_through_cuLaunchKernel(harness, fake_drivers):
    assert run(harness, "normal", fake_drivers["full"])["attrs"] == "cuLaunchKernel"


def test_launch_pdl_and_cooperative_grid_launch_with_triton_s_attributes(harness, fake_drivers):
    """Triton launches a kernel compiled with launch_pdl / launch_cooperative_grid by
    cuLaunchKernelEx with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) / COOPERATIVE
    (2) set to 1; the runtime does the same, with grid, block, shared memory and parameters as
    a plain launch has them."""
    r = run(harness, "launch_attrs", fake_drivers["full"])
    assert [r[f"{n}_status"] for n in ("plain", "pdl", "cooperative", "both")] == [""] * 4
    assert r["plain_attrs"] == "cuLaunchKernel"
    assert r["pdl_attrs"] == "cuLaunchKernelEx:6=1"
    assert r["cooperative_attrs"] == "cuLaunchKernelEx:2=1"
    assert r["both_attrs"] == "cuLaunchKernelEx:6=1:2=1"
    assert r["plain_launch"] == "3,2,1/128,1,1/1024"
    for n in ("pdl", "cooperative", "both"):
        assert r[f"{n}_launch"] == r["plain_launch"], n
        # x and n as a plain launch has them, then a scratch buffer of its own, no profile scratch
        params, plain = bytes.fromhex(r[f"{n}_params"]), bytes.fromhex(r["plain_params"])
        assert len(params) == len(plain) == 28 and params[:12] == plain[:12] and params[20:] == bytes(8), n
        assert params[12:20] != bytes(8), n
    assert r["zero_grid_status"] == ""  # an empty grid launches nothing, as without attributes
    assert r["failed_status"] == "kernel add_kernel: cuLaunchKernelEx: CUresult 719"
    assert r["launches"] == "4"


def test_launch_config_has_cuda_h_s_layout(tmp_path):
    """kl_runtime.h declares CUlaunchConfig and CUlaunchAttribute itself (no CUDA header is needed
    to build a plugin); their layout is cuda.h's (Triton's wheel ships one)."""
    import triton

    include = Path(triton.__file__).parent / "backends" / "nvidia" / "include"
    assert (include / "cuda.h").is_file()
    src = tmp_path / "layout.cpp"
    fields = ["gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ",
              "sharedMemBytes", "hStream", "attrs", "numAttrs"]
    checks = [f"static_assert(offsetof(kl::CUlaunchConfig, {f}) == offsetof(::CUlaunchConfig, {f}), \"{f}\");"
              for f in fields]
    checks += [
        "static_assert(sizeof(kl::CUlaunchConfig) == sizeof(::CUlaunchConfig), \"config\");",
        "static_assert(sizeof(kl::CUlaunchAttribute) == sizeof(::CUlaunchAttribute), \"attribute\");",
        "static_assert(offsetof(kl::CUlaunchAttribute, value) == offsetof(::CUlaunchAttribute, value), \"value\");",
        "static_assert(kl::kLaunchAttrCooperative == CU_LAUNCH_ATTRIBUTE_COOPERATIVE, \"cooperative\");",
        "static_assert(kl::kLaunchAttrProgrammaticSerialization == "
        "CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, \"pdl\");",
        "static_assert(offsetof(::CUlaunchAttributeValue, programmaticStreamSerializationAllowed) == 0, \"flag\");",
        "static_assert(offsetof(::CUlaunchAttributeValue, cooperative) == 0, \"flag\");",
    ]
    src.write_text("#include <cstddef>\n#include <cuda.h>\n#include \"kl_runtime.h\"\n" + "\n".join(checks)
                   + "\nint main() { return 0; }\n")
    _build([_tool("g++", "c++"), "-std=c++17", "-fsyntax-only", *WARNINGS, f"-I{include}", f"-I{RUNTIME}",
            str(src)])


def test_ptx_is_loaded_for_another_arch(harness, fake_drivers):
    r = run(harness, "ptx_fallback", fake_drivers["full"])
    assert r["status"] == "" and r["image_is_ptx"] == "1" and r["launches"] == "1"


def test_copy_device_copies_in_the_streams_context(harness, fake_drivers):
    r = run(harness, "copy", fake_drivers["full"])
    assert r["status"] == "" and r["copied"] == "7"


def test_driver_override_names_the_library_and_missing_entry_points(harness, fake_drivers, tmp_path):
    r = run(harness, "driver_only", tmp_path / "nowhere.so")
    assert r["status"].startswith(f"kernel_lens: cannot load the CUDA driver {tmp_path / 'nowhere.so'} (")
    r = run(harness, "driver_only", fake_drivers["no_ctx_id"])
    assert r["status"] == (f"kernel_lens: the CUDA driver {fake_drivers['no_ctx_id']} lacks the entry point "
                           "cuCtxGetId; update the NVIDIA driver (CUDA 12.0 or newer is required)")
    assert run(harness, "driver_only", fake_drivers["full"])["status"] == "ok"


# ---- the generated launch code (kl::run_launch of a real model) through the fake driver --------
def test_generated_launch_runs_through_the_fake_driver(generated_harness, fake_drivers):
    r = run(generated_harness, "gen_ok", fake_drivers["full"])
    assert r["launch_count"] == "2" and r["status"] == ""
    assert r["grid"] == "4,1,1"  # cdiv(1000, 256)
    assert r["params"] == r["expected_params"]  # x, y and the output buffer, in ABI order
    assert (r["launches"], r["loads"], r["pushes"], r["pops"]) == ("1", "1", "0", "0")


def test_generated_launch_reports_a_failed_context_push(generated_harness, fake_drivers):
    # run_launch's own guard does not stop it; the guard inside kl::launch reports the failure.
    r = run(generated_harness, "gen_push_fail", fake_drivers["full"])
    assert r["status"] == ("kernel add_kernel: cuCtxPushCurrent failed to make the stream's CUDA context "
                           "current: CUDA_ERROR_INVALID_CONTEXT")
    assert (r["launches"], r["loads"]) == ("0", "0")


def test_generated_launch_reports_an_input_of_the_wrong_rank(generated_harness, fake_drivers):
    # Before any dim is read (a rank check in the generated code), or when dim() is read past the
    # rank (the context's RankError, which a target turns into its error status): never vector::at.
    r = run(generated_harness, "gen_rank", fake_drivers["full"])
    text = r.get("status") or r.get("exception", "")
    assert "input 0 has rank 0" in text, r
    assert r["launches"] == "0"
