"""The content-addressed cache of compiled kernel binaries (frontends/aot.py): a hit gives the
binary a fresh compile gives, without running Triton; an entry that is tampered with, written
for another key, a link, or writable by others is not used (recompiled and replaced)."""

from __future__ import annotations

import json
import logging
import os

import pytest
import triton

import kernel_lens as kl
from kernel_lens.toolchain import cache as kl_cache
from kernel_lens.errors import CompilationError
from kernel_lens.frontends import aot
from kernel_lens.frontends.aot import compile_binary

from conftest import CORPUS, load_module


@pytest.fixture(scope="module")
def kernel():
    module = load_module(CORPUS / "vector_add.py")
    compiled = kl.compile(module.model, tuple(t.clone() for t in module.example_inputs), arch=90,
                          dynamic_shapes=module.dynamic_shapes)
    return next(iter(compiled.ir.kernels.values()))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "kl"))
    return tmp_path / "kl" / "aot"


@pytest.fixture
def triton_runs(monkeypatch):
    """How many times triton.compile ran."""
    calls = []
    real = triton.compile

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(aot.triton, "compile", counting)
    return calls


def _compile(kernel, arch=90):
    return compile_binary(kernel, arch, kernel.specialization, specialized=True)


def _entries(cache):
    return sorted(cache.glob("*.json"))


def test_hit_gives_the_fresh_binary_without_running_triton(kernel, cache, triton_runs):
    fresh = _compile(kernel)
    assert len(triton_runs) == 1
    assert len(_entries(cache)) == 1
    again = _compile(kernel)
    assert len(triton_runs) == 1, "a cache hit must not run triton.compile"
    assert again == fresh
    assert again.model_dump_json() == fresh.model_dump_json()
    ir_binary = kernel.binaries[0]  # what kl.compile put into the IR
    differ = [f for f in type(again).model_fields if getattr(again, f) != getattr(ir_binary, f)]
    assert not differ, f"the cache hit differs from kl.compile's binary in {differ}"


def test_key_separates_archs_and_assumptions(kernel, cache, triton_runs):
    b90, b80 = _compile(kernel, 90), _compile(kernel, 80)
    generic = compile_binary(kernel, 90, {}, specialized=False)
    assert len(triton_runs) == 3 and len(_entries(cache)) == 3
    assert ".target sm_80" in b80.ptx and ".target sm_90a" in b90.ptx
    assert generic.assumptions == {} and b90.assumptions
    assert _compile(kernel, 80) == b80 and len(triton_runs) == 3


def _tamper(path):
    data = path.read_bytes()
    path.write_bytes(data.replace(b".target sm_90a", b".target sm_99a", 1))


def _foreign(path):  # a valid entry, with its hash recorded, but written for another key
    entry = json.loads(path.read_bytes())
    entry["key"] = "0" * 64
    kl_cache.write_entry(path, json.dumps(entry, sort_keys=True).encode())


def _malformed(path):  # hash recorded, right key, but a field of the wrong type
    entry = json.loads(path.read_bytes())
    entry["ptx"] = 42
    kl_cache.write_entry(path, json.dumps(entry, sort_keys=True).encode())


def _group_writable(path):
    os.chmod(path, 0o664)


def _symlink(path):
    target = path.with_name("elsewhere.json")
    path.rename(target)
    path.symlink_to(target)


def _truncated(path):
    path.write_bytes(path.read_bytes()[:100])


@pytest.mark.parametrize("spoil, why", [
    (_tamper, "sha256 does not match"),
    (_foreign, "another key"),
    (_malformed, "is malformed (ValueError); recompiling it"),
    (_group_writable, "writable by group or others"),
    (_symlink, "symbolic link"),
    (_truncated, "sha256 does not match"),
])
def test_untrusted_entry_is_not_used(kernel, cache, triton_runs, caplog, spoil, why):
    fresh = _compile(kernel)
    (entry,) = _entries(cache)
    spoil(entry)
    with caplog.at_level(logging.WARNING, logger="kernel_lens.frontends.aot"):
        again = _compile(kernel)
    assert len(triton_runs) == 2, "the spoiled entry must be recompiled, not used"
    assert again == fresh
    assert why in caplog.text
    assert not entry.is_symlink() and entry.stat().st_mode & 0o022 == 0
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="kernel_lens.frontends.aot"):
        assert _compile(kernel) == fresh  # the replaced entry is trusted again
    assert len(triton_runs) == 2 and not caplog.text


