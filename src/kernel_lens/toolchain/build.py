"""Compile generated C++ sources into one shared library, with a content-addressed cache.

The library lands at ``<cache>/<key[:16]>/<name>.so`` where ``key`` is a sha256 over everything
that determines the output: the sources, the flags, a fingerprint of each include folder (the
contents of every header in it), the compiler's identity (``--version``, resolved path and sha256
of the binary), the environment variables the compiler reads (:data:`KEY_ENV_VARS`) and
``key_extra``. A cache hit returns without running the compiler.

The cache trusts only what this user wrote (docs/security.md), by the rules of
:mod:`kernel_lens.toolchain.cache`: the cache root, the key's folder and ``failed/`` must be real
folders (not links) owned by the current user and writable by no one else, else
:class:`CacheError`. Next to each library, ``<name>.so.sha256`` records the sha256 of its bytes.
A library is reused only if it and its record are regular files (not links) owned by the current
user and not writable by group or others, and its bytes match the record; anything else is
logged as a warning and rebuilt (atomically replaced, a link at the name is replaced, never
followed).

Builds are atomic and safe across processes: the compiler writes a temporary file in the key's
folder which is then ``os.replace``d into place, under an exclusive ``flock`` on the key's lock
file (opened with ``O_NOFOLLOW``: a link there is a :class:`CacheError`); a second process building
the same key waits for the lock and then finds the library.

Include folders are passed with ``-isystem``: they hold third-party headers (ONNX Runtime,
TensorRT, CUDA) whose own warnings are not ours, while ``-Wall -Wextra -Werror`` applies to the
generated sources and to any header passed among ``sources`` (included with ``#include "x.h"``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import shlex
import shutil
import stat
import tempfile
import time
import contextlib
from contextlib import contextmanager
from pathlib import Path, PurePosixPath
from typing import Iterator, Mapping, Sequence

from kernel_lens.errors import BuildError, CacheError, ToolchainError
from kernel_lens.fileio import atomic_write, held_lock, umask
from kernel_lens.toolchain.cache import (CACHE_HINT, FAILED, cache_folder, cache_root,
                                         entry_problem, record_hash, trusted_folder)
from kernel_lens.toolchain.compilers import find_cxx, toolchain_id
from kernel_lens.toolchain.headers import header_fingerprint, include_folder_problem
from kernel_lens.toolchain.process_group import run_group

log = logging.getLogger(__name__)

CXX_FLAGS = ("-std=c++17", "-O2", "-fPIC", "-shared", "-Wall", "-Wextra", "-Werror",
             "-fvisibility=hidden")
LINK_FLAGS = ("-Wl,--no-undefined", "-ldl")  # no -lcuda: generated code dlopen()s the driver
CXX_SUFFIXES = (".cpp", ".cc", ".cxx", ".c++")
MAX_STDERR_LINES = 60
_KEY_SCHEMA = "kernel_lens.build/2"
# Environment that can change what the compiler produces: the compiler's choice, flags variables
# (not read by g++ itself, keyed so a build wrapper honouring them never reuses a stale library),
# the search paths g++/cc1plus/collect2/ld read, reproducible-build time stamps, and ld's default
# run path. The compiler runs with the caller's environment (LC_ALL=C), so all of these reach it.
KEY_ENV_VARS = ("CXX", "KERNEL_LENS_CXX", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH",
                "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH", "LIBRARY_PATH", "GCC_EXEC_PREFIX",
                "COMPILER_PATH", "SOURCE_DATE_EPOCH", "LD_RUN_PATH", "GCC_COMPARE_DEBUG")
# Default system include folders: passing them with -isystem reorders the search and breaks
# libstdc++'s #include_next, and they are searched anyway.
_DEFAULT_INCLUDE_DIRS = {Path("/usr/include"), Path("/usr/local/include"),
                         Path("/usr/include") / f"{platform.machine()}-linux-gnu"}


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
        "env": {var: os.environ[var] for var in KEY_ENV_VARS if var in os.environ},
        "machine": platform.machine(),
        "extra": key_extra,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@contextmanager
def _locked(lock_path: Path, what: str) -> Iterator[None]:
    try:
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        why = "it is a symbolic link" if os.path.islink(lock_path) else exc.strerror
        raise CacheError(f"cannot open the build cache lock file {lock_path}: {why}; remove it "
                         f"(it is recreated), or {CACHE_HINT}") from None

    def check(st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise CacheError(f"refusing the build cache lock file {lock_path}: it is not a regular "
                             f"file owned by the current user; remove it (it is recreated), or "
                             f"{CACHE_HINT}")

    def waiting() -> contextlib.AbstractContextManager:
        log.info("waiting for another process building %s", what)
        return contextlib.nullcontext()

    with held_lock(fd, check, waiting):
        yield


def _trim(text: str, keep_path: Path | str) -> str:
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
    for folder in includes:
        problem = include_folder_problem(folder)
        if problem is not None:
            raise BuildError(f"library {name}: include folder {folder} is not trusted: {problem}; "
                             f"headers compiled in must be yours or root's and writable by no one else "
                             f"(kernel_lens fetch-headers fetches them so)")
    flags = [*CXX_FLAGS, *extra_flags]
    key = _cache_key(name, sources, flags, includes, toolchain_id(cxx), key_extra)
    root = cache_root(cache_dir)  # the plugin-library cache: private, and so is the way to it
    key_dir = root / key[:16]
    lib = key_dir / f"{name}.so"
    if os.path.lexists(key_dir):
        trusted_folder(key_dir, "build cache key folder", removable=True)
        if entry_problem(lib)[1] is None:
            log.debug("cache hit: %s", lib)
            return lib
    else:
        try:
            os.mkdir(key_dir, 0o755)
        except FileExistsError:  # made by another process meanwhile
            pass
        trusted_folder(key_dir, "build cache key folder", removable=True)
    with _locked(key_dir / ".lock", f"{name} ({key[:16]})"):
        _, problem = entry_problem(lib)  # checked again: another process may have built it meanwhile
        if problem is None:
            log.debug("cache hit after waiting: %s", lib)
            return lib
        if problem != "missing":
            log.warning("build cache entry not reused, rebuilding it: %s", problem)
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
            proc = run_group(cmd, cwd=work, env={**os.environ, "LC_ALL": "C"})
        except OSError as exc:
            raise ToolchainError(f"cannot run the C++ compiler {cxx}: {exc}; set KERNEL_LENS_CXX "
                                 "to a working C++ compiler") from None
        if proc.returncode != 0 or not tmp_out.is_file() or tmp_out.stat().st_size == 0:
            try:
                command, kept = _keep_failed(name, key, root, work, cmd, tmp_out, proc.stderr)
                where, full = f"the failing sources are kept in {kept}", kept / "stderr.txt"
            except CacheError as exc:  # the build's own error stays the one raised
                command, full = shlex.join(cmd), "the compiler's stderr"
                where = f"the failing sources were not kept: {exc}"
            raise BuildError(
                f"building {name} failed (exit {proc.returncode}).\n"
                f"command: {command}\n"
                f"{_trim(proc.stderr or proc.stdout or '(no compiler output)', full)}\n{where}")
        os.chmod(tmp_out, 0o755 & ~umask())  # mkstemp made it 0600; never group/world-writable
        if lib.is_dir() and not lib.is_symlink():
            raise CacheError(f"cannot replace the build cache entry {lib}: it is a folder; remove it")
        digest = hashlib.sha256(tmp_out.read_bytes()).hexdigest()
        os.replace(tmp_out, lib)  # a link at lib is replaced, not followed
        record_hash(lib, digest)  # second: a crash in between leaves a mismatch, so a rebuild
    finally:
        tmp_out.unlink(missing_ok=True)
        shutil.rmtree(work, ignore_errors=True)
    log.info("building %s (%d sources)... done in %.2f s", name, len(sources), time.monotonic() - start)


def _keep_failed(name: str, key: str, root: Path, work: Path, cmd: list[str], tmp_out: Path,
                 stderr: str) -> tuple[str, Path]:
    """Move the failing build's sources to ``<cache>/failed/<name>-<key>`` (a trusted folder, like
    every cache folder); the command that reruns the build there, and the folder."""
    failed = cache_folder(FAILED, root=root)
    kept = failed / f"{name}-{key[:16]}"
    if kept.is_symlink():  # replaced, never followed (shutil.move would move into its target)
        kept.unlink()
    shutil.rmtree(kept, ignore_errors=True)
    shutil.move(str(work), str(kept))
    os.chmod(kept, 0o755 & ~umask())  # mkdtemp made it 0700; never group/world-writable
    # The command as run, its temporary output renamed so it can be rerun in the kept folder.
    rerun = [f"{name}.so" if arg == str(tmp_out) else arg for arg in cmd]
    command = f"cd {shlex.quote(str(kept))} && {shlex.join(rerun)}"
    atomic_write(kept / "command.txt", command + "\n", mode=0o644)
    atomic_write(kept / "stderr.txt", stderr, mode=0o644)
    return command, kept
