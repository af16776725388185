"""Where kernel_lens keeps its caches, and the one rule for trusting what is in them.

Locations (all below one root, :func:`build_cache_dir`): ``<key>/`` built plugin libraries
(toolchain/build.py), ``failed/`` the sources of failed builds, ``aot/``, ``onnx/``,
``torchlib/``, ``canonical/`` small entries (toolchain/entry_cache.py), ``artifacts/<key>/``
what ``compile()`` without an output folder writes (:func:`artifacts_dir`), and
``tensorrt-engines/`` serialized TensorRT engines (:func:`tensorrt_engines_dir`).

Trust (docs/security.md): a cache holds only what this user wrote there.

- A folder is used only if it is a real folder (not a link), owned by the current user and
  writable by no one else (no group or other write bit; a sticky world-writable folder is
  refused too), else :class:`CacheError` names it and says to set ``KERNEL_LENS_CACHE``
  (:func:`trusted_folder`).
- A file is used only if it is a regular file (not a link; read with ``O_NOFOLLOW``) of the
  current user, writable by no one else, and its sha256 matches the hash recorded next to it
  when it was written (``<file>.sha256``, ``sha256sum`` format); anything else is not used, with
  a warning naming the file and why, and rebuilt (:func:`read_entry`, :func:`entry_problem`).
- A folder entry (``artifacts/<key>/``) is used only if the folder and everything in it pass the
  same checks and its files are exactly those recorded, with their hashes, in its
  :data:`TREE_RECORD` (:func:`tree_problem`, :func:`seal_tree`).

This module is at the bottom: it imports nothing of the project but errors and fileio.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

from kernel_lens.errors import CacheError
from kernel_lens.fileio import atomic_write

log = logging.getLogger(__name__)

HASH_SUFFIX = ".sha256"  # <file>.sha256: the file's sha256, recorded when it was written
TREE_RECORD = ".kl-entry.sha256"  # in a folder entry: the sha256 of each of its files
ARTIFACTS = "artifacts"
TENSORRT_ENGINES = "tensorrt-engines"
FAILED = "failed"
CACHE_HINT = ("set KERNEL_LENS_CACHE (or pass cache_dir) to a folder of your own that is not a "
              "link and not writable by others")


# --- locations --------------------------------------------------------------------------------
def build_cache_dir(cache_dir: str | Path | None = None) -> Path:
    """Cache root: ``cache_dir``, else $KERNEL_LENS_CACHE, else the platform's user cache folder
    (platformdirs; ~/.cache/kernel_lens/build on Linux, honouring $XDG_CACHE_HOME)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("KERNEL_LENS_CACHE")
    if env:
        return Path(env).expanduser()
    import platformdirs  # lazy: only the default location needs it (rare in tests and CI)

    return Path(platformdirs.user_cache_dir("kernel_lens")) / "build"


def artifacts_dir() -> Path:
    """Where ``compile()`` without an output folder keeps artifacts: ``<cache root>/artifacts``."""
    return build_cache_dir() / ARTIFACTS


def tensorrt_engines_dir() -> Path:
    """Where serialized TensorRT engines are kept: ``<cache root>/tensorrt-engines``."""
    return build_cache_dir() / TENSORRT_ENGINES


# --- folders ----------------------------------------------------------------------------------
def folder_problem(st: os.stat_result, path: Path) -> str | None:
    """Why a folder with ``lstat`` result ``st`` must not be used, or None."""
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder"
    if st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        sticky = " (a sticky bit does not make it private)" if st.st_mode & stat.S_ISVTX else ""
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}){sticky}"
    return None


def parent_problem(path: str | Path) -> str | None:
    """Why the folder holding a cache root must not be trusted, or None: it and every folder above
    it must be the current user's or root's, and writable by others only with the sticky bit (as
    ``/tmp``), so no one else can rename the root (or a folder on its way) away and put their own
    in its place after it was checked."""
    real = Path(os.path.realpath(path))
    for folder in (real, *real.parents):
        try:
            st = os.stat(folder)
        except OSError as exc:
            return f"({folder}) cannot be inspected ({exc.strerror})"
        where = f"({folder})" if folder == real else f"({folder}, above it)"
        if st.st_uid not in (os.geteuid(), 0):
            return f"{where} is owned by uid {st.st_uid}, neither you (uid {os.geteuid()}) nor root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
            return (f"{where} is writable by group or others without the sticky bit "
                    f"(mode {stat.S_IMODE(st.st_mode):o})")
    return None


