"""Issue 42, item 7: one writer per output folder. Builds finishing into one folder at once move
in one after the other (a lock), and load() refuses a folder whose files do not all come from the
build its manifest records (each artifact's sha256).

Nothing here builds a plugin: the builds are the session's toy IR with a stand-in target."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import kernel_lens as kl
from kernel_lens.artifact_folder import LOCK, MANIFEST, move_in, write_manifest
from kernel_lens.compiler import CompiledModel
from kernel_lens.errors import ArtifactError, OutputPathError
from kernel_lens.fileio import inside
from kernel_lens.ir import GraphIR
from kernel_lens.targets.base import Target

from conftest import EXAMPLES, ROOT, model_ir


@pytest.fixture(scope="module")
def toy_ir() -> GraphIR:
    return model_ir(EXAMPLES / "toy_two_kernels.py")


class _Tagged(Target):
    """A target writing an ONNX stand-in and a library stand-in whose bytes name ``tag``: two
    builds with two tags are two builds' files."""

    name = "tagged_one_writer"
    tag = "A"

    def build(self, ir, out_dir):
        onnx_path = inside(out_dir, f"{ir.name}.onnx")
        library = inside(out_dir, f"libkl_{ir.name}_tagged.so")
        onnx_path.write_bytes(f"graph of build {_Tagged.tag}".encode())
        library.write_bytes(f"\x7fELF library of build {_Tagged.tag}".encode())
        return {"onnx": onnx_path, "library": library}

    def runner(self, ir, artifacts, **options):
        return object()


kl.register_target(_Tagged)


def _build(ir: GraphIR, out: Path, tag: str) -> Path:
    _Tagged.tag = tag
    CompiledModel(ir).write(out, [_Tagged.name])
    return out


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file() and p.name != LOCK}


def _staging(tmp_path: Path, ir: GraphIR, tag: str) -> tuple[Path, dict[str, bytes]]:
    """A complete build in a staging folder: every file differs from the other tag's."""
    staging = tmp_path / f"staging_{tag}"
    staging.mkdir()
    names = {"ir": "ToyModel.ir.json", "summary": "ToyModel.summary.txt", "x.library": "libkl_x.so",
             "x.onnx": "ToyModel.onnx"}
    (staging / names["ir"]).write_text(ir.to_json() if tag == "A" else json.dumps(json.loads(ir.to_json())))
    (staging / names["summary"]).write_text(f"summary of build {tag}")
    (staging / names["x.library"]).write_bytes(f"library of build {tag}".encode())
    (staging / names["x.onnx"]).write_bytes(f"graph of build {tag}".encode())
    write_manifest(staging, ir.name, {k: Path(v) for k, v in names.items()})
    return staging, _files(staging)


