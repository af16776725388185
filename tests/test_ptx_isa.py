"""PTX ISA lowering, checked against real Triton PTX and the real ptxas (no GPU needed)."""

from __future__ import annotations

import subprocess

import pytest

from kernel_lens.toolchain import compilers
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from kernel_lens.errors import PtxIsaError
from kernel_lens.toolchain.ptx_isa import (
    clamp_ptx_version,
    find_ptxas,
    max_ptx_version_for_cuda,
    min_ptx_version_for_target,
    parse_ptx_target,
    parse_ptx_version,
)

needs_ptxas = pytest.mark.skipif(find_ptxas() is None, reason="ptxas (CUDA toolkit) not found")

# PTX ISA 8.3 feature supported on sm_90: unidirectional tensormap proxy fence.
FENCE_83 = "fence.proxy.tensormap::generic.release.gpu;"


@triton.jit
def axpb_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, x * 2.0 + 1.0, mask=mask)


@triton.jit
def fence_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.inline_asm_elementwise(
        "fence.proxy.tensormap::generic.release.gpu;\n mov.b32 $0, $1;",
        "=r,r", [x], dtype=tl.float32, is_pure=False, pack=1,
    )
    tl.store(y_ptr + offs, y, mask=mask)


def _ptx(fn, cc: int) -> str:
    src = triton.compiler.ASTSource(
        fn=fn,
        signature={"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"},
        constexprs={"BLOCK": 128},
        attrs={},
    )
    return triton.compile(src, target=GPUTarget("cuda", cc, 32)).asm["ptx"]


@pytest.fixture(scope="module")
def ptx90() -> str:
    return _ptx(axpb_kernel, 90)


@pytest.fixture(scope="module")
def ptx80() -> str:
    return _ptx(axpb_kernel, 80)


@pytest.fixture(scope="module")
def fence_ptx90() -> str:
    ptx = _ptx(fence_kernel, 90)
    assert FENCE_83 in ptx
    return ptx


def _ptxas_ok(ptx: str, target: str, tmp_path) -> subprocess.CompletedProcess:
    f = tmp_path / "check.ptx"
    f.write_text(ptx)
    return subprocess.run(
        [find_ptxas(), f"-arch={target}", str(f), "-o", str(tmp_path / "check.cubin")],
        capture_output=True, text=True, timeout=120,
    )


def _only_version_changed(before: str, after: str, new_line: str) -> None:
    b, a = before.splitlines(keepends=True), after.splitlines(keepends=True)
    assert len(a) == len(b)
    diff = [i for i, (x, y) in enumerate(zip(b, a)) if x != y]
    assert len(diff) == 1
    assert b[diff[0]].strip().startswith(".version")
    assert a[diff[0]] == new_line + "\n"


def test_parse_triton_ptx(ptx90, ptx80):
    assert parse_ptx_version(ptx90) == (8, 7)
    assert parse_ptx_target(ptx90) == "sm_90a"
    assert parse_ptx_version(ptx80) == (8, 7)
    assert parse_ptx_target(ptx80) == "sm_80"


def test_parse_ignores_comments_and_requires_directives():
    ptx = "// .version 9.9\n.version 7.8 // trailing\n.target sm_89, debug\n"
    assert parse_ptx_version(ptx) == (7, 8)
    assert parse_ptx_target(ptx) == "sm_89"
    with pytest.raises(PtxIsaError, match=r"\.version"):
        parse_ptx_version("// .version 8.0\n.target sm_90\n")
    with pytest.raises(PtxIsaError, match=r"\.target"):
        parse_ptx_target(".version 8.0\n")


def test_cuda_table():
    assert max_ptx_version_for_cuda((12, 0)) == (8, 0)
    assert max_ptx_version_for_cuda((12, 4)) == (8, 4)
    assert max_ptx_version_for_cuda((12, 6)) == (8, 5)
    assert max_ptx_version_for_cuda((12, 8)) == (8, 7)
    assert max_ptx_version_for_cuda((12, 9)) == (8, 8)
    assert max_ptx_version_for_cuda((13, 0)) == (9, 0)
    assert max_ptx_version_for_cuda((11, 8)) == (7, 8)
    assert max_ptx_version_for_cuda((13, 2)) == (9, 0)  # newer release: sound lower bound
    with pytest.raises(PtxIsaError, match="too old"):
        max_ptx_version_for_cuda((10, 2))
    with pytest.raises(PtxIsaError, match="unknown CUDA version 12.7"):
        max_ptx_version_for_cuda((12, 7))


