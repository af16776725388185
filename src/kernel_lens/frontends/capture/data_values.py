"""Sizes and branches that come from tensor VALUES (``nonzero()`` counts, ``.item()``).

torch.export gives such a size an *unbacked* symbol (``u0``) and refuses any Python branch on
it. kernel_lens knows more than torch.export does: the eager capture ran the same forward on the
example inputs. So the capture records what each data-dependent op returned (:func:`recording`:
the ops torch tags ``dynamic_output_shape`` / ``data_dependent_output``, in program order), and
the trace hands each unbacked symbol its example value as torch creates it (:func:`replaying`).
torch then follows the branch the example took and turns the condition into a run-time assert
(its draft-export mechanism), which becomes an IR :class:`~kernel_lens.ir.RuntimeCheck`: a call
that would take another branch is refused, naming the model's line (:data:`Replay.guards`).
"""

from __future__ import annotations

import builtins
import contextlib
import linecache
import os
import sys
import sysconfig
from dataclasses import dataclass, field
from typing import Any, Iterator

import sympy
import torch
from torch._subclasses import fake_tensor
from torch.fx.experimental.symbolic_shapes import ShapeEnv, free_unbacked_symbols
from torch.utils._python_dispatch import TorchDispatchMode

from .interpreter_bounds import users_file

_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)
_REAL_GUARD = "propagate_real_tensors"  # the message torch gives a guard it turned into an assert


def data_dependent(func: Any) -> bool:
    """An ATen op whose result's shape or value depends on its inputs' values."""
    return any(tag in getattr(func, "tags", ()) for tag in _TAGS)


def _summary(out: Any) -> Any:
    """What the trace needs of a data-dependent op's eager result: each tensor's shape, or the
    scalar."""
    if isinstance(out, torch.Tensor):
        return ("tensor", tuple(out.shape))
    if isinstance(out, (list, tuple)):
        return ("seq", tuple(_summary(o) for o in out))
    if isinstance(out, (bool, int, float)):
        return ("scalar", out)
    return ("other", None)


class _Recorder(TorchDispatchMode):
    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if data_dependent(func):
            self.log.append((str(func), _summary(out), _where()))
        return out


@contextlib.contextmanager
def recording(log: list) -> Iterator[None]:
    """The eager capture's side: ``log`` gets (op, result summary, model line) for every
    data-dependent op the forward runs (:func:`value_reads` as the trace has them)."""
    with value_reads(), _Recorder(log):
        yield


def _tolist(self: torch.Tensor) -> Any:
    """``Tensor.tolist`` as torch.export's fake tensors run it (one ``.item()`` per element)."""
    if self.dim() == 0:
        return self.item()
    return [elem.tolist() if elem.dim() else elem.item() for elem in self]


def _equal(self: torch.Tensor, other: torch.Tensor) -> bool:
    """``torch.equal`` called by the model: the same shape and every element equal (after type
    promotion, NaN never equal), one ``.item()`` of a bool: a branch on it is checked at run
    time. torch's own callers (its export machinery) get torch's."""
    caller = sys._getframe(1).f_code.co_filename
    if not isinstance(other, torch.Tensor) or "/torch/" in caller or not users_file(caller):
        return _EQUAL(self, other)
    return tuple(self.shape) == tuple(other.shape) and bool(torch.eq(self, other).all().item())


_EQUAL = torch.equal


@contextlib.contextmanager
def value_reads() -> Iterator[None]:
    """Tensor methods that read values without an ATen op the trace can follow, written with
    ``.item()`` for the eager capture and the trace alike: ``Tensor.tolist`` (fake tensors make
    it one ``.item()`` per element in order; eager reads memory) and ``torch.equal`` (an op whose
    bool torch.export cannot trace)."""
    saved = torch.Tensor.tolist, torch.Tensor.equal, torch.equal
    torch.Tensor.tolist, torch.Tensor.equal, torch.equal = _tolist, _equal, _equal
    try:
        yield
    finally:
        torch.Tensor.tolist, torch.Tensor.equal, torch.equal = saved


