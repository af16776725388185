"""Bounds-checked memory accesses while Triton's interpreter runs a launch on the CPU host.

Triton's interpreter turns a kernel's pointer tensors into raw host addresses and reads/writes
them from C++ (``_interpreter.load/store/atomic_*``) with no check at all. A kernel whose mask is
missing or dropped (Python ``and``/``or`` on two tensors keeps only one of them: a block tensor is
always truthy in the interpreter) then reads or writes outside its tensors: at best it silently
corrupts the heap, at worst the whole compile dies with SIGSEGV/SIGABRT and no message.

:func:`checked_memory` installs, for the duration of one interpreted launch, a check in front of
every entry point of :class:`triton.runtime.interpreter.InterpreterBuilder` that touches memory:

* ``create_masked_load`` / ``create_masked_store``, which also serve ``create_load`` /
  ``create_store`` (unmasked: every lane active), block pointers
  (``create_tensor_pointer_load/store``: the lanes ``boundary_check`` keeps), tensor descriptors
  (``create_descriptor_load/store`` and ``create_descriptor_gather/scatter``: the lanes inside
  the descriptor's shape), as all of them go through these two methods;
* ``create_atomic_rmw`` (masked: all ``tl.atomic_add/max/min/and/or/xor/xchg``) and
  ``create_atomic_cas`` (no mask: every lane).

In Triton 3.6 these four are the only callers of the C++ accessors, so every global-memory access
an interpreted kernel makes is checked. An active lane (mask true) whose element
``[address, address + itemsize)`` is not inside the storage of one of the launch's tensor
arguments (``untyped_storage()``: a view may read its base tensor's storage beyond the view, as on
a GPU) raises :class:`OutOfBoundsAccess`, a :class:`~kernel_lens.errors.CaptureError`, before the
access happens; masked-off lanes are never checked (nor accessed by the interpreter). Its one-line
message names the operation, the program id, how many active lanes are out of bounds, and the
first one's element/byte offset relative to the parameter whose storage the block's in-bounds
lanes access (else the nearest one; else "no tensor argument"); capture prefixes the kernel.
The check is vectorized numpy: a min/max over the active lanes decides the usual in-bounds case,
the per-lane search only runs when those two are not inside one storage.

Not covered: memory a kernel reaches through a pointer that is not a tensor argument (e.g. a
pointer array built from ``data_ptr()`` values and cast with ``tl.pointer_type``) is reported as
out of bounds unless its range is passed to :func:`checked_memory`; crashes of native code other
than these memory accesses are not caught; an overrun that lands inside another argument's
storage is not reported (addresses alone cannot tell it from a deliberate access).
"""

from __future__ import annotations

import bisect
import contextlib
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import torch
import triton
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpreterBuilder

from ...errors import CaptureError
from .patching import patched as _patched

_U64_MAX = np.iinfo(np.uint64).max

_FAR = 1 << 20  # bytes: an access this far from every argument is no off-by-a-block mistake
HINT = ("a mask is missing or dropped (Python `and`/`or` on tensors keep only one operand: "
        "use `&`/`|`)")


class OutOfBoundsAccess(CaptureError):
    """An active lane of an interpreted load/store/atomic is outside every tensor argument."""


@dataclass(frozen=True)
class MemoryRange:
    """``nbytes`` valid bytes from host address ``start``, belonging to parameter ``name``."""

    name: str
    start: int
    nbytes: int

    @property
    def end(self) -> int:
        return self.start + self.nbytes


def tensor_ranges(params: Mapping[str, Any]) -> list[MemoryRange]:
    """The storage byte range of every tensor among a launch's bound parameters (tensors in
    tuples/lists and the ``base`` of tensor descriptors included)."""
    ranges: list[MemoryRange] = []

    def visit(name: str, value: Any) -> None:
        if isinstance(value, torch.Tensor):
            storage = value.untyped_storage()
            ranges.append(MemoryRange(name, int(storage.data_ptr()), int(storage.nbytes())))
        elif isinstance(value, (tuple, list)):
            for i, item in enumerate(value):
                visit(f"{name}[{i}]", item)
        elif isinstance(getattr(value, "base", None), torch.Tensor):  # TensorDescriptor
            visit(name, value.base)

    for name, value in params.items():
        visit(name, value)
    return ranges


