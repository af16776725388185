"""An output folder's safety: the manifest (written last, read through checked descriptors),
the staging folder a build is made in and moved from, the lock that lets one build at a time
move in, and the rules for reading a folder back. :func:`kernel_lens.compiler.load` and
:meth:`CompiledModel.write` are the users; what is trusted and why is in docs/security.md.

The manifest records one build: a build id and the sha256 of every artifact it names, so a
folder whose files come from two builds (or were edited since) is refused at load."""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import reprlib
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from . import progress
from .errors import ArtifactError, OutputPathError, printable
from .fileio import atomic_write, held_lock, inside, process_alive, subfolder, umask

log = logging.getLogger(__name__)

MANIFEST = "kernel_lens.json"
LOCK = ".kernel_lens.lock"  # flock'ed while a build moves in; never an artifact, never removed
MAX_ARTIFACTS = 64  # entries a manifest may name (a compile writes a few per target)
_SHA256 = re.compile(r"[0-9a-f]{64}")


STAGING_PREFIX = ".kl-staging-"


def staging_folder(directory: Path) -> Path:
    """A new private folder to build in, on ``directory``'s file system (so moving out of it is
    a rename): beside ``directory``, else inside it. Staging folders that a killed compile left
    (their process is gone) are removed first."""
    for where in (directory.parent, directory):
        _remove_stale_staging(where)
        try:
            folder = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{os.getpid()}-", dir=where))
        except OSError:
            continue
        os.chmod(folder, 0o755 & ~umask())  # mkdtemp made it 0700
        return folder
    raise OutputPathError(f"cannot write into {directory} (nor beside it): check its permissions "
                          f"or choose another output folder")


