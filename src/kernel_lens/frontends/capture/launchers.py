"""Where launches enter Triton from user code: library launch wrappers and ``torch.library`` ops.

Capture meets user code where it is. Three doors lead to a kernel besides ``kernel[grid](...)``:

- **A library's own launcher**: a ``triton.runtime.KernelInterface`` subclass (not Triton's
  ``JITFunction``/``Autotuner``/``Heuristics``) whose ``run`` does host work on the arguments —
  a cache key from ``data_ptr()``, strides and dtypes, a compiled-kernel cache — before it
  reaches Triton. In the eager capture it runs as written; kernel_lens checks that it launched
  exactly one kernel with the arguments it was given (nothing changed on the way). Under
  torch.export it is *bypassed*: the call goes straight to the Triton launcher beneath it
  (``wrapper.fn``, through autotuners and heuristics), so no wrapper code runs on fake tensors.
- **``torch.library`` ops** (``custom_op`` whose body launches a kernel, ``triton_op`` +
  ``wrap_triton``): opaque to torch.export, so their Python body is inlined in both the capture
  and the trace (the CUDA kernel registered for the op, else its default one), and launches in
  it are recorded like any other. ``wrap_triton`` launches go straight to the kernel.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch._library.custom_ops import OPDEFS
from torch._library.triton import set_wrap_triton_enabled
from torch.overrides import TorchFunctionMode

from ...errors import TraceError, UnsupportedKernelError
from . import tensor_likes
from .. import triton_compat as tc
from .patching import patched

log = logging.getLogger(__name__)

_TRITON_OWN = ("triton.",)  # modules whose KernelInterface subclasses are Triton's own launch path


def _is_triton_own(cls: type) -> bool:
    return cls.__module__.startswith(_TRITON_OWN) or cls.__module__ == "triton"


def foreign_launchers() -> list[type]:
    """Every loaded ``KernelInterface`` subclass outside Triton that defines its own ``run``."""
    seen, out, todo = set(), [], [tc.KernelInterface]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            todo.append(sub)
            if not _is_triton_own(sub) and "run" in sub.__dict__:
                out.append(sub)
    return out


def triton_launcher_under(wrapper: Any) -> Any:
    """The first of Triton's own launchers (JITFunction, Autotuner, Heuristics) beneath a
    library's wrapper: followed through ``.fn`` (as Triton's autotuner and heuristics nest), or
    the one KernelInterface attribute the wrapper holds; for a library's subclass of Triton's
    Autotuner or Heuristics, Triton's own class's ``run`` on it."""
    node, hops = wrapper, 0
    while hops < 16:
        hops += 1
        if isinstance(node, tc.KernelInterface) and _is_triton_own(type(node)):
            return node
        for base in (tc.Autotuner, tc.Heuristics):  # a library's subclass (fla's CachedAutotuner,
            if isinstance(node, base):              # FlagGems' LibTuner under its LibEntry)
                return _BaseLauncher(base, node)
        inner = getattr(node, "fn", None)
        if not isinstance(inner, tc.KernelInterface):
            held = [v for v in vars(node).values() if isinstance(v, tc.KernelInterface)] \
                if hasattr(node, "__dict__") else []
            inner = held[0] if len(held) == 1 else None
        if inner is None:
            break
        node = inner
    raise UnsupportedKernelError(
        f"launcher {type(wrapper).__qualname__} (a triton KernelInterface from "
        f"{type(wrapper).__module__}) holds no Triton kernel that kernel_lens can find (looked "
        f"through .fn and its attributes): give it an .fn attribute that is the @triton.jit "
        f"function, autotuner or heuristics it launches")


class _BaseLauncher:
    """A library's subclass of Triton's Autotuner/Heuristics run as Triton's own class runs it
    (its ``run`` override, e.g. a disk cache of configs keyed on the arguments, is skipped)."""

    def __init__(self, base: type, wrapper: Any) -> None:
        self.base, self.wrapper = base, wrapper

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self.base.run(self.wrapper, *args, **kwargs)  # looked up now: capture patches it


def _split_launch_kwargs(kwargs: dict) -> tuple[Any, bool, dict]:
    rest = dict(kwargs)
    if "grid" not in rest:
        raise UnsupportedKernelError("a Triton launcher was called without grid=...")
    grid = rest.pop("grid")
    warmup = bool(rest.pop("warmup", False))
    return grid, warmup, rest


@dataclass
class WrapperCall:
    """One call of a library's launcher in the eager forward, and whether bypassing it under
    torch.export launches the same thing (``problem`` says why not)."""

    launcher: str
    problem: str | None = None


@dataclass
class LauncherLog:
    """What the eager capture learned about launchers, handed to the symbolic trace."""

    wrapper_calls: list[WrapperCall] = field(default_factory=list)
    inlined_ops: set[str] = field(default_factory=set)  # torch.library ops whose body launched


def _same(launched: Any, given: Any) -> bool:
    if isinstance(launched, torch.Tensor) and tensor_likes.is_tensor_like(given):
        # a tensor-like argument is launched as a view of its storage with the same pointer
        return launched.data_ptr() == given.data_ptr() and launched.dtype == given.dtype
    if isinstance(launched, torch.Tensor) or isinstance(given, torch.Tensor):
        return launched is given
    if hasattr(given, "data_ptr") and hasattr(launched, "data_ptr"):
        return launched is given
    try:
        return bool(launched == given) and type(launched) is type(given)
    except Exception:  # an object whose == is not a bool
        return launched is given


def bypass_problem(wrapper: Any, args: tuple, kwargs: dict, made: list) -> str | None:
    """Why launching ``wrapper``'s Triton launcher directly with the wrapper's own arguments
    would not make the launches ``made`` in the eager forward (None: it would)."""
    name = type(wrapper).__qualname__
    if len(made) != 1:
        return (f"launcher {name} made {len(made)} kernel launches in one call; kernel_lens "
                f"bypasses a library launcher's host code under torch.export and needs it to "
                f"launch exactly one kernel per call")
    launch = made[0]
    jit = launch.jit
    names = [p.name for p in jit.params]
    if len(args) > len(names):
        return f"launcher {name} was called with {len(args)} arguments; its kernel has {len(names)}"
    given = dict(zip(names, args))
    given.update({k: v for k, v in kwargs.items() if k in names})
    for pname, value in given.items():
        if pname in launch.params and not _same(launch.params[pname], value):
            return (f"launcher {name} changed argument {pname!r} of kernel {jit.fn.__name__} "
                    f"before launching it (called with {_brief(value)}, launched with "
                    f"{_brief(launch.params[pname])}); kernel_lens bypasses a library "
                    f"launcher's host code under torch.export, so it must pass its arguments "
                    f"through unchanged: launch the kernel itself, or compute {pname!r} before "
                    f"calling the launcher")
    return None


def _brief(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {tuple(value.shape)} {value.dtype} at {value.data_ptr():#x}"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@contextlib.contextmanager
def _replaced_runs(classes: list[type], make: Callable[[Callable], Callable]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for cls in classes:
            stack.enter_context(patched(cls, "run", make(cls.__dict__["run"])))
        yield


class _CustomOps(TorchFunctionMode):
    """Runs the Python body of ``torch.library`` custom ops instead of dispatching to them."""

    def __init__(self, inline: Callable[[str], bool], on_call: Callable[[str], Any]) -> None:
        super().__init__()
        self.inline = inline
        self.on_call = on_call

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        body = _custom_op_body(func)
        if body is None or not self.inline(func._schema.name):
            return func(*args, **kwargs)
        with self.on_call(func._schema.name), self:  # nested ops are inlined too
            return body(*args, **kwargs)


def _custom_op_body(func: Any) -> Callable | None:
    if not isinstance(func, torch._ops.OpOverload):
        return None
    opdef = OPDEFS.get(func._schema.name)
    if opdef is None:
        return None
    backends = opdef._backend_fns
    return backends.get("cuda") or backends.get(None) or opdef._init_fn


def _wrap_triton_off() -> Any:
    return set_wrap_triton_enabled(False)


@contextlib.contextmanager
def capturing(log_: LauncherLog, launches: list) -> Iterator[None]:
    """The eager capture's side: library launchers run as written and are checked for a
    faithful bypass; custom-op bodies are inlined and those that launch are noted."""
    depth = [0]

    def make(orig: Callable) -> Callable:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0] or kwargs.get("warmup"):
                return orig(self, *args, **kwargs)
            grid, _, rest = _split_launch_kwargs(kwargs)
            record = WrapperCall(type(self).__qualname__)
            log_.wrapper_calls.append(record)
            start = len(launches)
            depth[0] += 1
            try:
                out = orig(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            record.problem = bypass_problem(self, args, rest, launches[start:])
            return out
        return run

    current: list[str] = []

    @contextlib.contextmanager
    def on_call(name: str) -> Iterator[None]:
        start = len(launches)
        current.append(name)
        try:
            yield
        finally:
            current.pop()
            if len(launches) > start:
                log_.inlined_ops.add(name)

    with _replaced_runs(foreign_launchers(), make), _wrap_triton_off(), \
            _CustomOps(lambda name: True, on_call):
        yield


@contextlib.contextmanager
def tracing(log_: LauncherLog) -> Iterator[None]:
    """The symbolic trace's side: library launchers are bypassed (their Triton launcher runs
    directly, so no wrapper code sees fake tensors); custom ops that launched are inlined."""
    calls = iter(log_.wrapper_calls)
    depth = [0]

    def make(orig: Callable) -> Callable:
        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                return orig(self, *args, **kwargs)
            grid, warmup, rest = _split_launch_kwargs(kwargs)
            name = type(self).__qualname__
            if warmup:
                raise TraceError(f"launcher {name}: warmup through a library launcher is not "
                                 f"supported under torch.export; launch the kernel")
            record = next(calls, None)
            if record is None or record.launcher != name:
                seen = record.launcher if record else "no launcher call"
                raise TraceError(
                    f"under torch.export the forward called launcher {name} where the eager "
                    f"forward made {seen}: the launches depend on tensor values; make the forward "
                    f"launch the same kernels for every input in the declared ranges")
            if record.problem:
                raise TraceError(record.problem)
            inner = triton_launcher_under(self)
            depth[0] += 1
            try:
                return inner.run(*args, grid=grid, warmup=False, **rest)
            finally:
                depth[0] -= 1
        return run

    with _replaced_runs(foreign_launchers(), make), _wrap_triton_off(), \
            _CustomOps(lambda name: name in log_.inlined_ops, lambda name: contextlib.nullcontext()):
        yield
