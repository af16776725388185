"""Locate the third-party headers generated plugins compile against (ONNX Runtime, TensorRT, CUDA).

kernel_lens never vendors these headers and never downloads anything at build time. Each
``find_*_include`` looks, in order, at:

1. an environment variable (``ORT_INCLUDE_DIR``, ``TENSORRT_INCLUDE_DIR``, ``CUDA_INCLUDE_DIR``);
   when set, it must name a folder holding the marker header, or it is an error (no silent fallback);
2. well-known install places (system packages, vendor tarballs, conda, pip packages);
3. for ONNX Runtime and TensorRT, the cache that ``kernel_lens fetch-headers`` fills:
   ``$KERNEL_LENS_HEADERS/{onnxruntime,tensorrt}``, default ``~/.cache/kernel_lens/headers``.

Nothing found raises :class:`~kernel_lens.errors.ToolchainError` naming the variable to set and
the command that fetches the headers.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import re
import stat
from pathlib import Path

from kernel_lens.errors import ToolchainError

ORT_MARKER = "onnxruntime_c_api.h"
TRT_MARKER = "NvInfer.h"
CUDA_MARKER = "cuda_runtime_api.h"
FETCH_HINT = "kernel_lens fetch-headers"
# In a source checkout before installing, the same logic runs as this script.
FETCH_SCRIPT_HINT = "python scripts/fetch_headers.py"


def headers_cache_dir() -> Path:
    """Root of the header cache filled by ``kernel_lens fetch-headers``."""
    env = os.environ.get("KERNEL_LENS_HEADERS")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "headers"


def _multiarch() -> str:
    return f"{platform.machine()}-linux-gnu"


def _prefixes_from_env(*names: str) -> list[Path]:
    return [Path(os.environ[n]).expanduser() for n in names if os.environ.get(n)]


def _system_ort_dirs() -> list[Path]:
    dirs: list[Path] = []
    conda = _prefixes_from_env("CONDA_PREFIX")
    for prefix in [Path("/usr"), Path("/usr/local"), *conda]:
        dirs += [prefix / "include" / "onnxruntime",
                 prefix / "include" / "onnxruntime" / "core" / "session"]  # layout before ORT 1.17
    dirs += [Path("/opt/onnxruntime/include"), Path("/opt/onnxruntime/include/onnxruntime")]
    dirs += [p / "include" for p in conda] + [Path("/usr/local/include"), Path("/usr/include")]
    return dirs


def _system_tensorrt_dirs() -> list[Path]:
    dirs = [Path("/usr/include") / _multiarch(), Path("/usr/local/TensorRT/include"),
            Path("/usr/local/tensorrt/include"), Path("/opt/tensorrt/include"),
            Path("/opt/TensorRT/include")]
    dirs += [p / "include" for p in _prefixes_from_env("TENSORRT_ROOT", "TRT_ROOT", "CONDA_PREFIX")]
    dirs += [Path("/usr/local/include"), Path("/usr/include")]
    return dirs


def _package_dirs(name: str) -> list[Path]:
    """Folders of an installed (possibly namespace) package, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _system_cuda_dirs() -> list[Path]:
    dirs = [p / "include" for p in _prefixes_from_env("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT")]
    dirs += [Path("/usr/local/cuda/include")]
    for conda in _prefixes_from_env("CONDA_PREFIX"):
        dirs += [conda / "include", conda / "targets" / f"{platform.machine()}-linux" / "include"]
    dirs += [Path("/usr/include")]
    for nvidia in _package_dirs("nvidia"):  # pip: nvidia-cuda-runtime-cu12 / -cu13
        dirs += [nvidia / "cuda_runtime" / "include", nvidia / "cu13" / "include"]
    for triton in _package_dirs("triton"):  # a kernel_lens dependency; ships the CUDA runtime headers
        dirs += [triton / "backends" / "nvidia" / "include"]
    return dirs