# Python's own library (contextlib, functools) is never the model's line (mutmut's trampolines
# are not either: users_file says so).
_STDLIB = sysconfig.get_paths()["stdlib"] + os.sep


def _not_model(path: str) -> bool:
    """Python's own library (an installed package under it is a library's code, kept)."""
    packages = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    return path.startswith(_STDLIB) and not packages


# kernel_lens's own frames that call the forward: an assert made after the forward returned
# (torch.export finishing its graph) has no line of the model.
_DRIVERS = (os.path.join(os.path.dirname(os.path.dirname(__file__)), "trace", "export.py"),
            os.path.join(os.path.dirname(__file__), "recorder.py"))


_SITE: list[str] = []  # where the asserts made now stand for (set by :func:`asserting_for`)


@contextlib.contextmanager
def asserting_for(where: str) -> Iterator[None]:
    """Asserts made inside name ``where`` (kernel_lens's own asserts on the model's behalf)."""
    _SITE.append(where)
    try:
        yield
    finally:
        _SITE.pop()


def model_line(frame: Any) -> str:
    """``file:line: code`` of the innermost frame of the model's code from ``frame`` outwards,
    through kernel_lens's own frames (a launch's site); empty when there is none."""
    while frame is not None:
        name = frame.f_code.co_filename
        if users_file(name) and not _not_model(name) and "/torch/" not in name and name not in _DRIVERS:
            code = linecache.getline(name, frame.f_lineno).strip()
            return f"{name}:{frame.f_lineno}" + (f": {code[:120]}" if code else "")
        frame = frame.f_back
    return ""


def _where() -> str:
    """``file:line: code`` of the innermost frame of the model's own code (or a library's);
    empty outside the forward."""
    if _SITE:
        return _SITE[-1]
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name in _DRIVERS:
            return ""
        if users_file(name) and not _not_model(name) and "/torch/" not in name:
            code = linecache.getline(name, frame.f_lineno).strip()
            return f"{name}:{frame.f_lineno}" + (f": {code[:120]}" if code else "")
        frame = frame.f_back
    return ""


@dataclass
class Replay:
    """What the trace learned: each unbacked symbol's example value and the line that made it,
    and each guard torch turned into a run-time assert, with the model's line that branched."""

    values: dict[sympy.Symbol, int] = field(default_factory=dict)
    items: list[tuple[Any, int, str]] = field(default_factory=list)  # each .item(): (symbol, value, line)
    made_at: dict[sympy.Symbol, str] = field(default_factory=dict)
    guards: list[tuple[sympy.Basic, str]] = field(default_factory=list)
    asserts: list[tuple[sympy.Basic, str]] = field(default_factory=list)  # others: torch._check


