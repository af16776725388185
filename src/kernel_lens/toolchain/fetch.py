"""Download pinned third-party packages and put them in place: the one copy of what the fetchers
share (``kernel_lens fetch-headers``, ``kernel_lens.serving.fetch``, scripts/fetch_tensorrt_rtx.py).

A fetcher says what to download and what to keep of it; this module does the rest:

- downloads run in a fresh temporary folder (:func:`download_folder`), which is also the
  tools' working folder: ``pip`` runs as ``python -I -m pip`` (:func:`pip_command`: isolated, so
  neither a ``pip/`` package in the caller's folder nor ``PYTHONPATH`` can stand in for pip),
  ``npm pack`` finds no project ``.npmrc``; pins are checked by ``pip --require-hashes``
  (:func:`pip_download`) or against a pinned sha256 (:func:`check_sha256`);
- :func:`unpack` writes the members a fetcher selects from a wheel, zip or tarball (regular files
  only; a name leading outside the folder is refused), readable by all, writable by the owner;
- :func:`install` fills a fresh staging folder next to the destination and swaps it into place
  (``renameat2(RENAME_EXCHANGE)`` where the file system has it, else two renames), so a reader
  sees the old folder or the new one, and an interrupted run leaves no half folder.

The destination is trusted only as a cache this user owns (docs/security.md):
:func:`check_destination` refuses, with a one-line :class:`~kernel_lens.errors.CacheError`, a
destination that exists and is a link, not a folder, another user's, or writable by group or
others, and a parent folder that is a link, not a folder, neither this user's nor root's, or
writable by others without the sticky bit (``/tmp`` is fine). An existing destination is replaced
only when it is empty or carries the stamp (:data:`STAMP`) a fetch left in it: a ``--dest``
pointing at a folder of other files is refused, never emptied.

Standard library only (with kernel_lens.errors and kernel_lens.fileio, which are too), so the
scripts run it before kernel_lens or torch is installed.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Callable, Iterator, Sequence

from kernel_lens.errors import CacheError, FetchError
from kernel_lens.fileio import umask

STAMP = ".kernel_lens-fetched"  # written into every installed folder: what was fetched into it
DEFAULT_HINT = "pass a destination folder of your own"

Select = Callable[[str], "str | None"]  # archive member name -> name inside the folder, or None


# --- downloading ---

@contextmanager
def download_folder(prefix: str = "kl_fetch_") -> Iterator[Path]:
    """A fresh private temporary folder for downloads (and the tools' working folder), removed
    afterwards."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        yield Path(tmp)


def run_tool(cmd: Sequence[str], cwd: Path, what: str, hint: str) -> subprocess.CompletedProcess:
    """Run a download tool in ``cwd`` (a :func:`download_folder`); :class:`FetchError` with its
    output and ``hint`` when it is missing or fails."""
    try:
        proc = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise FetchError(f"{what}: '{cmd[0]}' not found on PATH. {hint}") from None
    if proc.returncode != 0:
        out = proc.stderr.strip() or proc.stdout.strip() or "(no output)"
        raise FetchError(f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{out}\n{hint}")
    return proc


def pip_command(*args: str) -> list[str]:
    """This Python's pip, isolated (``-I``: no script or current folder on sys.path, no
    PYTHON* variables, no user site), so only the installed pip can run."""
    return [sys.executable, "-I", "-m", "pip", *args]


def pip_download(folder: Path, requirements: Sequence[str], what: str, hint: str,
                 options: Sequence[str] = (), pattern: str = "*.whl") -> list[Path]:
    """Download binary wheels for ``requirements`` (requirement-file lines, each pinned with
    ``--hash=sha256:...`` when ``--require-hashes`` is among ``options``) into ``folder/wheels``,
    without dependencies; pip runs with ``folder`` as its working folder. Returns the wheels
    matching ``pattern``; none is a :class:`FetchError`."""
    req = folder / "requirements.txt"
    req.write_text("".join(f"{line}\n" for line in requirements))
    wheels = folder / "wheels"
    run_tool(pip_command("download", "-q", "--no-deps", "--only-binary=:all:", *options,
                         "-r", str(req), "-d", str(wheels)), folder, f"pip download of {what}", hint)
    found = sorted(wheels.glob(pattern))
    if not found:
        raise FetchError(f"pip download of {what} left no {pattern} in {wheels}")
    return found


def npm_pack(folder: Path, spec: str, hint: str) -> Path:
    """``npm pack spec`` into ``folder`` (also its working folder); the one .tgz it wrote."""
    run_tool(["npm", "pack", "--silent", spec], folder, f"npm pack {spec}", hint)
    tgzs = sorted(folder.glob("*.tgz"))
    if len(tgzs) != 1:
        raise FetchError(f"npm pack {spec} produced {len(tgzs)} .tgz files in {folder}, expected 1")
    return tgzs[0]


def check_sha256(path: Path, expected: str, verify: bool = True, what: str = "it") -> None:
    """Refuse (:class:`FetchError`) a downloaded archive whose sha256 is not the pinned one."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    digest = h.hexdigest()
    if verify and digest != expected:
        raise FetchError(f"{path.name}: sha256 {digest} differs from the pinned {expected}; refusing "
                         f"to install {what} from an unexpected archive (pass --no-verify to override)")


# --- unpacking ---

def keep_all(name: str) -> str:
    return name


def _member_path(folder: Path, archive: Path, member: str, name: str) -> Path:
    rel = PurePosixPath(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name:
        raise FetchError(f"{archive.name}: refusing member {member!r} (outside the folder)")
    return folder.joinpath(*rel.parts)


def _write_member(src, path: Path, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(path, ((mode & 0o777 or 0o644) | 0o444) & 0o755)  # readable; writable by the owner only


def unpack(archive: Path, folder: Path, select: Select = keep_all) -> list[str]:
    """Write the regular-file members of ``archive`` (.whl/.zip, or a tarball) that ``select``
    keeps into ``folder``, each under the name ``select`` gives it, with the archive's execute
    bits (zipfile and tarfile would drop or keep too much). Returns the names written."""
    written: list[str] = []
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                name = None if info.is_dir() else select(info.filename)
                if name is None:
                    continue
                path = _member_path(folder, archive, info.filename, name)
                with zf.open(info) as src:
                    _write_member(src, path, info.external_attr >> 16)
                written.append(name)
        return written
    with tarfile.open(archive, mode="r|*") as tar:  # streamed: one pass over the archive
        for member in tar:
            name = select(member.name) if member.isfile() else None
            if name is None:
                continue
            path = _member_path(folder, archive, member.name, name)
            _write_member(tar.extractfile(member), path, member.mode)
            written.append(name)
    return written


# --- the destination ---

def _folder_problem(path: Path, *, parent: bool) -> str | None:
    """Why ``path`` (which exists) cannot be trusted as a fetch destination or its parent."""
    st = os.lstat(path)
    mode = stat.S_IMODE(st.st_mode)
    if stat.S_ISLNK(st.st_mode):
        return f"is a symbolic link (to {os.readlink(path)}); pass the folder itself"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a folder; remove it or pass another folder"
    if st.st_uid != os.geteuid() and not (parent and st.st_uid == 0):
        return (f"is owned by uid {st.st_uid}, not by the current user (uid {os.geteuid()}); "
                "pass a folder of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not (parent and st.st_mode & stat.S_ISVTX):
        return (f"is writable by group or others (mode {mode:o}{', no sticky bit' if parent else ''}); "
                f"run `chmod go-w {path}`" + ("" if parent else " or remove it (it is fetched again)"))
    return None


def _check(path: Path, *, parent: bool, hint: str) -> None:
    try:
        problem = _folder_problem(path, parent=parent)
    except OSError as exc:
        problem = f"cannot be inspected ({exc.strerror})"
    if problem:
        what = "the folder holding the fetch destination" if parent else "the fetch destination"
        raise CacheError(f"refusing {what} {path}: it {problem} ({hint})")


def check_destination(final: Path, hint: str = DEFAULT_HINT) -> bool:
    """Check ``final`` and its parent folder before anything is read from or written to them
    (the parent is created, 0755 less the umask, when missing); :class:`CacheError` naming the
    folder and the fix (``hint`` says how this fetcher's destination is chosen). Returns whether
    ``final`` exists."""
    parent = final.parent
    if not os.path.lexists(parent):
        try:
            parent.parent.mkdir(parents=True, exist_ok=True)
            os.mkdir(parent, 0o755)
            os.chmod(parent, 0o755 & ~umask())  # 0755 less the umask: never writable by others
        except FileExistsError:
            pass  # made meanwhile: checked below like any other
        except OSError as exc:
            raise CacheError(f"cannot create {parent}: {exc.strerror} ({hint})") from None
    _check(parent, parent=True, hint=hint)
    if not os.path.lexists(final):
        return False
    _check(final, parent=False, hint=hint)
    return True


def _replaceable(final: Path, hint: str) -> None:
    """Refuse to replace an existing folder that no fetch made (not empty, no stamp)."""
    if (final / STAMP).is_file() or not any(final.iterdir()):
        return
    raise CacheError(f"refusing to replace {final}: it is not empty and no kernel_lens fetch made it "
                     f"(no {STAMP} in it); remove it or pick another folder ({hint})")


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Atomically exchange two paths (Linux renameat2); False where it is not available."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _swap(staging: Path, final: Path, hint: str) -> Path | None:
    """Put ``staging`` at ``final``; returns the folder now holding what was at ``final``, for
    the caller to remove (None when nothing was there)."""
    if not os.path.lexists(final):
        try:
            os.rename(staging, final)
            return None
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
    # final exists (or appeared meanwhile): replace it only if it is a trusted fetched folder
    _check(final, parent=False, hint=hint)
    _replaceable(final, hint)
    if _exchange(staging, final):
        return staging
    aside = Path(tempfile.mkdtemp(prefix=f".{final.name}.old.", dir=final.parent))
    os.rename(final, aside)  # onto an empty folder of ours: atomic
    try:
        os.rename(staging, final)
    except BaseException:
        os.rename(aside, final)  # put the old folder back
        raise
    return aside


def install(final: Path, fill: Callable[[Path], None], what: str, hint: str = DEFAULT_HINT) -> Path:
    """Make ``final`` hold what ``fill`` writes into a fresh folder: ``fill`` gets a staging
    folder next to ``final`` (same file system), which is then swapped into place; old content
    is removed afterwards. Any failure removes the staging folder and leaves ``final`` as it was.
    ``what`` (the pinned package) is recorded in ``final/STAMP``."""
    final = Path(final).absolute()
    check_destination(final, hint)
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    leftover: Path | None = staging  # removed at the end: staging, or once swapped the old folder
    try:
        fill(staging)
        stamp = staging / STAMP
        stamp.write_text(f"{what}\n")
        os.chmod(stamp, 0o644 & ~umask())
        os.chmod(staging, 0o755 & ~umask())  # mkdtemp made it 0700; the cache may be shared
        leftover = _swap(staging, final, hint)
    finally:
        if leftover is not None:
            shutil.rmtree(leftover, ignore_errors=True)
    return final
