"""Compile generated C++ sources into one shared library, with a content-addressed cache.

The library lands at ``<cache>/<key[:16]>/<name>.so`` where ``key`` is a sha256 over everything
that determines the output: the sources, the flags, a fingerprint of each include folder (header
names and sizes, ONNX Runtime API / TensorRT / CUDA runtime versions), the compiler's identity and
``key_extra``. A cache hit returns at once without running the compiler.

Builds are atomic and safe across processes: the compiler writes a temporary file in the key's
folder which is then ``os.replace``d into place, under an exclusive ``flock`` on the key's lock
file; a second process building the same key waits for the lock and then finds the library.

Include folders are passed with ``-isystem``: they hold third-party headers (ONNX Runtime,
TensorRT, CUDA) whose own warnings are not ours, while ``-Wall -Wextra -Werror`` applies to the
generated sources and to any header passed among ``sources`` (included with ``#include "x.h"``).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping, Sequence

from kernel_lens.errors import BuildError, ToolchainError
from kernel_lens.toolchain.compilers import find_cxx, toolchain_id
from kernel_lens.toolchain.headers import header_fingerprint

log = logging.getLogger(__name__)

CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
             "-fvisibility=hidden")
LINK_FLAGS = ("-Wl,--no-undefined", "-ldl")  # no -lcuda: generated code dlopen()s the driver
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++")
MAX_STDERR_LINES = 60
_KEY_SCHEMA = "kernel_lens.build/1"
# Default system include folders: passing them with -isystem reorders the search and breaks
# libstdc++'s #include_next, and they are searched anyway.
_DEFAULT_INCLUDE_DIRS = {Path("/usr/include"), Path("/usr/local/include"),
                         Path("/usr/include") / f"{platform.machine()}-linux-gnu"}


def _umask() -> int:
    """The process umask, read without changing it (os.umask would, racing other threads)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def build_cache_dir(cache_dir: Path | None = None) -> Path:
    """Cache root: ``cache_dir``, else $KERNEL_LENS_CACHE, else ~/.cache/kernel_lens/build."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("KERNEL_LENS_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "build"


def _check_inputs(name: str, sources: Mapping[str, str]) -> list[str]:
    if not name or "/" in name or name.startswith(".") or name != name.strip():
        raise BuildError(f"library name {name!r} must be a plain file stem (no '/', not hidden)")
    for fname, text in sources.items():
        parts = PurePosixPath(fname).parts
        if not parts or PurePosixPath(fname).is_absolute() or ".." in parts:
            raise BuildError(f"library {name}: source name {fname!r} must be a relative path "
                             "without '..'")
        if not isinstance(text, str):
            raise BuildError(f"library {name}: source {fname!r} must be text, got {type(text).__name__}")
    units = sorted(f for f in sources if f.endswith(CXX_SUFFIXES))
    if not units:
        raise BuildError(f"library {name}: no C++ translation unit among sources {sorted(sources)} "
                         f"(expected a name ending in {', '.join(CXX_SUFFIXES)})")
    return units


def _cache_key(name: str, sources: Mapping[str, str], flags: Sequence[str],
               include_dirs: Sequence[Path], toolchain: str, key_extra: str) -> str:
    payload = {
        "schema": _KEY_SCHEMA,
        "name": name,
        "sources": sorted((f, hashlib.sha256(t.encode()).hexdigest()) for f, t in sources.items()),
        "flags": list(flags),
        "link": list(LINK_FLAGS),
        "includes": [header_fingerprint(d) for d in include_dirs],
        "toolchain": toolchain,
        "machine": platform.machine(),
        "extra": key_extra,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@contextmanager
def _locked(lock_path: Path, what: str) -> Iterator[None]:
    with open(lock_path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process building %s", what)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _trim(text: str, keep_path: Path) -> str:
    lines = text.rstrip().splitlines()
    if len(lines) <= MAX_STDERR_LINES:
        return "\n".join(lines)
    return "\n".join(lines[:MAX_STDERR_LINES] +
                     [f"... [{len(lines) - MAX_STDERR_LINES} more lines in {keep_path}]"])


def build_shared_library(name: str, sources: dict[str, str], *, include_dirs: list[Path],
                         extra_flags: Sequence[str] = (), cache_dir: Path | None = None,
                         key_extra: str = "") -> Path:
    """Compile ``sources`` (file name -> text) into ``<cache>/<key[:16]>/<name>.so``; return its path.

    Every source whose name ends in .cpp/.cc/.cxx/.c++ is compiled; the others (headers) are only
    written next to them. Raises :class:`ToolchainError` when no compiler is found and
    :class:`BuildError` when compilation fails (with the command, the compiler's stderr and the
    folder where the failing sources were kept).
    """
    units = _check_inputs(name, sources)
    cxx = find_cxx()
    includes = [Path(d).expanduser().resolve() for d in include_dirs]
    missing = [str(d) for d in includes if not d.is_dir()]
    if missing:
        raise BuildError(f"library {name}: include folder(s) {', '.join(missing)} do not exist")
    flags = [*CXX_FLAGS, *extra_flags]
    key = _cache_key(name, sources, flags, includes, toolchain_id(cxx), key_extra)
    root = build_cache_dir(cache_dir)
    key_dir = root / key[:16]
    lib = key_dir / f"{name}.so"
    if lib.is_file():
        log.debug("cache hit: %s", lib)
        return lib
    key_dir.mkdir(parents=True, exist_ok=True)
    with _locked(key_dir / ".lock", f"{name} ({key[:16]})"):
        if lib.is_file():  # built by another process while we waited
            log.debug("cache hit after waiting: %s", lib)
            return lib
        _compile(name, sources, units, cxx, flags, includes, root, key, lib)
    return lib


def _compile(name: str, sources: Mapping[str, str], units: list[str], cxx: str, flags: list[str],
             includes: list[Path], root: Path, key: str, lib: Path) -> None:
    start = time.monotonic()
    log.info("building %s (%d sources)...", name, len(sources))
    work = Path(tempfile.mkdtemp(prefix=f"kl_build_{name}_"))
    fd, tmp_name = tempfile.mkstemp(prefix=f".{name}.", suffix=".so.tmp", dir=lib.parent)
    os.close(fd)
    tmp_out = Path(tmp_name)
    try:
        for fname, text in sources.items():
            path = work / fname
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
        isystem = [arg for d in includes if d not in _DEFAULT_INCLUDE_DIRS for arg in ("-isystem", str(d))]
        cmd = [cxx, *flags, *isystem, *units, "-o", str(tmp_out), *LINK_FLAGS]
        try:
            proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True,
                                  env={**os.environ, "LC_ALL": "C"})
        except OSError as exc:
            raise ToolchainError(f"cannot run the C++ compiler {cxx}: {exc}; set KERNEL_LENS_CXX "
                                 "to a working C++ compiler") from None
        if proc.returncode != 0 or not tmp_out.is_file() or tmp_out.stat().st_size == 0:
            kept = root / "failed" / f"{name}-{key[:16]}"
            shutil.rmtree(kept, ignore_errors=True)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(work), str(kept))
            os.chmod(kept, 0o777 & ~_umask())  # mkdtemp made it 0700
            # The command as run, its temporary output renamed so it can be rerun in the kept folder.
            rerun = [f"{name}.so" if arg == str(tmp_out) else arg for arg in cmd]
            command = f"cd {shlex.quote(str(kept))} && {shlex.join(rerun)}"
            (kept / "command.txt").write_text(command + "\n")
            (kept / "stderr.txt").write_text(proc.stderr)
            raise BuildError(
                f"building {name} failed (exit {proc.returncode}).\n"
                f"command: {command}\n"
                f"{_trim(proc.stderr or proc.stdout or '(no compiler output)', kept / 'stderr.txt')}\n"
                f"the failing sources are kept in {kept}")
        os.chmod(tmp_out, 0o777 & ~_umask())  # mkstemp made it 0600
        os.replace(tmp_out, lib)
    finally:
        tmp_out.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    log.info("building %s (%d sources)... done in %.2f s", name, len(sources), time.monotonic() - start)
