"""Writing files safely: atomic replacement, never through a link, never outside a folder.

Every file kernel_lens writes into a user's folder goes through :func:`atomic_write`: the data
lands in a fresh ``mkstemp`` file in the destination folder (unpredictable name, created with
``O_EXCL``, so no link planted there is followed) and is then ``os.replace``d onto the final
name. ``os.replace`` replaces a symlink sitting at that name; it never writes through it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
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
    """``folder / name``, refused unless it lies inside ``folder`` (no '..', no absolute name,
    no link in ``name``'s own parts leading out)."""
    folder = Path(folder)
    path = folder / name
    root = folder.resolve()
    # resolve() follows links already in place; strict=False keeps not-yet-written names.
    target = path.parent.resolve() / path.name
    if Path(name).is_absolute() or ".." in Path(name).parts or not target.is_relative_to(root) \
            or target == root:
        raise OutputPathError(f"refusing to write {str(name)!r}: it does not lie inside the output "
                              f"folder {folder}")
    return path


def check_folder(folder: str | Path) -> Path:
    """``folder``, refused when it exists and is not a folder (checked before any work starts)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputPathError(f"output path {folder} exists and is not a folder; pass -o with a "
                              f"folder name (it is created if missing)")
    return folder


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