def cache_root(root: str | Path | None = None) -> Path:
    """The build cache root (:func:`build_cache_dir`), made if missing, refused
    (:class:`CacheError`) unless it is private (:func:`trusted_folder`) and the folders holding
    it are trusted (:func:`parent_problem`)."""
    path = trusted_folder(build_cache_dir(root), "build cache root", create=True)
    problem = parent_problem(path.parent)
    if problem:
        raise CacheError(f"refusing the build cache root {path}: the folder holding it {problem} "
                         f"(whoever can write there can swap the root between a check and a use); "
                         f"{CACHE_HINT}")
    return path


def trusted_folder(path: str | Path, what: str, *, create: bool = False,
                   removable: bool = False) -> Path:
    """``path``, refused (:class:`CacheError`) unless it is a real folder of the current user that
    no one else can write. ``create`` makes it first (0755, parents too); ``removable`` adds that
    removing it is a fix (it is rebuilt)."""
    path = Path(path)
    if create:
        try:
            path.mkdir(mode=0o755, parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot create the {what} {path}: {exc.strerror}; {CACHE_HINT}") from None
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise CacheError(f"cannot use the {what} {path}: {exc.strerror}; {CACHE_HINT}") from None
    problem = folder_problem(st, path)
    if problem:
        raise CacheError(f"refusing the {what} {path}: it {problem}; {CACHE_HINT}"
                         + (" (or remove it: it is rebuilt)" if removable else ""))
    return path


def cache_folder(*names: str, root: str | Path | None = None) -> Path:
    """``<root>/<names...>``, the root and each folder below it made if missing and checked with
    :func:`trusted_folder` (root: :func:`build_cache_dir`)."""
    path = cache_root(root)
    for name in names:
        path = trusted_folder(path / name, f"cache folder {name!r}", create=True)
    return path


# --- files ------------------------------------------------------------------------------------
def file_problem(st: os.stat_result) -> str | None:
    """Why a file with ``lstat`` result ``st`` must not be used, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "it is a symbolic link"
    if not stat.S_ISREG(st.st_mode):
        return "it is not a regular file"
    if st.st_uid != os.geteuid():
        return f"it is owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"it is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def read_trusted(path: str | Path) -> tuple[bytes | None, str | None]:
    """(bytes, None) for a regular file of the current user that only they can write, read
    without following a link; (None, why not) otherwise; (None, None) when it does not exist."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"it cannot be inspected ({exc.strerror})"
    problem = file_problem(st)
    if problem:
        return None, problem
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        return None, f"it cannot be opened ({exc.strerror})"
    with os.fdopen(fd, "rb") as fh:
        fst = os.fstat(fh.fileno())
        if (fst.st_dev, fst.st_ino) != (st.st_dev, st.st_ino):
            return None, "it was replaced while being checked"
        return fh.read(), None


def record_of(path: str | Path) -> Path:
    """Where the sha256 of the cache entry ``path`` is recorded."""
    path = Path(path)
    return path.with_name(path.name + HASH_SUFFIX)


def entry_problem(path: str | Path) -> tuple[bytes | None, str | None]:
    """The trusted entry at ``path``: (bytes, None); (None, "missing") if absent; else
    (None, why it must not be used): the one check of every cached file."""
    path = Path(path)
    data, problem = read_trusted(path)
    if problem:
        return None, f"{path}: {problem}"
    if data is None:
        return None, "missing"
    record = record_of(path)
    recorded, record_problem = read_trusted(record)
    if record_problem:
        return None, f"{record}: {record_problem}"
    if recorded is None:
        return None, f"{path}: no content hash was recorded for it ({record} is missing)"
    fields = recorded.split()
    want = fields[0].decode("ascii", "replace").lower() if fields else ""
    have = hashlib.sha256(data).hexdigest()
    if want != have:
        return None, (f"{path}: its sha256 does not match the hash recorded in {record} "
                      f"(recorded {want or 'nothing'}, found {have})")
    return data, None


def read_entry(path: str | Path, what: str) -> bytes | None:
    """The bytes of the trusted entry at ``path``, or None: missing, or not trusted (then a
    warning says why; the caller rebuilds it and :func:`write_entry` replaces it)."""
    data, problem = entry_problem(path)
    if problem and problem != "missing":
        log.warning("%s cache entry not reused, it is rebuilt: %s", what, problem)
    return data


def record_hash(path: str | Path, digest: str) -> None:
    """Record ``digest`` as the sha256 of ``path`` (written after it: a crash in between leaves a
    mismatch, so the entry is rebuilt)."""
    atomic_write(record_of(path), f"{digest}  {Path(path).name}\n", mode=0o644)


def write_entry(path: str | Path, data: bytes, mode: int = 0o644) -> Path:
    """Write the entry atomically (a link at ``path`` is replaced, never followed), then its hash."""
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ValueError(f"cache entries are writable by their owner only, not mode {mode:o}")
    atomic_write(path, data, mode=mode)
    record_hash(path, hashlib.sha256(data).hexdigest())
    return Path(path)


# --- folder entries ---------------------------------------------------------------------------
def _walk(folder: Path):
    """(path, lstat) of everything below ``folder``, links not followed, sorted."""
    for entry in sorted(os.scandir(folder), key=lambda e: e.name):
        path = Path(entry.path)
        st = os.lstat(path)
        yield path, st
        if stat.S_ISDIR(st.st_mode):
            yield from _walk(path)


def seal_tree(folder: str | Path) -> None:
    """Make the folder entry private (no group/other write bit on anything in it) and record the
    sha256 of each of its files in :data:`TREE_RECORD`. Only for a folder this process just
    wrote (before it is moved into place); a link in it is an error."""
    folder = Path(folder)
    lines = []
    for path, st in [(folder, os.lstat(folder)), *_walk(folder)]:
        if stat.S_ISLNK(st.st_mode) or not (stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode)):
            raise CacheError(f"cannot cache {path}: it is not a regular file or folder")
        os.chmod(path, stat.S_IMODE(st.st_mode) & ~(stat.S_IWGRP | stat.S_IWOTH))
        if stat.S_ISREG(st.st_mode):
            rel = path.relative_to(folder).as_posix()
            if "\n" in rel or rel == TREE_RECORD:
                raise CacheError(f"cannot cache {path}: its name cannot be recorded")
            lines.append(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {rel}\n")
    atomic_write(folder / TREE_RECORD, "".join(lines), mode=0o644)


def tree_problem(folder: str | Path) -> str | None:
    """Why the folder entry must not be used, or None: the folder and every folder and file in
    it pass the trust checks, and its files are exactly those recorded, with those hashes."""
    folder = Path(folder)
    recorded, problem = read_trusted(folder / TREE_RECORD)
    if problem:
        return f"{folder / TREE_RECORD}: {problem}"
    if recorded is None:
        return f"{folder}: no content hashes were recorded for it ({TREE_RECORD} is missing)"
    want = {}
    for line in recorded.decode("utf-8", "replace").splitlines():
        digest, _, rel = line.partition("  ")
        want[rel] = digest
    have = {}
    try:
        for path, st in _walk(folder):
            if stat.S_ISDIR(st.st_mode):
                why = folder_problem(st, path)
                if why:
                    return f"{path}: it {why}"
                continue
            rel = path.relative_to(folder).as_posix()
            if rel == TREE_RECORD:
                continue
            data, why = read_trusted(path)
            if why:
                return f"{path}: {why}"
            have[rel] = hashlib.sha256(data).hexdigest()
    except OSError as exc:
        return f"{folder}: it cannot be inspected ({exc.strerror})"
    if set(have) != set(want):
        extra, missing = sorted(set(have) - set(want)), sorted(set(want) - set(have))
        return f"{folder}: its files differ from those recorded (extra {extra}, missing {missing})"
    changed = sorted(rel for rel in have if have[rel] != want[rel])
    if changed:
        return f"{folder}: the sha256 of {', '.join(changed)} does not match the hash recorded"
    return None


def discard(path: str | Path) -> None:
    """Remove an untrusted entry of our own (a folder or a file): moved aside first, so a reader
    never sees it half removed; links in it are removed, never followed."""
    path = Path(path)
    aside = Path(tempfile.mkdtemp(prefix=f".{path.name}.old.", dir=path.parent))
    try:
        os.replace(path, aside / path.name)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