def test_target_table():
    assert min_ptx_version_for_target("sm_80") == (7, 0)
    assert min_ptx_version_for_target("sm_89") == (7, 8)
    assert min_ptx_version_for_target("sm_90") == (7, 8)
    assert min_ptx_version_for_target("sm_90a") == (8, 0)
    assert min_ptx_version_for_target("sm_100a") == (8, 6)
    assert min_ptx_version_for_target("sm_120a") == (8, 7)
    with pytest.raises(PtxIsaError, match="sm_999"):
        min_ptx_version_for_target("sm_999")


def test_noop_when_already_supported(ptx90):
    assert clamp_ptx_version(ptx90, (8, 7), ptxas="/nonexistent/ptxas") is ptx90
    assert clamp_ptx_version(ptx90, (9, 0), ptxas="/nonexistent/ptxas") is ptx90


@needs_ptxas
def test_clamp_sm90a_to_cuda_12_0(ptx90, tmp_path):
    out = clamp_ptx_version(ptx90, max_ptx_version_for_cuda((12, 0)))
    assert parse_ptx_version(out) == (8, 0)
    _only_version_changed(ptx90, out, ".version 8.0")
    proc = _ptxas_ok(out, "sm_90a", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "check.cubin").stat().st_size > 0


@needs_ptxas
def test_clamp_sm80_to_cuda_11_0(ptx80, tmp_path):
    out = clamp_ptx_version(ptx80, max_ptx_version_for_cuda((11, 0)))
    _only_version_changed(ptx80, out, ".version 7.0")
    proc = _ptxas_ok(out, "sm_80", tmp_path)
    assert proc.returncode == 0, proc.stderr


def test_target_too_new_for_requested_version(ptx90, ptx80):
    with pytest.raises(PtxIsaError) as e:
        clamp_ptx_version(ptx90, (7, 8), ptxas=None)
    msg = str(e.value)
    assert "sm_90a" in msg and "8.0" in msg and "7.8" in msg and "driver" in msg
    with pytest.raises(PtxIsaError, match="sm_80"):
        clamp_ptx_version(ptx80, (6, 5), ptxas=None)


@needs_ptxas
def test_newer_isa_feature_is_refused(fence_ptx90):
    with pytest.raises(PtxIsaError) as e:
        clamp_ptx_version(fence_ptx90, (8, 0))
    msg = str(e.value)
    assert "sm_90a" in msg and "8.7" in msg and "8.0" in msg
    assert "error" in msg and "8.3" in msg  # ptxas's own diagnostic is quoted
    assert FENCE_83 in msg  # the offending PTX instruction is named
    assert "one supporting PTX ISA 8.3" in msg  # the way past it, read from ptxas's complaint
    with pytest.raises(PtxIsaError, match="8.3"):
        clamp_ptx_version(fence_ptx90, (8, 2))


@needs_ptxas
def test_newer_isa_feature_ok_when_version_still_covers_it(fence_ptx90, tmp_path):
    out = clamp_ptx_version(fence_ptx90, (8, 3))
    _only_version_changed(fence_ptx90, out, ".version 8.3")
    assert _ptxas_ok(out, "sm_90a", tmp_path).returncode == 0


@needs_ptxas
def test_skipping_the_proof_is_explicit(fence_ptx90, tmp_path):
    out = clamp_ptx_version(fence_ptx90, (8, 0), ptxas=None)  # caller accepts unproven PTX
    assert parse_ptx_version(out) == (8, 0)
    proc = _ptxas_ok(out, "sm_90a", tmp_path)
    assert proc.returncode != 0 and "8.3" in proc.stderr


def test_a_ptxas_failure_of_another_kind_gets_the_general_advice(ptx90, tmp_path):
    fake = tmp_path / "ptxas"
    fake.write_text("#!/bin/sh\necho 'ptxas fatal   : Unresolved extern function foo' >&2\nexit 255\n")
    fake.chmod(0o755)
    with pytest.raises(PtxIsaError, match=r"Unresolved extern function foo.* Check that this ptxas "
                                          r"supports the target and PTX version, or use a newer "
                                          r"NVIDIA driver / CUDA toolkit so no lowering is needed"):
        clamp_ptx_version(ptx90, (8, 0), ptxas=str(fake))