def test_unusable_cache_folder_compiles_without_caching(kernel, tmp_path, monkeypatch, triton_runs,
                                                          caplog):
    root = tmp_path / "kl"
    root.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (root / "aot").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(root))
    with caplog.at_level(logging.WARNING, logger="kernel_lens.frontends.aot"):
        first = _compile(kernel)
        second = _compile(kernel)
    assert first == second and len(triton_runs) == 2
    assert "not used" in caplog.text and not list((tmp_path / "elsewhere").iterdir())


def test_compile_errors_are_not_cached(kernel, cache, monkeypatch):
    def failing(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(aot.triton, "compile", failing)
    with pytest.raises(CompilationError, match="boom"):
        _compile(kernel)
    assert not _entries(cache)


def test_triton_always_compile_bypasses_the_cache(kernel, cache, triton_runs, monkeypatch):
    _compile(kernel)
    monkeypatch.setattr(triton.knobs.compilation, "always_compile", True)
    _compile(kernel)
    assert len(triton_runs) == 2


def test_same_source_elsewhere_is_another_binary(cache, tmp_path, triton_runs, monkeypatch):
    # the binary's line info names the kernel's file and line, which Triton's source hash does
    # not cover: a copy of the kernel in another file (two lines lower) must not hit the
    # original's entry, nor be compiled from the original's function. (Triton's own cache has
    # the same blind spot, so it is emptied here.)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    copy = tmp_path / "vector_add_copy.py"
    copy.write_text("# a copy\n\n" + (CORPUS / "vector_add.py").read_text())
    binaries = {}
    for path in (CORPUS / "vector_add.py", copy):
        module = load_module(path)
        ir = kl.compile(module.model, tuple(t.clone() for t in module.example_inputs), arch=90,
                        dynamic_shapes=module.dynamic_shapes).ir
        (k,) = ir.kernels.values()
        assert k.source.file == str(path)
        binaries[path] = k.binaries[0]
    original, copied = binaries.values()
    assert f'.file\t1 "{CORPUS / "vector_add.py"}"' in original.ptx
    assert f'.file\t1 "{copy}"' in copied.ptx
    assert original.ptx.replace(str(CORPUS / "vector_add.py"), str(copy)) != copied.ptx  # lines
    assert len(triton_runs) == 4  # specialized + generic, for each file


def test_tritons_own_cache_is_neither_read_nor_written(kernel, tmp_path, monkeypatch):
    """Triton's cache (TRITON_CACHE_DIR) is not kernel_lens's to vouch for: an entry edited there
    (here a world-writable folder) must not reach the IR, and a compile writes nothing there."""
    shared = tmp_path / "triton"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(shared))
    real = aot._untrusting_compile

    def plain(src, arch, options):  # what a compile through Triton's cache does
        return triton.compile(src, target=aot.tc.target_for(arch), options=options)

    monkeypatch.setattr(aot, "_untrusting_compile", plain)
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "kl1"))
    _compile(kernel)  # Triton's cache now holds this compile's entry
    ptx_files = list(shared.rglob("*.ptx"))
    assert ptx_files
    for path in ptx_files:
        path.write_text(path.read_text() + "\n// planted\n")
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "kl2"))
    assert "// planted" in _compile(kernel).ptx  # read back through Triton's cache

    monkeypatch.setattr(aot, "_untrusting_compile", real)
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "kl3"))
    before = sorted((p, p.stat().st_mtime_ns) for p in shared.rglob("*"))
    assert "// planted" not in _compile(kernel).ptx
    assert sorted((p, p.stat().st_mtime_ns) for p in shared.rglob("*")) == before