def _find(var: str, marker: str, what: str, candidates: list[Path], fetch: bool) -> Path:
    env = os.environ.get(var)
    if env:
        path = Path(env).expanduser()
        if (path / marker).is_file():
            return path.resolve()
        raise ToolchainError(
            f"{var}={env} points to a folder without {marker}; set {var} to the folder that "
            f"contains {marker}, or unset it to search the usual places"
            + (f" and the cache filled by `{FETCH_HINT}`" if fetch else "") + ".")
    for path in candidates:
        if (path / marker).is_file():
            return path.resolve()
    looked = ", ".join(str(p) for p in candidates)
    how = (f"Run `{FETCH_HINT}` (in a source checkout: `{FETCH_SCRIPT_HINT}`) to fetch them into "
           f"{headers_cache_dir()}, or set {var} to the folder that contains {marker}."
           if fetch else f"Install them, or set {var} to the folder that contains {marker}.")
    raise ToolchainError(f"{what} headers ({marker}) not found; looked in: {looked}. {how}")


def find_ort_include() -> Path:
    """Folder holding onnxruntime_c_api.h / onnxruntime_cxx_api.h."""
    return _find("ORT_INCLUDE_DIR", ORT_MARKER, "ONNX Runtime",
                 _system_ort_dirs() + [headers_cache_dir() / "onnxruntime"], fetch=True)


def find_tensorrt_include() -> Path:
    """Folder holding NvInfer.h (and NvInferRuntime.h, NvInferVersion.h)."""
    return _find("TENSORRT_INCLUDE_DIR", TRT_MARKER, "TensorRT",
                 _system_tensorrt_dirs() + [headers_cache_dir() / "tensorrt"], fetch=True)


def find_cuda_include() -> Path:
    """Folder holding cuda_runtime_api.h, which NvInferRuntimeBase.h includes.

    Only headers are needed (plugins dlopen the driver); besides a CUDA toolkit, the pip CUDA
    runtime package and Triton's bundled copy (a kernel_lens dependency) qualify.
    """
    return _find("CUDA_INCLUDE_DIR", CUDA_MARKER, "CUDA runtime", _system_cuda_dirs(), fetch=False)


# --- versions ---

_DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)[ \t]+([^\n]*)$", re.MULTILINE)


def _defines(path: Path) -> dict[str, str]:
    """Object-like macros of a header (comments stripped); values unexpanded."""
    text = path.read_text(encoding="utf-8", errors="replace")
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.DOTALL)
    text = re.sub(r"//[^\n]*", "", text)
    return {m.group(1): m.group(2).strip() for m in _DEFINE.finditer(text)}


def _resolve_int(defs: dict[str, str], name: str) -> int | None:
    """Value of an integer macro, following macro-to-macro aliases (NV_TENSORRT_MAJOR -> TRT_MAJOR_...)."""
    value, seen = defs.get(name), set()
    while value is not None:
        value = value.strip("() \t")
        if re.fullmatch(r"\d+[uUlL]*", value):
            return int(value.rstrip("uUlL"))
        if value in seen or value not in defs:
            return None
        seen.add(value)
        value = defs[value]
    return None


def ort_api_version(include: Path) -> int:
    """``ORT_API_VERSION`` of the ONNX Runtime headers in ``include``."""
    header = Path(include) / ORT_MARKER
    if not header.is_file():
        raise ToolchainError(f"{include} has no {ORT_MARKER}; cannot read ORT_API_VERSION")
    version = _resolve_int(_defines(header), "ORT_API_VERSION")
    if version is None:
        raise ToolchainError(f"{header} defines no integer ORT_API_VERSION")
    return version


