"""``kernel_lens doctor``: one screen describing the environment, to paste into a bug report.

It reports kernel_lens, Python, PyTorch, Triton, ONNX Runtime (and whether its CUDA execution
provider really loads), TensorRT, the CUDA driver and GPUs, nvcc/ptxas, the host C++ compiler,
where the third-party headers were found (or the exact fix), the build cache, and finally, per
target, whether it can be built here. Every probe is guarded: a missing or broken component is
reported with its error text, never raised. Heavy imports happen only where a probe needs them
(torch for its CUDA build and GPUs; the ONNX Runtime CUDA check runs in a child process, so a
crashing provider cannot take the report down).

Every child process (the ONNX Runtime check, ``--version`` of nvcc, ptxas and the C++ compiler)
starts through :func:`_run_isolated`: in a fresh empty temporary folder, and Python with ``-I``
(no current folder, no ``PYTHON*`` variables, no user site-packages on ``sys.path``), so a file
planted where the doctor is run (an ``onnx.py``, a ``./ptxas`` reached through a relative PATH
entry) is never imported or executed.

:func:`report` returns the text and the exit status: 0 when the ``ort`` target can be built (a C++
compiler and the ONNX Runtime headers are found), 1 otherwise.
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import importlib.util
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from .toolchain import headers as toolchain_headers
from .toolchain.cache import build_cache_dir
from .toolchain.compilers import find_cxx, find_nvcc
from .toolchain.ptx_isa import find_ptxas
from .version import __version__

#: Section headings, in order; each is printed as ``<name>:`` on a line of its own.
SECTIONS = ("kernel_lens", "python", "torch", "triton", "onnxruntime", "tensorrt", "cuda driver",
            "gpus", "cuda toolkit", "c++ compiler", "headers", "build cache", "environment",
            "targets")

ENV_VARS = ("ORT_INCLUDE_DIR", "TENSORRT_INCLUDE_DIR", "CUDA_INCLUDE_DIR", "KERNEL_LENS_HEADERS",
            "KERNEL_LENS_CACHE", "KERNEL_LENS_CXX", "CXX", "KERNEL_LENS_NVCC",
            "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
_TIMEOUT_S = 60

Lines = list[tuple[str, str]]  # (label, value)


def _error(exc: BaseException) -> str:
    text = str(exc).strip() or "(no message)"
    return f"{type(exc).__name__}: {text}"


def _guard(probe: Callable[[], Lines]) -> Lines:
    try:
        return probe()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a probe must never take the report down
        return [("error", _error(exc))]


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _run_isolated(cmd: list[str]) -> subprocess.CompletedProcess:
    """Run a probe in a fresh empty folder, so a relative name cannot reach the caller's files
    (a Python child is started with ``-I`` by its caller: see the module docstring)."""
    with tempfile.TemporaryDirectory(prefix="kernel_lens-doctor-") as neutral:
        return subprocess.run(cmd, cwd=neutral, capture_output=True, text=True, timeout=_TIMEOUT_S)


def _tool_version(exe: str, pick: Callable[[list[str]], str] | None = None) -> str:
    """A one-line version of ``exe --version`` (the line with 'release' for NVIDIA tools)."""
    try:
        proc = _run_isolated([exe, "--version"])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run '{exe} --version': {_error(exc)}"
    lines = [l.strip() for l in (proc.stdout or proc.stderr).splitlines() if l.strip()]
    if proc.returncode != 0 or not lines:
        return f"'{exe} --version' failed (exit {proc.returncode}): {proc.stderr.strip()[:300]}"
    return pick(lines) if pick else lines[0]


def _release_line(lines: list[str]) -> str:
    return next((l for l in lines if "release" in l), lines[-1])


# --- probes ---

def _kernel_lens() -> Lines:
    return [("version", __version__), ("location", str(Path(__file__).resolve().parent))]


def _python() -> Lines:
    return [("version", f"{platform.python_implementation()} {platform.python_version()}"),
            ("executable", sys.executable),
            ("platform", f"{platform.platform()} ({platform.machine()})")]


class _State:
    """What later sections (targets, GPUs) reuse from earlier probes."""

    def __init__(self) -> None:
        self.torch = None
        self.cxx: str | None = None
        self.cxx_error = ""
        self.ort_include: Path | None = None
        self.ort_error = ""
        self.trt_include: Path | None = None
        self.trt_version: str | None = None
        self.trt_error = ""
        self.cuda_include: Path | None = None
        self.cuda_error = ""
        self.libcuda: ctypes.CDLL | None = None


def _torch(st: _State) -> Lines:
    if not _installed("torch"):
        return [("torch", "not installed")]
    import torch  # lazy: torch takes seconds, and only when installed

    st.torch = torch
    cuda = torch.version.cuda
    out = [("version", torch.__version__),
           ("CUDA build", cuda if cuda else "none (CPU-only build)")]
    if getattr(torch.version, "hip", None):
        out.append(("ROCm build", torch.version.hip))
    if cuda:
        out.append(("CUDA available", str(torch.cuda.is_available())))
    return out


def _triton() -> Lines:
    version = _dist_version("triton")
    return [("version", version if version else "not installed")]


_ORT_CUDA_CHECK = r"""
import onnx, onnxruntime as ort
from onnx import TensorProto, helper
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "kl_doctor", [x], [y])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
m.ir_version = 8
s = ort.InferenceSession(m.SerializeToString(), providers=["CUDAExecutionProvider"])
print("PROVIDERS=" + ",".join(s.get_providers()))
"""


def _ort_cuda_ep() -> str:
    """Create a one-node session on the CUDA EP in a child process; say whether the EP loaded."""
    try:
        proc = _run_isolated([sys.executable, "-I", "-c", _ORT_CUDA_CHECK])
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"check failed: {_error(exc)}"
    providers = next((l[len("PROVIDERS="):].split(",") for l in proc.stdout.splitlines()
                      if l.startswith("PROVIDERS=")), None)
    lines = [l.strip() for l in proc.stderr.splitlines() if l.strip()]
    # ORT logs the root cause as "[E:onnxruntime:...] ... cannot open shared object file", then
    # "[W:onnxruntime:...] Failed to create CUDAExecutionProvider ..."; a Python error ends the output.
    errors = [l for l in lines if "[E:" in l] or [
        l for l in lines if "rror" in l or "cannot open" in l or "fail" in l.lower()
        or "not in available provider" in l]
    picked = [errors[0], errors[-1]] if len(errors) > 1 else errors or lines[-1:]
    why = " | ".join(picked)[:500] or "(no message)"
    if proc.returncode != 0 or providers is None:
        return f"does NOT load (session creation failed, exit {proc.returncode}): {why}"
    if "CUDAExecutionProvider" not in providers:
        return f"does NOT load (fell back to {', '.join(providers)}): {why}"
    return "loads (a test session ran on CUDAExecutionProvider)"


def _onnxruntime() -> Lines:
    if not _installed("onnxruntime"):
        return [("onnxruntime", "not installed")]
    import onnxruntime as ort  # lazy: optional (the [ort] extra), only when installed

    dists = [d for d in ("onnxruntime-gpu", "onnxruntime") if _dist_version(d)]
    providers = ort.get_available_providers()
    out = [("version", f"{ort.__version__} ({', '.join(dists) or 'distribution unknown'})"),
           ("providers", ", ".join(providers) or "(none)")]
    if "CUDAExecutionProvider" in providers:
        out.append(("CUDA EP", _ort_cuda_ep()))
    else:
        out.append(("CUDA EP", "not in this build's providers (install onnxruntime-gpu to run "
                               "compiled models on the GPU)"))
    return out


def _tensorrt() -> Lines:
    out: Lines = []
    for module in ("tensorrt", "tensorrt_rtx"):
        if not _installed(module):
            out.append((module, "not installed"))
            continue
        try:
            mod = __import__(module)
            out.append((module, str(getattr(mod, "__version__", "imported, version unknown"))))
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001
            out.append((module, f"installed but import fails: {_error(exc)}"))
    return out


def _cuda_driver(st: _State) -> Lines:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        return [("libcuda.so.1", f"not found ({exc})")]
    st.libcuda = lib
    version = ctypes.c_int(0)
    rc = lib.cuDriverGetVersion(ctypes.byref(version))
    if rc != 0:
        return [("libcuda.so.1", "loaded"), ("version", f"cuDriverGetVersion failed (CUresult {rc})")]
    v = version.value
    path = "loaded"
    try:
        maps = Path("/proc/self/maps").read_text()
        path = next((l.split()[-1] for l in maps.splitlines() if "libcuda.so" in l), "loaded")
    except OSError:
        pass
    return [("libcuda.so.1", path), ("version", f"{v // 1000}.{(v % 1000) // 10} (CUDA driver API {v})")]


def _gpus(st: _State) -> Lines:
    torch = st.torch
    if torch is not None and torch.version.cuda and torch.cuda.is_available():
        out = []
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            out.append((f"cuda:{i}", f"{p.name}, sm_{p.major}{p.minor}, "
                                     f"{p.total_memory / 2**30:.1f} GiB (torch.cuda)"))
        return out or [("gpus", "none (torch.cuda sees 0 devices)")]
    if st.libcuda is None:
        return [("gpus", "none found (no CUDA driver)")]
    lib = st.libcuda  # torch cannot tell (CPU build or no CUDA): ask the driver
    rc = lib.cuInit(0)
    if rc != 0:
        return [("gpus", f"cuInit failed (CUresult {rc}); no usable GPU")]
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return [("gpus", "none (the driver reports 0 devices)")]
    out = []
    for i in range(count.value):
        dev, name = ctypes.c_int(0), ctypes.create_string_buffer(256)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.cuDeviceGet(ctypes.byref(dev), i)
        lib.cuDeviceGetName(name, 256, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # COMPUTE_CAPABILITY_MAJOR
        lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # COMPUTE_CAPABILITY_MINOR
        out.append((f"cuda:{i}", f"{name.value.decode(errors='replace')}, "
                                 f"sm_{major.value}{minor.value} (CUDA driver)"))
    return out


def _cuda_toolkit() -> Lines:
    out: Lines = []
    try:
        nvcc = find_nvcc()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        out.append(("nvcc", f"error: {_error(exc)}"))
    else:
        out.append(("nvcc", f"{nvcc}: {_tool_version(nvcc, _release_line)}" if nvcc
                    else "not found (optional)"))
    ptxas = find_ptxas()
    out.append(("ptxas", f"{ptxas}: {_tool_version(ptxas, _release_line)}" if ptxas
                else "not found (needed only for --ptx-version / --cuda-version)"))
    return out


def _cxx(st: _State) -> Lines:
    try:
        st.cxx = find_cxx()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        st.cxx_error = str(exc)
        return [("c++", f"not found: {exc}")]
    return [("c++", st.cxx), ("version", _tool_version(st.cxx))]


def _headers(st: _State) -> Lines:
    h = toolchain_headers

    out: Lines = [("cache", f"{h.headers_cache_dir()} (filled by `{h.FETCH_HINT}`)")]
    try:
        st.ort_include = h.find_ort_include()
        out.append(("onnxruntime", f"{st.ort_include} (ORT_API_VERSION "
                                   f"{_guarded_value(lambda: h.ort_api_version(st.ort_include))})"))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        st.ort_error = str(exc)
        out.append(("onnxruntime", f"NOT FOUND: {exc}"))
    try:
        st.trt_include = h.find_tensorrt_include()
        try:
            st.trt_version = h.tensorrt_version(st.trt_include)
        except Exception as exc:  # noqa: BLE001
            st.trt_version = None
            out.append(("tensorrt", f"{st.trt_include} (version unreadable: {exc})"))
        else:
            out.append(("tensorrt", f"{st.trt_include} (TensorRT {st.trt_version})"))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        st.trt_error = str(exc)
        out.append(("tensorrt", f"NOT FOUND: {exc}"))
    try:
        st.cuda_include = h.find_cuda_include()
        v = _guarded_value(lambda: h.cuda_runtime_version(st.cuda_include))
        out.append(("cuda runtime", f"{st.cuda_include} (CUDART_VERSION {v})"))
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        st.cuda_error = str(exc)
        out.append(("cuda runtime", f"NOT FOUND (needed by TensorRT plugins): {exc}"))
    return out


def _guarded_value(fn: Callable[[], object]) -> str:
    try:
        return str(fn())
    except Exception as exc:  # noqa: BLE001
        return f"unreadable: {exc}"


def _size(nbytes: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""  # unreachable


def _build_cache() -> Lines:
    root = build_cache_dir()
    if not root.exists():
        return [("folder", f"{root} (not created yet)")]
    if not root.is_dir():
        return [("folder", f"{root} (NOT a folder: set KERNEL_LENS_CACHE to a folder of your own)")]
    total, files = 0, 0
    for folder, _dirs, names in os.walk(root):  # links are not followed
        for name in names:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
                files += 1
            except OSError:
                pass
    try:
        entries = sum(1 for e in os.scandir(root) if e.is_dir(follow_symlinks=False))
    except OSError:
        entries = 0
    return [("folder", str(root)), ("size", f"{_size(total)} in {files} files, {entries} libraries")]


def _environment() -> Lines:
    found = [(v, os.environ[v]) for v in ENV_VARS if os.environ.get(v)]
    return found or [("variables", "none set of " + ", ".join(ENV_VARS))]


def _first_clause(text: str) -> str:
    return text.split("; ")[0].rstrip(".")


def _available_targets() -> dict[str, str]:
    try:
        from .targets.base import available_targets  # lazy: the IR (pydantic, sympy); a failure falls back

        return available_targets()
    except Exception:  # noqa: BLE001 - fall back to the entry points alone
        group = "kernel_lens.targets"
        return {ep.name: ep.value for ep in importlib.metadata.entry_points(group=group)}


def _targets(st: _State) -> tuple[Lines, int]:
    """Each installed target, and whether it can be built here: every requirement it reports
    (:meth:`kernel_lens.targets.base.Target.requirements`) probed, the missing ones named."""
    try:
        available = _available_targets()
        listed_error = ""
    except Exception as exc:  # noqa: BLE001
        available, listed_error = {}, _error(exc)
    out: Lines = []
    status = 0
    if "ort" not in available:
        out.append(("ort", "cannot build: target not installed (entry point kernel_lens.targets: "
                           "ort)" + (f"; listing targets failed: {listed_error}" if listed_error else "")))
        status = 1
    for name in available:
        try:
            from .targets.base import get_target  # lazy: the IR (pydantic, sympy)

            needs = get_target(name).requirements()
        except Exception as exc:  # noqa: BLE001 - a broken third-party target is reported, not fatal
            out.append((name, f"cannot tell: {_error(exc)}"))
            continue
        missing = []
        for what, probe in needs:
            try:
                probe()
            except Exception as exc:  # noqa: BLE001
                missing.append(f"no {what} ({_first_clause(str(exc))})")
        out.append((name, "cannot build: " + "; ".join(missing) if missing else "can build"))
        if name == "ort" and missing:
            status = 1
    return out, status


def _format(title: str, lines: Lines) -> list[str]:
    width = max((len(label) for label, _ in lines), default=0)
    return [f"{title}:"] + [f"  {label.ljust(width)}  {value}" for label, value in lines]


def report() -> tuple[str, int]:
    """The doctor's report and exit status (0 when the ``ort`` target can be built here)."""
    st = _State()
    probes: list[tuple[str, Callable[[], Lines]]] = [
        ("kernel_lens", _kernel_lens),
        ("python", _python),
        ("torch", lambda: _torch(st)),
        ("triton", _triton),
        ("onnxruntime", _onnxruntime),
        ("tensorrt", _tensorrt),
        ("cuda driver", lambda: _cuda_driver(st)),
        ("gpus", lambda: _gpus(st)),
        ("cuda toolkit", _cuda_toolkit),
        ("c++ compiler", lambda: _cxx(st)),
        ("headers", lambda: _headers(st)),
        ("build cache", _build_cache),
        ("environment", _environment),
    ]
    assert [t for t, _ in probes] == list(SECTIONS[:-1])
    text: list[str] = []
    for title, probe in probes:
        text += _format(title, _guard(probe))
    try:
        lines, status = _targets(st)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001
        lines, status = [("error", _error(exc))], 1
    text += _format("targets", lines)
    return "\n".join(text), status