class _Checker:
    """The valid ranges of one launch, merged into disjoint sorted intervals for the search."""

    def __init__(self, ranges: Iterable[MemoryRange]):
        self.ranges = [r for r in ranges if r.nbytes > 0]
        merged: list[list[int]] = []
        for r in sorted(self.ranges, key=lambda r: r.start):
            if merged and r.start <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], r.end)
            else:
                merged.append([r.start, r.end])
        self.starts = [s for s, _ in merged]
        self.ends = [e for _, e in merged]
        self.starts_np = np.array(self.starts, dtype=np.uint64)

    def check(self, op: str, ptrs: Any, mask: Any) -> None:
        addr = np.asarray(ptrs.data)
        if addr.dtype != np.uint64:
            addr = addr.astype(np.uint64)
        active = None
        if mask is not None:
            # a TensorHandle, or the bare ndarray block pointers and descriptors pass
            active = np.asarray(mask if isinstance(mask, np.ndarray) else mask.data)
            active = active.astype(bool, copy=False)
            if active.shape != addr.shape:
                addr, active = np.broadcast_arrays(addr, active)
            if active.all():
                active = None
        if addr.size == 0:
            return
        if active is None:
            lo, hi = int(addr.min()), int(addr.max())
        else:
            lo = int(np.min(addr, initial=_U64_MAX, where=active))
            hi = int(np.max(addr, initial=0, where=active))
            if lo > hi:  # no active lane
                return
        size = _itemsize(ptrs)
        i = bisect.bisect_right(self.starts, lo) - 1
        if i >= 0 and hi + size <= self.ends[i]:  # all active lanes inside one storage
            return
        self._locate(op, addr, active, size, _dtype_name(ptrs))

    def _locate(self, op: str, addr: np.ndarray, active: np.ndarray | None, size: int,
                dtype: str) -> None:
        flat = addr.reshape(-1)
        lanes = np.arange(flat.size) if active is None else np.flatnonzero(active.reshape(-1))
        vals = flat[lanes]
        if self.starts:
            idx = np.searchsorted(self.starts_np, vals, side="right").astype(np.int64) - 1
            # the last byte of each element must lie in the interval (no uint64 wrap-around)
            limits = np.array([max(e - size, 0) for e in self.ends], dtype=np.uint64)
            ok = (idx >= 0) & (vals <= limits[np.maximum(idx, 0)])
        else:
            ok = np.zeros(vals.shape, dtype=bool)
        bad = np.flatnonzero(~ok)
        if bad.size == 0:
            return
        good = np.flatnonzero(ok)
        hit = int(vals[good[0]]) if good.size else None
        raise OutOfBoundsAccess(self._message(op, int(vals[bad[0]]), int(lanes[bad[0]]),
                                              int(bad.size), int(vals.size), size,
                                              dtype, hit))

    def _message(self, op: str, address: int, lane: int, n_bad: int, n_active: int, size: int,
                 dtype: str, hit: int | None) -> str:
        where = _program() + _kernel_line()
        head = (f"out-of-bounds {op}{where}: {n_bad} of {n_active} active lanes are outside "
                f"every tensor argument")
        if not self.ranges:
            return f"{head} (the launch has no tensor argument); {HINT}"

        def offset(r: MemoryRange) -> int:  # signed: a pointer below its tensor wraps around
            off = (address - r.start) % 2**64
            return off - 2**64 if off >= 2**63 else off

        def distance(r: MemoryRange) -> int:
            off = offset(r)
            return -off if off < 0 else max(0, off + size - r.nbytes)

        # The tensor the block's in-bounds lanes access, if any, else the nearest one.
        near = next((r for r in self.ranges if hit is not None and r.start <= hit < r.end), None)
        near = near or min(self.ranges, key=distance)
        off = offset(near)
        at = f"byte offset {off}"
        if off % size == 0:
            at = f"element {off // size} ({at})"
        hint = HINT
        if distance(near) > _FAR:  # nowhere near an argument: an address loaded from memory?
            hint = (f"the address is over {_FAR >> 20} MiB from every tensor argument: if the "
                    f"kernel dereferences addresses it loads from a tensor (a pointer table built "
                    f"with data_ptr()), no compiled model can hold them: pass the tensors "
                    f"themselves; else {HINT}")
        return (f"{head}; the first (lane {lane}) is at {at} of the storage of parameter "
                f"{near.name!r} ({near.nbytes // size} {dtype} elements, {near.nbytes} bytes); "
                f"{hint}")


def _dtype_name(ptrs: Any) -> str:
    try:
        return str(ptrs.get_element_ty())
    except AttributeError:
        return "byte"