def tensorrt_version(include: Path) -> str:
    """``"MAJOR.MINOR.PATCH"`` of the TensorRT headers in ``include``, from NvInferVersion.h.

    TensorRT <= 10.10 defines ``NV_TENSORRT_MAJOR 10`` directly; later releases define
    ``TRT_MAJOR_ENTERPRISE`` (or ``TRT_MAJOR_RTX``) and alias ``NV_TENSORRT_MAJOR`` to it.
    """
    header = Path(include) / "NvInferVersion.h"
    if not header.is_file():
        raise ToolchainError(f"{include} has no NvInferVersion.h; cannot read the TensorRT version")
    defs = _defines(header)
    parts = []
    for part in ("MAJOR", "MINOR", "PATCH"):
        value = _resolve_int(defs, f"NV_TENSORRT_{part}")
        for alt in (f"TRT_{part}_ENTERPRISE", f"TRT_{part}_RTX"):
            if value is None:
                value = _resolve_int(defs, alt)
        if value is None:
            raise ToolchainError(f"{header} defines neither NV_TENSORRT_{part} nor TRT_{part}_ENTERPRISE")
        parts.append(str(value))
    return ".".join(parts)


def cuda_runtime_version(include: Path) -> int | None:
    """``CUDART_VERSION`` (e.g. 12080) of the CUDA headers in ``include``, if readable."""
    header = Path(include) / CUDA_MARKER
    return _resolve_int(_defines(header), "CUDART_VERSION") if header.is_file() else None


@functools.lru_cache(maxsize=1 << 16)
def _file_digest(path: str, signature: tuple[int, ...]) -> str:
    """sha256 of a file's bytes; ``signature`` (device, inode, size, mtime, ctime) keys the cache,
    so a file is read once per process until it changes."""
    del signature  # only part of the cache key
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _header_files(include: Path) -> list[tuple[str, str]]:
    """(name relative to ``include``, sha256 of the bytes) for every file below ``include``.

    Links are followed, as the compiler follows them (a folder reached twice, e.g. through a link
    cycle, is walked once); a file that cannot be read is recorded as such.
    """
    out: list[tuple[str, str]] = []
    seen: set[tuple[int, int]] = set()

    def walk(folder: Path, rel: str) -> None:
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            out.append((rel or ".", "<unreadable folder>"))
            return
        for entry in entries:
            name = f"{rel}/{entry.name}" if rel else entry.name
            try:
                st = entry.stat()  # follows links
            except OSError:
                out.append((name, "<dangling link>"))
                continue
            if stat.S_ISDIR(st.st_mode):
                walk(Path(entry.path), name)
            elif stat.S_ISREG(st.st_mode):
                sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
                try:
                    out.append((name, _file_digest(entry.path, sig)))
                except OSError:
                    out.append((name, "<unreadable>"))

    walk(Path(include), "")
    return sorted(out)


def header_fingerprint(include: Path) -> str:
    """Content fingerprint of an include folder, for build cache keys.

    The sha256 of every file below ``include`` (recursively, links followed), each with its name
    relative to ``include``, sorted. Editing any header (even keeping its size) changes it; the
    folder's own path does not: the same headers fetched elsewhere give the same fingerprint.
    Each file is read once per process while its (device, inode, size, mtime, ctime) stay the same.
    """
    files = _header_files(Path(include))
    return hashlib.sha256(repr(("kernel_lens.headers/2", files)).encode()).hexdigest()


def include_folder_problem(include: Path) -> str | None:
    """Why headers from ``include`` must not be compiled in, or None: the folder and everything
    below it (links followed, as the compiler follows them) must belong to the current user or
    to root and be writable by no one else, the rule ``fetch-headers`` applies to what it
    fetches: someone else able to edit a header could put code into every library built."""
    me = os.geteuid()
    seen: set[tuple[int, int]] = set()
    todo = [Path(include)]
    while todo:
        path = todo.pop()
        try:
            st = path.stat()
        except OSError:
            continue  # unreadable: the compiler fails on it, and the key records it
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        if st.st_uid not in (me, 0):
            return f"{path} is owned by uid {st.st_uid}, neither you (uid {me}) nor root"
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"
        if stat.S_ISDIR(st.st_mode):
            try:
                todo.extend(Path(e.path) for e in os.scandir(path))
            except OSError:
                continue
    return None
