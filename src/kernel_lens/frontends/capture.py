"""Launch capture: run the model's forward once and record every Triton kernel launch.

On a GPU the kernels run natively; on a CPU-only host each launch is executed by Triton's
interpreter (no TRITON_INTERPRET needed), so the forward still computes real values.
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

from ..errors import CaptureError, KernelLensError, UnsupportedKernelError
from . import triton_compat as tc

log = logging.getLogger(__name__)


@dataclass
class CapturedLaunch:
    """One launch as Triton's JIT saw it during the eager forward."""

    jit: Any
    params: dict[str, Any]
    specialization: list[tuple[str, Any]]
    options: dict[str, Any]
    grid: tuple[int, int, int]
    autotune_config: Any = None  # triton.Config chosen, if autotuned
    autotune_choice: str | None = None


@dataclass
class Capture:
    launches: list[CapturedLaunch] = field(default_factory=list)
    outputs: Any = None
    native: bool = False


def innermost_jit(fn: Any) -> Any:
    """The JITFunction under any stack of @triton.autotune / @triton.heuristics wrappers."""
    while not isinstance(fn, tc.JITFunction):
        fn = fn.fn
    return fn


def kernel_name(fn: Any) -> str:
    return innermost_jit(fn).fn.__name__


def _normalize_grid(grid: Any, kernel: str, to_int: Callable[[Any], Any]) -> tuple:
    if isinstance(grid, int) or not isinstance(grid, (tuple, list)):
        grid = (grid,)
    if not 1 <= len(grid) <= 3:
        raise UnsupportedKernelError(f"kernel {kernel}: grid must have 1 to 3 dimensions, got {grid!r}")
    values = [to_int(g) for g in grid]
    return tuple(values) + (1,) * (3 - len(values))


def _concrete(kernel: str) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, torch.Tensor):
            raise UnsupportedKernelError(
                f"kernel {kernel}: the grid contains a tensor; grids must be Python ints computed "
                f"from shapes (tensor-valued grids depend on data and cannot be compiled)"
            )
        if isinstance(value, bool) or not isinstance(value, int):
            raise UnsupportedKernelError(f"kernel {kernel}: grid entry {value!r} is not an int")
        return value
    return convert


def check_arguments(jit_fn: Any, params: dict[str, Any]) -> None:
    """Reject argument kinds kernel_lens cannot lift, naming the kernel and the argument."""
    kernel = kernel_name(jit_fn)
    devices = set()
    for name, value in params.items():
        if isinstance(value, torch.Tensor):
            devices.add(value.device.type)
            continue
        if value is None or isinstance(value, (bool, int, float, str)):
            continue
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            continue
        kind = type(value).__name__
        if kind == "TensorDescriptor":
            hint = "tensor descriptors (TMA) are not supported yet; pass the pointer and strides"
        elif isinstance(value, (tuple, list)):
            hint = "tuple/list arguments are not supported; pass each element as its own argument"
        elif kind == "dtype" or kind.endswith("JITFunction"):
            if tc.is_constexpr_param(jit_fn, name):
                continue
            hint = "pass it as a tl.constexpr parameter"
        else:
            hint = "pass tensors, ints, floats, bools or None"
        raise UnsupportedKernelError(f"kernel {kernel}: argument {name!r} of type {kind}: {hint}")
    if len(devices) > 1:
        raise CaptureError(f"kernel {kernel}: tensor arguments live on different devices {devices}")


@contextlib.contextmanager
def _patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    old = obj.__dict__[name]
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


_interpreted: dict[int, Any] = {}
_ORIG_PATCH_LANG_TENSOR: Any = None


def _interpreted_fn(jit_fn: Any) -> Any:
    from triton.runtime.interpreter import InterpretedFunction
    fn = _interpreted.get(id(jit_fn))
    if fn is None:
        fn = _interpreted[id(jit_fn)] = InterpretedFunction(jit_fn.fn)
    return fn


def _call_helper_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A @triton.jit helper called from an interpreted kernel runs interpreted too.

    (InterpretedFunction.__call__ patches triton.language without restoring it, which breaks
    later real compilations; here the patch is scoped to the call.)
    """
    from triton.runtime import interpreter

    fn = _interpreted_fn(self)
    scope = interpreter._patch_lang(self.fn)
    try:
        return fn.rewrite()(*args, **kwargs)
    finally:
        scope.restore()


def _patch_lang_tensor_numpy2(tensor: Any, scope: Any) -> None:
    """Triton 3.6's interpreter turns scalars into ints with int(ndarray), which numpy >= 2.4
    rejects for 1-element arrays of rank > 0; convert through .item() instead."""
    _ORIG_PATCH_LANG_TENSOR(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0].item()))


def _scalar_types(jit_fn: Any, specialization: Any, args: tuple, kwargs: dict) -> dict[str, str]:
    """Triton's signature type ('i32', 'u64', 'fp32', 'u1', ...) of each scalar parameter, as
    Triton's own binder decides it for this launch (annotations included)."""
    if specialization is None:
        _, specialization, _ = tc.binder_for(jit_fn, 90)(*args, **kwargs)
    return {p.name: ty for p, (ty, _) in zip(jit_fn.params, specialization)
            if not p.is_constexpr and tc.is_scalar_type(ty)}