def test_ptxas_not_found(ptx90, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    for var in ("CUDA_HOME", "CUDA_PATH", "KERNEL_LENS_NVCC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(compilers, "DEFAULT_CUDA_HOMES", ())
    with pytest.raises(PtxIsaError, match="PATH.*CUDA_HOME"):
        clamp_ptx_version(ptx90, (8, 0))
    with pytest.raises(PtxIsaError, match="nonexistent"):
        clamp_ptx_version(ptx90, (8, 0), ptxas=str(tmp_path / "nonexistent"))


@needs_ptxas
def test_ptxas_found_via_cuda_home(ptx90, monkeypatch, tmp_path):
    real = find_ptxas()
    bin_dir = tmp_path / "cuda" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ptxas").symlink_to(real)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "cuda"))
    assert find_ptxas() == str(bin_dir / "ptxas")
    assert parse_ptx_version(clamp_ptx_version(ptx90, (8, 0))) == (8, 0)


@pytest.mark.parametrize("option, text", [("ptx_version", "8"), ("ptx_version", "8.x"),
                                          ("cuda_version", "twelve")])
def test_malformed_version_options_are_named(option, text):
    from kernel_lens.passes.ptx_clamp import target_ptx_version

    with pytest.raises(PtxIsaError, match=rf"^{option} '{text}' is not of the form MAJOR.MINOR$"):
        target_ptx_version({option: text})


def test_ptxas_is_found_beside_the_real_location_of_a_linked_nvcc(monkeypatch, tmp_path):
    # nvcc on PATH is a link into the toolkit (as /usr/bin/nvcc -> /opt/cuda/bin/nvcc); ptxas is
    # only beside the link's target
    toolkit = tmp_path / "toolkit" / "bin"
    toolkit.mkdir(parents=True)
    for tool in ("nvcc", "ptxas"):
        (toolkit / tool).write_text("#!/bin/sh\n")
        (toolkit / tool).chmod(0o755)
    path = tmp_path / "path"
    path.mkdir()
    (path / "nvcc").symlink_to(toolkit / "nvcc")
    monkeypatch.setenv("PATH", str(path))
    for var in ("CUDA_HOME", "CUDA_PATH", "KERNEL_LENS_NVCC"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(compilers, "DEFAULT_CUDA_HOMES", ())  # this host's /usr/local/cuda aside
    assert find_ptxas() == str(toolkit / "ptxas")
    (toolkit / "ptxas").unlink()
    assert find_ptxas() is None


def test_every_cuda_program_is_found_by_one_lookup(monkeypatch, tmp_path):
    # nvcc and ptxas follow the same order: $CUDA_HOME/bin before PATH, then beside nvcc, then
    # the default toolkit folder; KERNEL_LENS_NVCC's folder is searched for ptxas too
    home, elsewhere, named = tmp_path / "home" / "bin", tmp_path / "path", tmp_path / "named"
    for folder in (home, elsewhere, named):
        folder.mkdir(parents=True)
        for tool in ("nvcc", "ptxas"):
            (folder / tool).write_text("#!/bin/sh\n")
            (folder / tool).chmod(0o755)
    monkeypatch.setattr(compilers, "DEFAULT_CUDA_HOMES", ())
    monkeypatch.setenv("PATH", str(elsewhere))
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.delenv("KERNEL_LENS_NVCC", raising=False)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "home"))
    assert find_ptxas() == str(home / "ptxas") and compilers.find_nvcc() == str(home / "nvcc")
    monkeypatch.delenv("CUDA_HOME")
    assert find_ptxas() == str(elsewhere / "ptxas") and compilers.find_nvcc() == str(elsewhere / "nvcc")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("KERNEL_LENS_NVCC", str(named / "nvcc"))
    assert find_ptxas() == str(named / "ptxas") and compilers.find_nvcc() == str(named / "nvcc")
    monkeypatch.delenv("KERNEL_LENS_NVCC")
    assert find_ptxas() is None and compilers.find_nvcc() is None
    monkeypatch.setattr(compilers, "DEFAULT_CUDA_HOMES", (str(tmp_path / "home"),))
    assert find_ptxas() == str(home / "ptxas") and compilers.find_nvcc() == str(home / "nvcc")
