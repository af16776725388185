"""Locate the C++ compiler (and optionally nvcc) used to build generated plugin libraries.

Building needs only a host C++ compiler: generated code dlopen()s the CUDA driver, so no GPU,
driver or CUDA toolkit is required. nvcc is optional (only for sources that need it).

Variables, each checked first and an error when set to something that is not an executable:

- ``KERNEL_LENS_CXX``, then ``CXX``: the C++ compiler (else ``g++``, ``c++``, ``clang++`` on PATH);
- ``KERNEL_LENS_NVCC``: nvcc (else ``$CUDA_HOME/bin/nvcc``, ``nvcc`` on PATH, /usr/local/cuda/bin/nvcc);
  every CUDA toolkit program (nvcc, ptxas) is found by :func:`find_cuda_tool`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from kernel_lens.errors import ToolchainError
from kernel_lens.toolchain.process_group import run_group


def which(name: str) -> str | None:
    """``shutil.which`` over the absolute entries of PATH only: an empty or relative entry
    ('.', '', 'bin') would make a planted ``./g++`` or ``./nvcc`` in the current folder run."""
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if os.path.isabs(p))
    return shutil.which(name, path=path)


def _from_env(var: str, what: str) -> str | None:
    value = os.environ.get(var)
    if not value:
        return None
    found = which(os.path.expanduser(value))
    if found is None:
        raise ToolchainError(f"{var}={value} is not an executable {what}; set {var} to the path "
                             f"of a {what}, or unset it")
    return os.path.abspath(found)


def find_cxx() -> str:
    """Absolute path of the C++ compiler: $KERNEL_LENS_CXX, $CXX, then g++/c++/clang++ on PATH."""
    for var in ("KERNEL_LENS_CXX", "CXX"):
        found = _from_env(var, "C++ compiler")
        if found:
            return found
    for name in ("g++", "c++", "clang++"):
        found = which(name)
        if found:
            return os.path.abspath(found)
    raise ToolchainError("no C++ compiler found: none of g++, c++, clang++ is on PATH; install one "
                         "(e.g. apt-get install g++) or set KERNEL_LENS_CXX (or CXX) to its path")


#: Where a CUDA toolkit is looked for when nothing names one (the NVIDIA installers' default).
DEFAULT_CUDA_HOMES = ("/usr/local/cuda",)


def find_cuda_tool(name: str) -> str | None:
    """Absolute path of a CUDA toolkit program (``nvcc``, ``ptxas``), or None: the one lookup
    order for every toolkit program.

    1. ``nvcc`` only: ``$KERNEL_LENS_NVCC`` (an error when it names no executable);
    2. ``$CUDA_HOME/bin``, ``$CUDA_PATH/bin``;
    3. PATH (its absolute entries only);
    4. beside ``$KERNEL_LENS_NVCC`` and beside ``nvcc`` on PATH, both as named and at the real
       location a link points to (``/usr/bin/nvcc -> /opt/cuda/bin/nvcc``);
    5. :data:`DEFAULT_CUDA_HOMES`."""
    if name == "nvcc":
        found = _from_env("KERNEL_LENS_NVCC", "nvcc")
        if found:
            return found
    folders = [Path(os.environ[v]).expanduser() / "bin" for v in ("CUDA_HOME", "CUDA_PATH")
               if os.environ.get(v)]
    candidates = [str(folder / name) for folder in folders] + [name]
    for nvcc in (os.environ.get("KERNEL_LENS_NVCC"), which("nvcc")):
        if nvcc:
            nvcc = os.path.expanduser(nvcc)
            candidates += [os.path.join(os.path.dirname(p), name) for p in (nvcc, os.path.realpath(nvcc))]
    candidates += [os.path.join(home, "bin", name) for home in DEFAULT_CUDA_HOMES]
    for candidate in candidates:
        found = which(candidate)
        if found:
            return os.path.abspath(found)
    return None


def find_nvcc() -> str | None:
    """Absolute path of nvcc (:func:`find_cuda_tool`'s order), or None if there is none."""
    return find_cuda_tool("nvcc")


def toolchain_id(cxx: str) -> str:
    """One line identifying the compiler, for cache keys: the first line of ``cxx --version``
    (e.g. 'g++ (Debian 12.2.0-14) 12.2.0'), the resolved path of the binary and the sha256 of
    its bytes. Computed once per process while the binary's (device, inode, size, mtime, ctime)
    stay the same; a compiler replaced in place is noticed."""
    real = os.path.realpath(cxx)
    try:
        st = os.stat(real)
    except OSError as exc:
        raise ToolchainError(f"cannot read the C++ compiler {cxx}: {exc.strerror}; set KERNEL_LENS_CXX "
                             "to a working C++ compiler") from None
    return _toolchain_id(cxx, real, (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))


@functools.lru_cache(maxsize=None)
def _toolchain_id(cxx: str, real: str, signature: tuple[int, ...]) -> str:
    del signature  # only part of the cache key
    try:
        proc = run_group([cxx, "--version"], timeout=60)  # ends with kernel_lens
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run '{cxx} --version': {exc}; set KERNEL_LENS_CXX to a "
                             "working C++ compiler") from None
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise ToolchainError(f"'{cxx} --version' failed (exit {proc.returncode}): "
                             f"{proc.stderr.strip()[:500]}; set KERNEL_LENS_CXX to a working C++ compiler")
    h = hashlib.sha256()
    try:
        with open(real, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    except OSError as exc:
        raise ToolchainError(f"cannot read the C++ compiler {real}: {exc.strerror}; set "
                             "KERNEL_LENS_CXX to a working C++ compiler") from None
    return f"{lines[0].strip()} | {real} | sha256:{h.hexdigest()}"
