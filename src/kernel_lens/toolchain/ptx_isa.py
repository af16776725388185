"""Lower a PTX module's ``.version`` so that an older CUDA driver can JIT it.

Triton stamps its PTX with the newest ISA version its LLVM knows (8.7 for
Triton 3.6), but a driver only JIT-compiles PTX up to the ISA version it
ships with. Most kernels use nothing that new, so declaring an older version
is harmless -- but only if that is *proven*: we never trust our own feature
analysis and instead assemble the rewritten module with the real ``ptxas``,
which rejects every instruction that needs a newer ``.version`` than declared.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile

from kernel_lens.errors import PtxIsaError
from kernel_lens.toolchain.compilers import find_cuda_tool
from kernel_lens.toolchain.process_group import run_group

Version = tuple[int, int]

# Newest PTX ISA each CUDA release (toolkit, or driver API version) can JIT.
# Source: "Release Notes" table of NVIDIA's PTX ISA documentation.
# CUDA 12.7 was never released (PTX 8.6 first shipped to users with 12.8).
CUDA_TO_MAX_PTX: dict[Version, Version] = {
    (11, 0): (7, 0), (11, 1): (7, 1), (11, 2): (7, 2), (11, 3): (7, 3),
    (11, 4): (7, 4), (11, 5): (7, 5), (11, 6): (7, 6), (11, 7): (7, 7),
    (11, 8): (7, 8),
    (12, 0): (8, 0), (12, 1): (8, 1), (12, 2): (8, 2), (12, 3): (8, 3),
    (12, 4): (8, 4), (12, 5): (8, 5), (12, 6): (8, 5), (12, 8): (8, 7),
    (12, 9): (8, 8),
    (13, 0): (9, 0),
}

# Oldest PTX ISA that may declare each ``.target``.
# Source: "Target ISA Notes"/"Release Notes" of the PTX ISA documentation;
# the sm_75+ rows were checked against ptxas 13.0.
TARGET_MIN_PTX: dict[str, Version] = {
    "sm_50": (4, 0), "sm_52": (4, 1), "sm_53": (4, 2),
    "sm_60": (5, 0), "sm_61": (5, 0), "sm_62": (5, 0),
    "sm_70": (6, 0), "sm_72": (6, 1), "sm_75": (6, 3),
    "sm_80": (7, 0), "sm_86": (7, 1), "sm_87": (7, 4), "sm_89": (7, 8),
    "sm_90": (7, 8), "sm_90a": (8, 0),
    "sm_100": (8, 6), "sm_100a": (8, 6), "sm_100f": (8, 8),
    "sm_101": (8, 6), "sm_101a": (8, 6), "sm_101f": (8, 8),
    "sm_103": (8, 8), "sm_103a": (8, 8), "sm_103f": (8, 8),
    "sm_110": (9, 0), "sm_110a": (9, 0), "sm_110f": (9, 0),
    "sm_120": (8, 7), "sm_120a": (8, 7), "sm_120f": (8, 8),
    "sm_121": (8, 8), "sm_121a": (8, 8), "sm_121f": (8, 8),
}

PTXAS_TIMEOUT_S = 300

_VERSION_RE = re.compile(r"^([ \t]*\.version[ \t]+)(\d+)\.(\d+)(?=[ \t]*(?://.*)?$)", re.MULTILINE)
_TARGET_RE = re.compile(r"^[ \t]*\.target[ \t]+([A-Za-z0-9_]+)", re.MULTILINE)
_PTXAS_LINE_RE = re.compile(r", line (\d+);")
_PTXAS_NEEDS_RE = re.compile(r"requires PTX ISA \.version (\d+\.\d+)")


def _fmt(v: Version) -> str:
    return f"{v[0]}.{v[1]}"


def parse_ptx_version(ptx: str) -> Version:
    """The module's ``.version X.Y`` directive as ``(X, Y)``."""
    m = _VERSION_RE.search(ptx)
    if m is None:
        raise PtxIsaError("PTX module has no `.version X.Y` directive; is this really PTX text?")
    return int(m.group(2)), int(m.group(3))


def parse_ptx_target(ptx: str) -> str:
    """The module's first ``.target`` architecture, e.g. ``"sm_90a"``."""
    m = _TARGET_RE.search(ptx)
    if m is None:
        raise PtxIsaError("PTX module has no `.target sm_XX` directive; is this really PTX text?")
    return m.group(1)