def _new_unbacked(out: Any) -> bool:
    """Whether a fake result holds an unbacked symbol (a size or value torch cannot know)."""
    if isinstance(out, (list, tuple)):
        return any(_new_unbacked(o) for o in out)
    if isinstance(out, torch.Tensor):
        return any(isinstance(s, torch.SymInt) and s.node.expr.free_symbols and
                   any(_unbacked(x) for x in s.node.expr.free_symbols) for s in out.shape)
    if isinstance(out, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return any(_unbacked(x) for x in out.node.expr.free_symbols)
    return False


def _unbacked(expr: Any) -> bool:
    return isinstance(expr, sympy.Symbol) and expr.name.startswith("u")


def _assign(env: Any, replay: Replay, fake: Any, eager: Any, where: str) -> None:
    """Give each unbacked symbol in ``fake`` (the fake result) its value in ``eager`` (the
    summary of the eager result)."""
    kind, data = eager
    if kind == "seq" and isinstance(fake, (list, tuple)):
        for f, e in zip(fake, data):
            _assign(env, replay, f, e, where)
        return
    pairs: list[tuple[Any, Any]] = []
    if kind == "tensor" and isinstance(fake, torch.Tensor):
        pairs = [(s.node.expr, v) for s, v in zip(fake.shape, data) if isinstance(s, torch.SymInt)]
    elif kind == "scalar" and isinstance(fake, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        expr = fake.node.expr
        if isinstance(fake, torch.SymBool) and isinstance(expr, sympy.Eq) and expr.rhs == 1:
            expr, data = expr.lhs, int(bool(data))  # .item() of a bool tensor: Eq(u, 1)
        pairs = [(expr, data)]
    for expr, value in pairs:
        if _unbacked(expr) and isinstance(value, (bool, int)) and expr not in replay.values:
            replay.values[expr] = int(value)
            replay.made_at[expr] = where
            setter = getattr(env, "set_real_tensor_prop_unbacked_vals", None) or \
                env.set_unbacked_var_to_val  # (its name before torch 2.10)
            setter(expr, int(value))


def _at_example_sizes(env: Any, replay: Replay, func: Any, args: Any, kwargs: Any) -> Any:
    """``func``'s result at the example's sizes: run on meta tensors with every size the
    example's value; None when a size has no value."""
    values = {**env.var_to_val, **replay.values}

    def concrete(obj: Any) -> Any:
        if isinstance(obj, (torch.SymInt, torch.SymBool, torch.SymFloat)):
            got = sympy.sympify(sympy.sympify(obj.node.expr).xreplace(values))
            if got.free_symbols:
                raise LookupError(got)
            return bool(got) if isinstance(obj, torch.SymBool) else \
                int(got) if isinstance(obj, torch.SymInt) else float(got)
        if isinstance(obj, torch.Tensor):
            return torch.empty_strided([concrete(d) for d in obj.shape], [concrete(d) for d in obj.stride()],
                                       dtype=obj.dtype, device="meta")
        if isinstance(obj, (list, tuple)):
            return type(obj)(concrete(o) for o in obj)
        if isinstance(obj, dict):
            return {k: concrete(v) for k, v in obj.items()}
        return obj

    try:
        with fake_tensor.unset_fake_temporarily():
            return func(*concrete(args), **concrete(kwargs or {}))
    except Exception:  # no value for a size, or no meta function: torch.export's own refusal stands
        return None


@contextlib.contextmanager
def replaying(log: list, replay: Replay) -> Iterator[None]:
    """The trace's side: each data-dependent op under torch.export takes the next eager record
    (the same op at the same line of the model), and the unbacked symbols of its fake result get
    the eager values; guards torch then decides from those values are noted in ``replay``."""
    pending = list(log)
    impl = fake_tensor.FakeTensorMode._dispatch_impl
    defer = ShapeEnv.guard_or_defer_runtime_assert

    def dispatch(self: Any, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        out = impl(self, func, types, args, kwargs)
        if data_dependent(func) and self.shape_env is not None and _new_unbacked(out):
            # the eager run's next result of this op at this line of the model (code that runs
            # only outside tracing, e.g. behind is_tracing(), made records this trace skips)
            here = _where()
            k = next((i for i, r in enumerate(pending) if r[0] == str(func) and r[2] == here), None)
            if k is None:
                return out  # no value: a branch on it fails as in torch.export, naming the line
            record = pending[k]
            del pending[:k + 1]
            _assign(self.shape_env, replay, out, record[1], record[2])
            if "_local_scalar_dense" in str(func) and record[1][0] == "scalar":
                expr = getattr(getattr(out, "node", None), "expr", None)
                if isinstance(out, torch.SymBool) and isinstance(expr, sympy.Eq):
                    expr = expr.lhs
                replay.items.append((expr, record[1][1], record[2]))
        elif self.shape_env is not None and _new_unbacked(out) and not data_dependent(func):
            # a size torch cannot name from its inputs' symbols although it follows from their
            # values (x[a:b] with a, b from .tolist(): the slice clamps its length and offset):
            # the op's own meta function at the example's sizes gives it
            made = _at_example_sizes(self.shape_env, replay, func, args, kwargs)
            fakes = out if isinstance(out, (list, tuple)) else [out]
            metas = made if isinstance(made, (list, tuple)) else [made]
            for fake, meta in zip(fakes, metas):
                if isinstance(fake, torch.Tensor) and isinstance(meta, torch.Tensor):
                    for f, m in [*zip(fake.shape, meta.shape), *zip(fake.stride(), meta.stride()),
                                 (fake.storage_offset(), meta.storage_offset())]:
                        _assign(self.shape_env, replay, f, ("scalar", int(m)), _where())
        return out

    # torch defers such an assert to run time (an IR check), but would also replace the symbol
    # by what the assert equates it to (``if valids.numel() != total:`` decided from the
    # example, or ``torch._check(n == total)``: u0 := total); the assert then reads as always
    # true and is dropped, and the graph assumes the example's size for every call. A size
    # from tensor values is never replaced: the assert stays, and is checked at run time.
    # (Patched on the shape environment only while it defers an assert: torch names the user's
    # line of other replacements from the stack, which must not hold a frame of kernel_lens.)
    def guard_or_defer(self: Any, orig_expr: Any, msg: str, *args: Any, **kwargs: Any) -> Any:
        decided = isinstance(msg, str) and msg.startswith(_REAL_GUARD)  # a branch, from the example
        (replay.guards if decided else replay.asserts).append((orig_expr, _where()))
        if "_set_replacement" in vars(self):  # an assert deferred inside another
            return defer(self, orig_expr, msg, *args, **kwargs)
        replace = self._set_replacement

        def set_replacement(a: Any, tgt: Any, why: str) -> None:
            if not _unbacked(a):
                replace(a, tgt, why)

        self._set_replacement = set_replacement
        try:
            return defer(self, orig_expr, msg, *args, **kwargs)
        finally:
            del self._set_replacement

    fake_tensor.FakeTensorMode._dispatch_impl = dispatch
    ShapeEnv.guard_or_defer_runtime_assert = guard_or_defer
    try:
        with value_reads():
            yield
    finally:
        fake_tensor.FakeTensorMode._dispatch_impl = impl
        ShapeEnv.guard_or_defer_runtime_assert = defer


class _IntType(type):
    """``isinstance``/``issubclass`` against :class:`_SymbolicInt` answer as for ``int``."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, builtins.int)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, builtins.int)


class _SymbolicInt(builtins.int, metaclass=_IntType):
    """``int`` in the modules whose code reads a tensor's value with ``int()`` (the eager run
    saw where), while torch.export traces: ``int(t)`` of a one-element integer tensor is
    ``t.item()`` and ``int()`` of such a value is the value, so the size stays a run-time size
    (torch's ``int()`` would make it a constant of the trace). Everything else is ``int``."""

    def __new__(cls, x: Any = 0, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs:
            if isinstance(x, torch.Tensor) and x.numel() == 1 and not x.is_floating_point() \
                    and not x.is_complex() and x.dtype != torch.bool:
                return x.item()
            if isinstance(x, torch.SymInt) and free_unbacked_symbols(x):
                return x
        return builtins.int(x, *args, **kwargs)


def int_reads(log: list) -> set[str]:
    """The files where the eager run (``log``) read a tensor's value on a line calling ``int(``."""
    return {os.path.realpath(where.split(":")[0]) for op, _, where in log
            if "_local_scalar_dense" in op and where and "int(" in where.partition(": ")[2]}


@contextlib.contextmanager
def symbolic_int(log: list) -> Iterator[None]:
    """:class:`_SymbolicInt` as ``int`` in the modules where the eager run (``log``, see
    :func:`recording`) read a scalar from a tensor on a line calling ``int(``."""
    files = int_reads(log)
    patched = []
    for module in list(sys.modules.values()) if files else ():
        path = getattr(module, "__file__", None)
        if path and os.path.realpath(path) in files and "int" not in vars(module):
            module.int = _SymbolicInt
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            vars(module).pop("int", None)


def _unbacked(symbol: Any) -> bool:
    """A symbol torch made for a size from tensor values (``u0``; ``zuf0`` for a float)."""
    return isinstance(symbol, sympy.Symbol) and bool(free_unbacked_symbols(symbol))