def _typed_scalar(kernel: str, name: str, ty: str, value: Any) -> Any:
    """``value`` as the interpreter's typed scalar of Triton type ``ty`` (what the kernel sees on
    a GPU: a Python float typed fp32 arrives rounded to fp32, as a tensor with ``.to()``)."""
    if isinstance(value, float) and ty.startswith(("i", "u")) and ty != "u1":
        raise CaptureError(f"kernel {kernel}: argument {name!r} is typed {ty} but got the float "
                           f"{value!r}; pass an int")
    try:
        return tc.interpreter_scalar(ty, value)
    except (ValueError, OverflowError) as exc:
        raise CaptureError(f"kernel {kernel}: argument {name!r} = {value!r}: {exc}") from None


def _interpreter_failure(kernel: str, exc: BaseException) -> CaptureError:
    from triton.runtime.interpreter import InterpreterError

    cause = exc.__cause__ if isinstance(exc, InterpreterError) and exc.__cause__ is not None else exc
    text = str(cause).strip() or repr(cause)
    return CaptureError(f"kernel {kernel}: Triton's interpreter failed to run this launch: "
                        f"{type(cause).__name__}: {text}")


def interpret_launch(jit_fn: Any, args: tuple, kwargs: dict, grid: tuple,
                     specialization: Any = None) -> None:
    """Execute one launch on CPU tensors with Triton's interpreter.

    Scalars are handed over as the interpreter's typed scalars of the types Triton's binder
    gives them (``specialization``, computed here if not given), as Triton's JIT types them:
    bools as i1, ints as i32/i64/u64, Python floats as fp32, annotated parameters as annotated.
    A failure inside the interpreter raises :class:`CaptureError` naming the kernel.
    """
    from triton.runtime import interpreter

    global _ORIG_PATCH_LANG_TENSOR
    if _ORIG_PATCH_LANG_TENSOR is None:
        _ORIG_PATCH_LANG_TENSOR = interpreter._patch_lang_tensor
    kernel = kernel_name(jit_fn)
    try:
        types = _scalar_types(jit_fn, specialization, args, kwargs)
    except Exception as exc:
        raise _binder_failure(jit_fn, tc.bind_params(jit_fn, args, kwargs), exc) from exc
    params = tc.bind_params(jit_fn, args, kwargs)
    for name, ty in types.items():
        params[name] = _typed_scalar(kernel, name, ty, params[name])
    with _patched(tc.JITFunction, "__call__", _call_helper_interpreted), \
            _patched(interpreter, "_patch_lang_tensor", _patch_lang_tensor_numpy2):
        try:
            _interpreted_fn(jit_fn).run(grid=grid, warmup=False, **params)
        except KernelLensError:
            raise
        except Exception as exc:
            raise _interpreter_failure(kernel, exc) from exc


def _binder_failure(jit_fn: Any, params: dict[str, Any], exc: BaseException) -> CaptureError:
    """Triton's binder rejected an argument (e.g. an int outside [-2**63, 2**64)): name it."""
    kernel = kernel_name(jit_fn)
    culprit = next((n for n, v in params.items() if isinstance(v, int) and not isinstance(v, bool)
                    and not -2**63 <= v < 2**64), None)
    where = f" argument {culprit!r} = {params[culprit]}:" if culprit else ""
    hint = " (Triton takes integer scalars in [-2**63, 2**64))" if culprit else ""
    return CaptureError(f"kernel {kernel}:{where} Triton cannot type the launch's arguments: "
                        f"{type(exc).__name__}: {exc}{hint}")