def max_ptx_version_for_cuda(cuda_version: tuple[int, int]) -> Version:
    """Newest PTX ISA a CUDA ``(major, minor)`` driver/toolkit can JIT.

    A release newer than the table is assumed to support at least the newest
    known ISA (CUDA never drops PTX versions), which is a sound lower bound.
    """
    cuda = (int(cuda_version[0]), int(cuda_version[1]))
    if cuda in CUDA_TO_MAX_PTX:
        return CUDA_TO_MAX_PTX[cuda]
    newest = max(CUDA_TO_MAX_PTX)
    if cuda > newest:
        return CUDA_TO_MAX_PTX[newest]
    oldest = min(CUDA_TO_MAX_PTX)
    if cuda < oldest:
        raise PtxIsaError(
            f"CUDA {_fmt(cuda)} is too old: kernel_lens supports CUDA >= {_fmt(oldest)}; "
            "upgrade the NVIDIA driver / CUDA toolkit."
        )
    known = ", ".join(_fmt(c) for c in sorted(CUDA_TO_MAX_PTX))
    raise PtxIsaError(f"unknown CUDA version {_fmt(cuda)}; known releases: {known}.")


def min_ptx_version_for_target(target: str) -> Version:
    """Oldest PTX ISA whose ``.target`` may name ``target``."""
    try:
        return TARGET_MIN_PTX[target]
    except KeyError:
        raise PtxIsaError(
            f"unknown PTX target {target!r}; known targets: {', '.join(TARGET_MIN_PTX)}."
        ) from None


def find_ptxas() -> str | None:
    """``ptxas`` by the toolkit lookup every CUDA program shares
    (:func:`kernel_lens.toolchain.compilers.find_cuda_tool`), or None."""
    return find_cuda_tool("ptxas")


def clamp_ptx_version(ptx: str, max_version: Version, *, ptxas: str | None = "auto") -> str:
    """Return ``ptx`` with ``.version`` lowered to at most ``max_version``.

    Only the ``.version`` line changes. Soundness is proven by assembling the
    result with ``ptxas`` (``"auto"``: find it; a path: use that binary;
    ``None``: skip the proof -- only for callers that accept unproven PTX).
    """
    version = parse_ptx_version(ptx)
    max_version = (int(max_version[0]), int(max_version[1]))
    if version <= max_version:
        return ptx
    target = parse_ptx_target(ptx)
    need = min_ptx_version_for_target(target)
    if need > max_version:
        raise PtxIsaError(
            f".target {target} needs PTX ISA >= {_fmt(need)}, but at most {_fmt(max_version)} "
            f"was requested (module declares {_fmt(version)}); no PTX for {target} can run there. "
            f"Use a newer NVIDIA driver / CUDA toolkit that supports PTX ISA {_fmt(need)} or later."
        )
    clamped = _VERSION_RE.sub(lambda m: f"{m.group(1)}{_fmt(max_version)}", ptx, count=1)
    if ptxas is not None:
        _prove_with_ptxas(clamped, target, version, max_version, ptxas)
    return clamped


def _prove_with_ptxas(ptx: str, target: str, orig: Version, new: Version, ptxas: str) -> None:
    """Assemble ``ptx`` with ptxas; raise PtxIsaError quoting its complaint if it fails."""
    exe = find_ptxas() if ptxas == "auto" else ptxas
    if exe is None:
        raise PtxIsaError(
            "cannot prove the PTX .version rewrite is sound: `ptxas` not found. Put the CUDA "
            "toolkit's bin directory on PATH or set CUDA_HOME to the toolkit root."
        )
    with tempfile.TemporaryDirectory(prefix="kernel_lens_ptx_") as tmp:
        with open(os.path.join(tmp, "module.ptx"), "w", encoding="utf-8") as f:
            f.write(ptx)
        cmd = [exe, f"-arch={target}", "module.ptx", "-o", os.devnull]
        try:
            proc = run_group(cmd, cwd=tmp, timeout=PTXAS_TIMEOUT_S)  # ends with kernel_lens
        except OSError as e:
            raise PtxIsaError(f"cannot run ptxas {exe!r}: {e}") from None
        except subprocess.TimeoutExpired:
            raise PtxIsaError(f"ptxas timed out after {PTXAS_TIMEOUT_S}s checking the PTX for {target}.") from None
    if proc.returncode == 0:
        return
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error" in ln), None) or next(
        (ln for ln in lines if "fatal" in ln), lines[0] if lines else f"exit status {proc.returncode}"
    )
    where = "."
    m = _PTXAS_LINE_RE.search(first)
    if m:
        src = ptx.splitlines()
        n = int(m.group(1))
        if 1 <= n <= len(src):
            where = f" (offending PTX line {n}: `{src[n - 1].strip()}`)."
    m = _PTXAS_NEEDS_RE.search(first)
    why = (
        f"The kernel uses a feature newer than PTX ISA {_fmt(new)}; run it on a newer NVIDIA "
        f"driver / CUDA toolkit (one supporting PTX ISA {m.group(1)}), or avoid that feature."
        if m
        else "Check that this ptxas supports the target and PTX version, or use a newer NVIDIA "
        "driver / CUDA toolkit so no lowering is needed."
    )
    raise PtxIsaError(
        f"cannot lower PTX for {target} from .version {_fmt(orig)} to {_fmt(new)}: "
        f"ptxas ({exe}) rejects it: {first}{where} {why}"
    )
