"""Small cache entries (toolchain/entry_cache.py): the lowered ONNX of an unchanged IR and
torchlib's op list are reused without rebuilding; changed inputs miss; spoiled entries are not
trusted."""

from __future__ import annotations

import logging
import os

import pytest

import kernel_lens as kl
from kernel_lens.onnx import lower
from kernel_lens.toolchain import entry_cache

from conftest import CORPUS, load_module


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def ir():
    module = load_module(CORPUS / "rmsnorm.py")
    return kl.compile(module.model, module.example_inputs, dynamic_shapes=module.dynamic_shapes,
                      arch=90).ir


def test_lowered_onnx_is_reused_for_the_same_ir(cache, ir, monkeypatch):
    first = lower.lower_to_onnx_cached(ir)
    assert len(list((cache / "onnx").glob("*.onnx"))) == 1  # and its recorded sha256 beside it

    def boom(*a, **k):
        raise AssertionError("lowered again")
    monkeypatch.setattr(lower, "lower_to_onnx", boom)
    again = lower.lower_to_onnx_cached(ir)
    assert again.SerializeToString() == first.SerializeToString()
    changed = ir.model_copy(update={"display_name": "other"})
    with pytest.raises(AssertionError, match="lowered again"):  # another IR: a miss
        lower.lower_to_onnx_cached(changed)


@pytest.mark.parametrize("spoil", ["tamper", "group_writable", "symlink"])
def test_spoiled_onnx_entry_is_rebuilt(cache, ir, caplog, spoil, monkeypatch):
    first = lower.lower_to_onnx_cached(ir)
    (entry,) = (cache / "onnx").glob("*.onnx")
    if spoil == "tamper":
        data = entry.read_bytes()
        entry.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    elif spoil == "group_writable":
        os.chmod(entry, 0o664)
    else:
        target = entry.with_suffix(".real")
        entry.rename(target)
        entry.symlink_to(target)
    lowered = []
    real = lower.lower_to_onnx
    monkeypatch.setattr(lower, "lower_to_onnx", lambda *a, **k: lowered.append(1) or real(*a, **k))
    with caplog.at_level(logging.WARNING, logger="kernel_lens"):
        again = lower.lower_to_onnx_cached(ir)
    assert lowered == [1]  # the spoiled entry was not used: the IR was lowered again
    assert again.SerializeToString() == first.SerializeToString()
    # ... and the entry was replaced by a trusted one (a regular file only its owner writes)
    assert not entry.is_symlink() and not entry.stat().st_mode & 0o022
    assert entry.read_bytes() == first.SerializeToString()


def test_key_covers_bytes_by_content():
    assert entry_cache.key_of("a", b"x") == entry_cache.key_of("a", b"x")
    assert entry_cache.key_of("a", b"x") != entry_cache.key_of("a", b"y")
    assert entry_cache.key_of("a", 1) != entry_cache.key_of("a", "1")