def _itemsize(ptrs: Any) -> int:
    try:
        return max(1, ptrs.get_element_ty().primitive_bitwidth // 8)
    except AttributeError:
        return 1


# Where Triton, kernel_lens, numpy and torch live: the frames of the interpreter, not the kernel's
# (and mutmut's trampolines, which wrap kernel_lens's functions when the mutation gate runs).
_INTERNAL = tuple(os.path.dirname(m.__file__) + os.sep for m in (triton, np, torch)) + \
    (os.path.dirname(os.path.dirname(os.path.dirname(__file__))) + os.sep,
     os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "mutmut") + os.sep)


def users_file(path: str) -> bool:
    """A frame's file is the user's (a model, a kernel, a library's kernel): not Triton,
    kernel_lens, numpy or torch, and not generated source."""
    return not path.startswith(_INTERNAL) and not path.startswith("<")


def _kernel_line() -> str:
    """`` at FILE:LINE`` of the kernel's (or its @triton.jit helper's) line the interpreter is
    running: the innermost frame outside Triton, kernel_lens, numpy and torch."""
    frame = sys._getframe(1)
    while frame is not None:
        if users_file(frame.f_code.co_filename):
            return f" at {frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return ""


def kernel_line_of(exc: BaseException) -> str:
    """`` at FILE:LINE`` of the innermost line of the user's code (the kernel's, when the
    interpreter raised inside it) in ``exc``'s traceback, or ''."""
    found, tb = "", exc.__traceback__
    while tb is not None:
        if users_file(tb.tb_frame.f_code.co_filename):
            found = f" at {tb.tb_frame.f_code.co_filename}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


def _program() -> str:
    idx = getattr(interpreter.interpreter_builder, "grid_idx", None)
    return f" in program {tuple(int(i) for i in idx)}" if idx is not None else ""


_active: list[_Checker] = []


def _current() -> _Checker | None:
    return _active[-1] if _active else None


def _wrap_masked_load(orig: Any) -> Any:
    def create_masked_load(self, ptrs, mask, *args, **kwargs):
        checker = _current()
        if checker is not None:
            checker.check("load", ptrs, mask)
        return orig(self, ptrs, mask, *args, **kwargs)
    return create_masked_load


def _wrap_masked_store(orig: Any) -> Any:
    def create_masked_store(self, ptrs, value, mask, *args, **kwargs):
        checker = _current()
        if checker is not None:
            checker.check("store", ptrs, mask)
        return orig(self, ptrs, value, mask, *args, **kwargs)
    return create_masked_store


def _wrap_atomic_rmw(orig: Any) -> Any:
    def create_atomic_rmw(self, rmwOp, ptr, val, mask, *args, **kwargs):
        checker = _current()
        if checker is not None:
            checker.check("atomic", ptr, mask)
        return orig(self, rmwOp, ptr, val, mask, *args, **kwargs)
    return create_atomic_rmw


def _wrap_atomic_cas(orig: Any) -> Any:
    def create_atomic_cas(self, ptr, *args, **kwargs):
        checker = _current()
        if checker is not None:
            checker.check("atomic", ptr, None)
        return orig(self, ptr, *args, **kwargs)
    return create_atomic_cas


_WRAPPERS = {
    "create_masked_load": _wrap_masked_load,
    "create_masked_store": _wrap_masked_store,
    "create_atomic_rmw": _wrap_atomic_rmw,
    "create_atomic_cas": _wrap_atomic_cas,
}


@contextlib.contextmanager
def checked_memory(ranges: Iterable[MemoryRange], kernel: str | None = None) -> Iterator[None]:
    """Check every interpreted load/store/atomic against ``ranges`` while the block runs.

    Scoped: the interpreter's methods are restored afterwards (nested uses check against the
    innermost ranges). An :class:`OutOfBoundsAccess` reaching here unwrapped (Triton's
    ``front_end_debugging`` knob skips its InterpreterError wrapping, which capture's
    ``_interpreter_failure`` prefixes with the kernel name) gets ``kernel``'s name prefixed.
    """
    _active.append(_Checker(ranges))
    try:
        with contextlib.ExitStack() as stack:
            if len(_active) == 1:
                for name, wrap in _WRAPPERS.items():
                    stack.enter_context(_patched(InterpreterBuilder, name,
                                                 wrap(InterpreterBuilder.__dict__[name])))
            try:
                yield
            except OutOfBoundsAccess as exc:
                if kernel is None or str(exc).startswith("kernel "):
                    raise
                raise OutOfBoundsAccess(f"kernel {kernel}: {exc}") from exc
    finally:
        _active.pop()