class _Waits(logging.Handler):
    """Sets ``event`` when a writer reports that it waits for the folder's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.event = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("wait for another build writing into"):
            self.event.set()


@pytest.fixture
def waits(caplog):
    caplog.set_level(logging.INFO, logger="kernel_lens.progress")
    handler = _Waits()
    logging.getLogger("kernel_lens.progress").addHandler(handler)
    yield handler.event
    logging.getLogger("kernel_lens.progress").removeHandler(handler)


def test_two_builds_moving_in_at_once_never_leave_a_mix(toy_ir, tmp_path, monkeypatch, waits):
    """Build A pauses after its first file is renamed in; build B moves in meanwhile. Without the
    lock B's files land between A's (A's manifest over a folder holding one of B's files)."""
    out = tmp_path / "out"
    out.mkdir()
    staging_a, files_a = _staging(tmp_path, toy_ir, "A")
    staging_b, files_b = _staging(tmp_path, toy_ir, "B")
    assert all(files_a[name] != files_b[name] for name in files_a)
    paused, resume = threading.Event(), threading.Event()
    real_replace = os.replace
    renamed_in = []

    def replace(src, dst):
        if threading.current_thread().name == "A" and Path(dst).parent == out:
            renamed_in.append(dst)
            if len(renamed_in) == 2:  # A's first file is in; A stops half-way
                paused.set()
                assert resume.wait(30)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    errors = []

    def writer(staging):
        try:
            move_in(staging, out)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            errors.append(exc)

    a = threading.Thread(target=writer, args=(staging_a,), name="A")
    b = threading.Thread(target=writer, args=(staging_b,), name="B")
    a.start()
    assert paused.wait(30)
    b.start()
    deadline = time.monotonic() + 30
    while b.is_alive() and not waits.is_set() and time.monotonic() < deadline:
        time.sleep(0.01)  # B either moved in through A's half-done move, or waits for the lock
    resume.set()
    a.join(30)
    b.join(30)
    assert not errors and not a.is_alive() and not b.is_alive()
    assert _files(out) == files_b  # whole: the later build, none of A's files
    assert kl.load(out).ir == toy_ir
    assert waits.is_set()  # B waited, and said so


def test_a_second_writer_in_another_process_waits_for_the_first(toy_ir, tmp_path, waits):
    out = tmp_path / "out"
    _build(toy_ir, out, "A")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from pathlib import Path\n"
         "from kernel_lens.artifact_folder import one_writer\n"
         f"with one_writer(Path({str(out)!r})):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    try:
        assert holder.stdout.readline() == "held\n"
        done = threading.Event()
        thread = threading.Thread(target=lambda: (_build(toy_ir, out, "B"), done.set()))
        thread.start()
        assert waits.wait(60) and not done.is_set()  # waits, does not fail, moves nothing in
        assert b"build A" in (out / "ToyModel.onnx").read_bytes()
        holder.stdin.close()
        thread.join(60)
        assert done.is_set()
    finally:
        holder.kill()
        holder.wait()
    assert b"build B" in kl.load(out).artifacts[f"{_Tagged.name}.library"].read_bytes()


@pytest.mark.parametrize("kind", ["library", "onnx"])
def test_a_file_from_another_build_is_refused_at_load_naming_it(toy_ir, tmp_path, kind):
    ours, theirs = _build(toy_ir, tmp_path / "ours", "A"), _build(toy_ir, tmp_path / "theirs", "B")
    name = kl.load(ours).artifacts[f"{_Tagged.name}.{kind}"].name
    shutil.copyfile(theirs / name, ours / name)
    with pytest.raises(ArtifactError) as err:
        kl.load(ours)
    message = str(err.value)
    assert f"'{_Tagged.name}.{kind}'" in message and name in message and "\n" not in message
    assert "sha256 differs" in message and message.endswith("recompile into the folder")
    _build(toy_ir, ours, "A")  # the fix the line names
    assert b"build A" in kl.load(ours).artifacts[f"{_Tagged.name}.{kind}"].read_bytes()


def test_a_hand_edited_ir_is_refused(toy_ir, tmp_path):
    out = _build(toy_ir, tmp_path / "out", "A")
    ir_path = out / "ToyModel.ir.json"
    edited = json.dumps(json.loads(ir_path.read_text()), indent=4)
    assert GraphIR.from_json(edited) == toy_ir  # a valid document: only the manifest tells
    ir_path.write_text(edited)
    with pytest.raises(ArtifactError, match=r"artifact 'ir' .*ToyModel\.ir\.json' is not the file "
                                            r"the manifest records .*recompile into the folder"):
        kl.load(out)


def test_a_manifest_without_sha256_is_refused(toy_ir, tmp_path):
    out = _build(toy_ir, tmp_path / "out", "A")
    manifest = json.loads((out / MANIFEST).read_text())
    assert set(manifest["sha256"]) == set(manifest["artifacts"]) and len(manifest["build"]) == 64
    del manifest["sha256"]  # as kernel_lens wrote it before this item
    (out / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match=r"kernel_lens\.json' records no sha256 for artifact "
                                            r"'\w+' .*recompile into the folder"):
        kl.load(out)


def test_save_writes_the_same_manifest(toy_ir, tmp_path):
    loaded = kl.load(_build(toy_ir, tmp_path / "out", "A"))
    saved = loaded.save(tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / MANIFEST).read_text())
    assert set(manifest["sha256"]) == set(manifest["artifacts"]) == set(loaded.artifacts)
    assert set(kl.load(tmp_path / "saved").artifacts) == set(saved.artifacts)
    saved.artifacts[f"{_Tagged.name}.library"].write_bytes(b"another build's library")
    with pytest.raises(ArtifactError, match=r"libkl_ToyModel_tagged\.so' is not the file"):
        kl.load(tmp_path / "saved")


def test_the_lock_file_is_no_artifact_and_never_followed(toy_ir, tmp_path):
    out = _build(toy_ir, tmp_path / "out", "A")
    assert (out / LOCK).is_file() and LOCK not in (out / MANIFEST).read_text()
    _build(toy_ir, out, "B")  # a rebuild keeps it, and loads
    assert (out / LOCK).is_file() and LOCK not in {p.name for p in kl.load(out).artifacts.values()}
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (out / LOCK).unlink()
    (out / LOCK).symlink_to(victim)
    with pytest.raises(OutputPathError, match=r"lock file .*\.kernel_lens\.lock.*symbolic link; "
                                              r"remove it"):
        _build(toy_ir, out, "C")
    assert victim.read_text() == "precious" and b"build B" in (out / "ToyModel.onnx").read_bytes()
    (out / LOCK).unlink()
    (out / LOCK).mkdir()
    with pytest.raises(OutputPathError, match=r"lock file .*\.kernel_lens\.lock.*(not a regular "
                                              r"file|Is a directory)"):
        _build(toy_ir, out, "C")
