"""Writing files safely: atomic replacement, never through a link, never outside a folder.

Every file kernel_lens writes into a user's folder goes through :func:`atomic_write`: the data
lands in a fresh ``mkstemp`` file in the destination folder (unpredictable name, created with
``O_EXCL``, so no link planted there is followed) and is then ``os.replace``d onto the final
name. ``os.replace`` replaces a symlink sitting at that name; it never writes through it.
Every folder kernel_lens makes below an output folder goes through :func:`subfolder`: each part
is made or checked with ``lstat`` to be a real folder, not a link, before a byte is written.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from .errors import OutputPathError


def umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def inside(folder: str | Path, name: str | Path) -> Path:
    """``folder / name``, refused unless it lies inside ``folder``: no '..', no absolute name, and
    no link at any level below ``folder`` (each existing part of ``name`` but the last must be a
    real folder; the last may be a link to a file, which :func:`atomic_write` replaces, but not a
    link to a folder, which would be written into). Checked with ``lstat``, part by part."""
    folder = Path(folder)
    rel = Path(name)
    path = folder / rel
    if rel.is_absolute() or ".." in rel.parts or not rel.parts:
        raise OutputPathError(f"refusing to write {str(name)!r}: it does not lie inside the output "
                              f"folder {folder}")
    current = folder
    for part in rel.parts[:-1]:
        current = current / part
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            break  # the rest is not made yet (subfolder() makes it, checking each part)
        except OSError as exc:
            raise OutputPathError(f"cannot inspect {current}: {exc.strerror}") from None
        _check_real_folder(current, st)
    if os.path.islink(path) and os.path.isdir(path):
        raise OutputPathError(f"refusing to write {path}: it is a symbolic link to a folder "
                              f"({os.readlink(path)}); remove the link (kernel_lens makes the folder)")
    root = folder.resolve()
    # resolve() follows links already in place; strict=False keeps not-yet-written names.
    target = path.parent.resolve() / path.name
    if not target.is_relative_to(root) or target == root:
        raise OutputPathError(f"refusing to write {str(name)!r}: it does not lie inside the output "
                              f"folder {folder}")
    return path


def _check_real_folder(path: Path, st: os.stat_result) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise OutputPathError(f"refusing to write into {path}: it is a symbolic link (to "
                              f"{os.readlink(path)}), and every folder kernel_lens writes below the "
                              f"output folder must be a real one; remove the link (it is recreated)")
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"refusing to write into {path}: it is not a folder; remove it or "
                              f"choose another output folder")


def subfolder(root: str | Path, rel: str | Path) -> Path:
    """``root / rel`` as a real folder inside ``root``, made if missing: each part of ``rel`` is
    created or checked in turn with ``lstat`` (a link or a non-folder at any level is an
    :class:`OutputPathError`), before anything is written into it. ``root`` itself is the
    user's choice (it may be a link); what kernel_lens makes below it is not."""
    root = ensure_folder(root)
    path = inside(root, rel)
    current = root
    for part in Path(rel).parts:
        current = current / part
        try:
            os.mkdir(current)  # 0o777 & ~umask, like any folder the user makes
        except FileExistsError:
            pass
        except OSError as exc:
            raise OutputPathError(f"cannot create the folder {current}: {exc.strerror}") from None
        _check_real_folder(current, os.lstat(current))
    return path


def check_folder(folder: str | Path) -> Path:
    """``folder``, refused when it exists and is not a folder (checked before any work starts)."""
    folder = Path(folder)
    try:
        exists = folder.exists()
    except OSError as exc:  # a name too long (ENAMETOOLONG), a file where a folder must be
        raise OutputPathError(f"output path {str(folder)[:120]!r} cannot be used: {exc.strerror}; "
                              f"pass -o with another folder name") from None
    if exists and not folder.is_dir():
        raise OutputPathError(f"output path {folder} exists and is not a folder; pass -o with a "
                              f"folder name (it is created if missing)")
    _check_writable(folder)
    return folder


def _check_writable(folder: Path) -> None:
    """The folder, or the nearest part of its path that exists, can be written into (so the
    compile can create and fill it): checked before any work, not after the capture."""
    existing = folder.absolute()
    while not os.path.lexists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputPathError(f"output folder {folder} cannot be created: {existing} is not a "
                              f"folder; pass -o with another folder name")
    if not os.access(existing, os.W_OK | os.X_OK):
        what = "is" if existing == folder.absolute() else f"would be created in {existing}, which is"
        raise OutputPathError(f"output folder {folder} {what} not writable by you; pass -o with "
                              f"a folder you can write")


def ensure_folder(folder: str | Path) -> Path:
    """Create ``folder`` (and parents); a path that exists and is not a folder is an error."""
    folder = check_folder(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputPathError(f"cannot create output folder {folder}: {exc.strerror}") from None
    return folder


def atomic_write(path: str | Path, data: bytes | str, mode: int | None = None) -> Path:
    """Write ``data`` to ``path`` atomically; a link at ``path`` is replaced, not followed."""
    path = Path(path)
    if isinstance(data, str):
        data = data.encode("utf-8")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, (0o666 if mode is None else mode) & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_copy(src: str | Path, path: str | Path, mode: int = 0o755) -> Path:
    """Copy ``src`` to ``path`` atomically (same guarantees as :func:`atomic_write`)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out)
        os.chmod(tmp, mode & ~umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (another user's counts: it cannot be signalled, but it is
    there), to tell a staging folder a killed process left from one still being written."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


@contextlib.contextmanager
def held_lock(fd: int, check: Callable[[os.stat_result], None],
              waiting: Callable[[], contextlib.AbstractContextManager]) -> Iterator[None]:
    """An exclusive ``flock`` on the lock file open at ``fd``, held for the ``with`` block; ``fd``
    is closed after it. ``check`` sees the file's ``fstat`` first (and raises to refuse it); when
    another process holds the lock, the wait happens inside ``waiting()`` (a progress stage, a log
    line)."""
    try:
        check(os.fstat(fd))
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            with waiting():
                fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
