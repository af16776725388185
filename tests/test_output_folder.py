"""The output folder is never half-written (issue 27 item 3): a compile builds in a staging
folder and moves in only when complete; an interruption at any point leaves the earlier build
loadable (or, during the move itself, a folder ``load`` refuses), no staging folder, and a cache
the next compile trusts; files only an earlier build listed are removed, the user's are kept."""

from __future__ import annotations

import hashlib
import os
import types

import pytest

import kernel_lens as kl
from kernel_lens import artifact_folder
from kernel_lens.compiler import CompiledModel
from kernel_lens.errors import ArtifactError
from kernel_lens.targets.base import Stage
from kernel_lens.targets.ort.target import OrtTarget

from conftest import EXAMPLES, model_ir

TOY = EXAMPLES / "toy_two_kernels.py"


@pytest.fixture(scope="module")
def toy_ir():
    return model_ir(TOY)


def _digests(folder) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _no_staging(tmp_path, out) -> None:
    for where in (tmp_path, out):
        assert not [p for p in where.iterdir() if p.name.startswith(artifact_folder.STAGING_PREFIX)]


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("point", ["lower", "emit", "build", "move"])
def test_an_interrupted_compile_leaves_the_earlier_build(point, toy_ir, tmp_path, monkeypatch, ort_headers):
    out = tmp_path / "out"
    CompiledModel(toy_ir).write(out, ["ort"])
    (out / "notes.txt").write_text("the user's own file")
    before = _digests(out)
    if point == "move":  # the second file's rename: the move itself is cut
        calls = []

        def replace(src, dst):
            calls.append(dst)
            if len(calls) == 2:
                raise KeyboardInterrupt
            os.replace(src, dst)
        monkeypatch.setattr(artifact_folder, "os", types.SimpleNamespace(**{**vars(os), "replace": replace}))
    else:
        monkeypatch.setattr(OrtTarget, "stage_table", tuple(
            Stage(row.name, _interrupt) if row.name == point else row for row in OrtTarget.stage_table))
    with pytest.raises(KeyboardInterrupt):
        CompiledModel(toy_ir).write(out, ["ort"])
    monkeypatch.undo()
    _no_staging(tmp_path, out)
    if point == "move":  # mid-move: the manifest went first, so the folder is not loadable
        with pytest.raises(ArtifactError, match="no kernel_lens.json"):
            kl.load(out)
    else:
        assert _digests(out) == before  # untouched: the earlier build, byte for byte
        assert sorted(kl.load(out).artifacts) == ["ir", "ort.library", "ort.onnx", "summary"]
    CompiledModel(toy_ir).write(out, ["ort"])  # the next compile trusts the cache and completes
    assert _digests(out) == before and (out / "notes.txt").read_text() == "the user's own file"


def test_a_new_build_keeps_the_same_models_other_target_and_removes_only_what_it_listed(toy_ir, tmp_path,
                                                                                          ort_headers):
    out = tmp_path / "out"
    CompiledModel(toy_ir).write(out, ["ort"])
    (out / "notes.txt").write_text("mine")
    CompiledModel(toy_ir).write(out, ["trt"], stop_after="emit")
    names = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    # issue 43: the same model for another target keeps the first target's files, listed
    assert {"libkl_ToyModel_ort.so", "ToyModel.onnx", "notes.txt", "ToyModel.trt.onnx"} <= names
    listed = set(kl.load(out).artifacts)
    assert {"ort.library", "ort.onnx", "trt.onnx"} <= listed
    CompiledModel(toy_ir.model_copy(update={"name": "Other"})).write(out, [])  # another model
    names = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert "libkl_ToyModel_ort.so" not in names and "ToyModel.onnx" not in names  # no orphans
    assert not (out / "src_trt_v3").exists() and (out / "notes.txt").exists()  # folders go with their files
    assert set(kl.load(out).artifacts) == {"ir", "summary"}


def test_a_killed_compile_s_staging_folder_is_removed_by_the_next(toy_ir, tmp_path):
    out = tmp_path / "out"
    dead = tmp_path / f"{artifact_folder.STAGING_PREFIX}999999999-abc"  # no such process
    dead.mkdir()
    (dead / "half.onnx").write_bytes(b"x")
    mine = tmp_path / f"{artifact_folder.STAGING_PREFIX}{os.getpid()}-live"  # a live process's: kept
    mine.mkdir()
    CompiledModel(toy_ir).write(out)
    assert not dead.exists() and mine.exists()


def test_an_output_folder_that_cannot_be_made_is_refused_before_any_work(tmp_path, monkeypatch):
    from kernel_lens.errors import OutputPathError

    def never(*_):
        raise AssertionError("the capture ran")
    import kernel_lens.frontends.lift as lift_module
    monkeypatch.setattr(lift_module, "capture", never)
    module_inputs = (__import__("torch").randn(8), __import__("torch").randn(8))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    with pytest.raises(OutputPathError, match="cannot be created: .*a_file is not a folder"):
        kl.compile(lambda x, y: x, module_inputs, output_dir=blocker / "sub" / "out")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: False if str(p) == str(tmp_path) else real_access(p, mode))
    with pytest.raises(OutputPathError, match=r"would be created in .*, which is not writable by you"):
        kl.compile(lambda x, y: x, module_inputs, output_dir=tmp_path / "new" / "out")