class _Recorder:
    """Holds the state of one capture while the forward runs with Triton patched."""

    def __init__(self, arch: int, native: bool, autotune: dict[str, dict] | None) -> None:
        self.arch = arch
        self.native = native
        self.autotune = autotune or {}
        self.launches: list[CapturedLaunch] = []
        self.benchmarking = 0
        self.fake_timing = 0

    # JITFunction.run
    def run(self, orig: Callable, jit_fn: Any, args: tuple, grid: Any, warmup: bool, kwargs: dict) -> Any:
        if warmup or self.benchmarking:
            return orig(jit_fn, *args, grid=grid, warmup=warmup, **kwargs)
        kernel = kernel_name(jit_fn)
        params = tc.bind_params(jit_fn, args, kwargs)
        check_arguments(jit_fn, params)
        try:
            _, specialization, options = tc.binder_for(jit_fn, self.arch)(*args, **kwargs)
        except Exception as exc:
            raise _binder_failure(jit_fn, params, exc) from exc
        grid_value = grid(params) if callable(grid) else grid
        concrete = _normalize_grid(grid_value, kernel, _concrete(kernel))
        if self.native:
            orig(jit_fn, *args, grid=grid, warmup=False, **kwargs)
        else:
            interpret_launch(jit_fn, args, kwargs, concrete, specialization)
        self.launches.append(CapturedLaunch(jit_fn, params, list(specialization), dict(options), concrete))
        return None

    # Autotuner.run
    def autotune_run(self, orig: Callable, tuner: Any, args: tuple, kwargs: dict) -> Any:
        start = len(self.launches)
        kernel = kernel_name(tuner)
        wanted = self.autotune.get(kernel)
        if self.native and wanted is None:
            ret, choice = orig(tuner, *args, **kwargs), "benchmarked"
        else:
            if wanted is not None and not any(c.kwargs == wanted for c in tuner.configs):
                raise CaptureError(
                    f"kernel {kernel}: autotune override {wanted} matches none of its configs "
                    f"{[c.kwargs for c in tuner.configs]}"
                )
            saved, tuner.cache = tuner.cache, {}
            self.fake_timing = 0
            try:
                ret = orig(tuner, *args, **kwargs)
            finally:
                tuner.cache = saved
            choice = "user" if wanted is not None else "first-config"
            if choice == "first-config" and len(tuner.configs) > 1:
                log.warning("kernel %s: no GPU to benchmark @triton.autotune configs; using the "
                            "first config %s (override with autotune={%r: {...}})",
                            kernel, tuner.best_config.kwargs, kernel)
        if len(self.launches) != start + 1:
            raise CaptureError(f"kernel {kernel}: autotuned launch was not captured exactly once")
        self.launches[-1].autotune_config = tuner.best_config
        self.launches[-1].autotune_choice = choice
        return ret

    # Autotuner._bench
    def bench(self, orig: Callable, tuner: Any, args: tuple, config: Any, meta: dict) -> Any:
        wanted = self.autotune.get(kernel_name(tuner))
        if self.native and wanted is None:
            self.benchmarking += 1
            try:
                return orig(tuner, *args, config=config, **meta)
            finally:
                self.benchmarking -= 1
        # No benchmarking here: rank configs so the override (or else the first) wins.
        if wanted is not None:
            return [0.0 if config.kwargs == wanted else float("inf")] * 3
        self.fake_timing += 1
        return [float(self.fake_timing)] * 3


@contextlib.contextmanager
def recording(recorder: _Recorder) -> Iterator[_Recorder]:
    orig_run = tc.JITFunction.run
    orig_tune = tc.Autotuner.run
    orig_bench = tc.Autotuner._bench

    def run(self, *args, grid, warmup, **kwargs):
        return recorder.run(orig_run, self, args, grid, warmup, kwargs)

    def tune(self, *args, **kwargs):
        return recorder.autotune_run(orig_tune, self, args, kwargs)

    def bench(self, *args, config, **meta):
        return recorder.bench(orig_bench, self, args, config, meta)

    with _patched(tc.JITFunction, "run", run), _patched(tc.Autotuner, "run", tune), \
            _patched(tc.Autotuner, "_bench", bench):
        yield recorder


def _devices(inputs: tuple) -> set[str]:
    return {t.device.type for t in inputs if isinstance(t, torch.Tensor)}


def capture(model: Callable, example_inputs: tuple, arch: int,
            autotune: dict[str, dict] | None = None) -> Capture:
    """Run ``model(*example_inputs)`` once, recording every Triton launch in program order."""
    devices = _devices(example_inputs)
    native = "cuda" in devices
    if native and devices != {"cuda"}:
        raise CaptureError(f"example inputs mix devices {devices}; put them all on one device")
    recorder = _Recorder(arch, native, autotune)
    with recording(recorder), torch.no_grad():
        outputs = model(*example_inputs)
    if not recorder.launches:
        raise CaptureError("the forward launched no @triton.jit kernel; nothing to compile")
    return Capture(recorder.launches, outputs, native)