def _remove_stale_staging(where: Path) -> None:
    try:
        entries = list(os.scandir(where))
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(STAGING_PREFIX) or not entry.is_dir(follow_symlinks=False):
            continue
        pid = entry.name[len(STAGING_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and int(pid) != os.getpid() and not process_alive(int(pid)):
            shutil.rmtree(entry.path, ignore_errors=True)


def _manifest(directory: Path) -> dict:
    """The folder's current manifest, or {} when it has none or it cannot be read."""
    try:
        root = directory.resolve()
        data = json.loads(read_inside(root, root / MANIFEST, "manifest", follow=False))
        return data if isinstance(data, dict) and isinstance(data.get("artifacts"), dict) else {}
    except Exception:  # noqa: BLE001 - an unreadable manifest lists nothing to clean up
        return {}


def _listed(manifest: dict) -> set[Path]:
    """The files ``manifest`` (:func:`_manifest`) lists, relative: only paths inside the folder."""
    listed = set()
    for name in manifest.get("artifacts", {}).values():
        rel = Path(str(name))
        if not rel.is_absolute() and ".." not in rel.parts and rel.parts:
            listed.add(rel)
    return listed


def _kept(old: dict, new: dict, directory: Path) -> dict[str, Path]:
    """The earlier build's artifacts of targets this build does not make, kept when both builds
    come from the same IR (the same model compiled for another target: the manifest lists
    both), each only if it is still the file that build wrote; what is replaced is said."""
    if not old:
        return {}
    if old.get("name") != new.get("name"):
        log.warning("%s held the build of model %s; it is replaced by the build of %s",
                    directory, printable(str(old.get("name"))), printable(str(new.get("name"))))
        return {}
    ours = {_target_of(k) for k in new["artifacts"] if "." in k}
    theirs = {k: v for k, v in old["artifacts"].items()
              if isinstance(k, str) and "." in k and _target_of(k) not in ours}
    if not theirs:
        return {}
    same_ir = old.get("sha256", {}).get("ir") == new["sha256"]["ir"]
    root = directory.resolve()
    kept = {}
    for kind, rel in theirs.items():
        try:
            if same_ir and sha256_inside(root, root / str(rel), kind) == old["sha256"].get(kind):
                kept[kind] = Path(str(rel))
        except Exception:  # noqa: BLE001 - a file that cannot be read again is not kept
            pass
    if kept:
        progress.log.info("%s: kept the %s artifacts of the earlier build of this model", directory,
                          ", ".join(sorted({_target_of(k) for k in kept})))
    dropped = sorted({_target_of(k) for k in theirs} - {_target_of(k) for k in kept})
    if dropped:
        log.warning("%s: the earlier %s artifacts are removed: they were built from another "
                    "version of the model (compile with each --target you need)", directory,
                    ", ".join(dropped))
    return kept


def _target_of(kind: str) -> str:
    """The target an artifact kind belongs to: ``ort`` of ``ort.library``."""
    return kind.split(".", 1)[0]


@contextmanager
def one_writer(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s write lock (``flock`` on its :data:`LOCK` file, a regular file opened
    without following a link), so builds finishing into one folder move in one after the other;
    a second writer waits for the first, reported as a progress stage."""
    path = inside(directory, LOCK)
    flags = os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags, 0o644 & ~umask())
    except OSError as exc:
        why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
        raise OutputPathError(f"cannot open the output folder's lock file {shown(path)}: {why}; "
                              f"remove it (it is recreated)") from None

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            raise OutputPathError(f"the output folder's lock file {shown(path)} is not a regular "
                                  f"file; remove it (it is recreated)")

    with held_lock(fd, check, lambda: progress.stage(f"wait for another build writing into {directory}")):
        yield


def move_in(staging: Path, directory: Path) -> None:
    """Move a complete build from ``staging`` into ``directory``, holding the folder's lock
    (:func:`one_writer`): the old manifest first out, each file in by rename, the files only the
    old manifest listed removed, the manifest last."""
    made = {Path(top, name).relative_to(staging) for top, _, files in os.walk(staging)
            for name in files} - {Path(MANIFEST)}
    if Path(LOCK) in made:
        raise OutputPathError(f"a build wrote {LOCK!r}, the output folder's lock file; name the "
                              f"artifact otherwise")
    with one_writer(directory):
        _move_in(staging, directory, made)


def _move_in(staging: Path, directory: Path, made: set[Path]) -> None:
    before = _manifest(directory)
    new = json.loads((staging / MANIFEST).read_text())
    kept = _kept(before, new, directory)
    old = _listed(before) - {Path(LOCK)} - set(kept.values())
    retract_manifest(directory)
    for rel in sorted(made):
        target = inside(directory, rel) if len(rel.parts) == 1 else \
            subfolder(directory, rel.parent) / rel.name
        os.replace(staging / rel, target)
    for rel in sorted(old - made):
        try:
            path = inside(directory, rel)
            if path.is_file() or path.is_symlink():
                path.unlink()
        except (OSError, OutputPathError):
            continue
        parent = path.parent  # folders the old build made (src/ of --stop-after emit) go if empty
        while parent != directory and parent.is_relative_to(directory):
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent
    if kept:  # both builds' artifacts, each file's hash taken again where it now lies
        write_manifest(directory, new["name"], {**kept, **{k: Path(v) for k, v in new["artifacts"].items()}})
    else:
        os.replace(staging / MANIFEST, inside(directory, MANIFEST))


def retract_manifest(directory: Path) -> None:
    """Remove the folder's manifest before anything in it is replaced, and write it again only
    when every artifact is written: a write that fails half-way (a C++ build error) leaves a
    folder :func:`load` refuses, never new files beside an old manifest naming an old library."""
    try:
        os.unlink(inside(directory, MANIFEST))
    except FileNotFoundError:
        pass


def write_manifest(directory: Path, name: str, artifacts: dict[str, Path]) -> None:
    """The folder's manifest: artifact kind -> path relative to the folder, kind -> the sha256
    of that file as it is now (what :func:`read_folder` checks), and the build's id, a digest of
    both (so a rebuild of the same model writes the same manifest, byte for byte)."""
    root = Path(directory).resolve()
    paths = {k: str(v) for k, v in artifacts.items()}
    digests = {k: sha256_inside(root, root / v, f"artifact {k!r}") for k, v in paths.items()}
    build = hashlib.sha256(json.dumps([name, paths, digests], sort_keys=True).encode()).hexdigest()
    atomic_write(inside(directory, MANIFEST),
                 json.dumps({"name": name, "build": build, "artifacts": paths, "sha256": digests}, indent=1))


def shown(name: object) -> str:
    """A path or name as an error shows it: quoted, control characters escaped (``repr``), so a
    crafted file name cannot drive the terminal."""
    return repr(str(name))


_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_inside(root: Path, path: Path, what: str, *, follow: bool = True) -> bytes:
    """The bytes of ``path``: a regular file whose real location lies inside ``root``.

    Checked on the open descriptor, so what was checked is what is read: the last component is
    opened without following a link (``follow``: its real path is opened instead, which must
    lie inside ``root``; otherwise a link there is refused), the descriptor must be a regular
    file (no fifo, device or folder), and where it really is is read back from the descriptor."""
    chunks = []
    with _checked_descriptor(root, path, what, follow) as fd:
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
    return b"".join(chunks)


def sha256_inside(root: Path, path: Path, what: str, *, follow: bool = True) -> str:
    """The sha256 (hex) of ``path``, read in chunks through a descriptor checked as
    :func:`read_inside`'s is."""
    digest = hashlib.sha256()
    with _checked_descriptor(root, path, what, follow) as fd:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


@contextmanager
def _checked_descriptor(root: Path, path: Path, what: str, follow: bool) -> Iterator[int]:
    target = Path(os.path.realpath(path)) if follow else path
    if not target.is_relative_to(root):
        raise ArtifactError(f"{what} {shown(path)} resolves outside {shown(root)} (through a "
                            f"link); refusing to open it")
    try:
        fd = os.open(target, _READ_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ArtifactError(f"{what} {shown(path)} is a link; refusing to follow it (recompile "
                                f"into the folder to write a real file)") from None
        raise ArtifactError(f"cannot open {what} {shown(path)}: {exc.strerror}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ArtifactError(f"{what} {shown(path)} is not a regular file; refusing to read it")
        try:  # where the descriptor really points (a folder on the way may have been swapped)
            real = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:  # no /proc: the path must still resolve to the file that was opened
            real = Path(os.path.realpath(target))
            if not os.path.samestat(os.fstat(fd), os.stat(real)):
                real = Path("/")
        if not real.is_relative_to(root):
            raise ArtifactError(f"{what} {shown(path)} was opened outside {shown(root)}; "
                                f"refusing to read it")
        yield fd
    finally:
        os.close(fd)


def _manifest_path(directory: Path, manifest_path: Path, kind: object, rel: object) -> Path:
    """A manifest entry as a path inside ``directory`` (resolved by the caller, so the path is
    absolute): relative, normalized, no links out."""
    if not isinstance(kind, str) or not isinstance(rel, str):
        raise ArtifactError(f"{shown(manifest_path)}: artifact entries must map names to relative "
                            f"paths, got {reprlib.repr(kind)}: {reprlib.repr(rel)}")
    parts = Path(rel).parts
    if not rel or Path(rel).is_absolute() or ".." in parts or "." in parts or str(Path(rel)) != rel \
            or "\0" in rel:
        raise ArtifactError(f"{shown(manifest_path)}: artifact {kind!r} has path {rel!r}; only "
                            f"relative, normalized paths inside the folder are accepted (recompile "
                            f"to regenerate the manifest)")
    path = directory / rel
    if not Path(os.path.realpath(path)).is_relative_to(directory):
        raise ArtifactError(f"{shown(manifest_path)}: artifact {kind!r} ({rel!r}) resolves outside "
                            f"{shown(directory)} (through a link); refusing to open it")
    return path


def read_folder(directory: str | Path) -> tuple[Path, dict[str, Path], bytes]:
    """The real folder, the artifacts its manifest names (absolute paths, each a regular file
    inside it whose sha256 is the one the manifest records: all from one build) and the IR's
    bytes (read once: what was checked is what is parsed), or the ArtifactError naming what is
    wrong and the fix."""
    given = directory
    try:
        root = Path(directory).resolve(strict=True)
    except (OSError, RuntimeError, ValueError, TypeError) as exc:
        raise ArtifactError(f"{shown(given)} is not a kernel_lens output folder ({exc}); create "
                            f"one with kernel_lens compile FILE.py -o FOLDER") from None
    manifest_path = root / MANIFEST
    if not root.is_dir() or not os.path.lexists(manifest_path):
        raise ArtifactError(f"{shown(given)} is not a kernel_lens output folder (no {MANIFEST}); "
                            f"create one with kernel_lens compile FILE.py -o FOLDER")
    data = read_inside(root, manifest_path, "manifest", follow=False)
    try:
        manifest = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise ArtifactError(f"{shown(manifest_path)} is not a valid manifest "
                            f"({type(exc).__name__}: {str(exc):.200}); recompile into "
                            f"the folder") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("artifacts"), dict):
        raise ArtifactError(f"{shown(manifest_path)} is malformed: expected an object with an "
                            f"'artifacts' object; recompile into the folder")
    if len(manifest["artifacts"]) > MAX_ARTIFACTS:
        raise ArtifactError(f"{shown(manifest_path)} names {len(manifest['artifacts'])} artifacts; a "
                            f"kernel_lens folder holds at most {MAX_ARTIFACTS}; recompile into the folder")
    artifacts = {k: _manifest_path(root, manifest_path, k, v) for k, v in manifest["artifacts"].items()}
    if "ir" not in artifacts:
        raise ArtifactError(f"{shown(manifest_path)} names no IR ('ir' entry); recompile into the folder")
    missing = [shown(p) for p in artifacts.values() if not p.is_file()]
    if missing:
        raise ArtifactError(f"{shown(given)}: artifacts missing: {', '.join(missing)}")
    recorded = manifest.get("sha256")
    ir_text = b""
    for kind, path in artifacts.items():
        want = recorded.get(kind) if isinstance(recorded, dict) else None
        if not isinstance(want, str) or not _SHA256.fullmatch(want):
            raise ArtifactError(f"{shown(manifest_path)} records no sha256 for artifact {kind!r} "
                                f"(written by an older kernel_lens, or by hand); recompile into "
                                f"the folder")
        if kind == "ir":
            ir_text = read_inside(root, path, "IR document")
            got = hashlib.sha256(ir_text).hexdigest()
        else:
            got = sha256_inside(root, path, f"artifact {kind!r}")
        if got != want:
            raise ArtifactError(f"artifact {kind!r} {shown(path)} is not the file the manifest "
                                f"records (its sha256 differs: another build's file, or edited "
                                f"since); recompile into the folder")
    return root, artifacts, ir_text
