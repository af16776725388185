"""Launch capture: run the model's forward once and record every Triton kernel launch.

On a GPU the kernels run natively; on a CPU-only host each launch is executed by Triton's
interpreter (no TRITON_INTERPRET needed), so the forward still computes real values: scalars are
typed as Triton's JIT types them and libdevice math is evaluated on the CPU, both only while
capturing. Launches through the handle ``kernel.warmup(...)`` returns (``compiled[grid](...)``)
are recorded like ``kernel[grid](...)`` launches.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np
import torch
import triton.language as tl
from triton.compiler.compiler import CompiledKernel
from triton.runtime import interpreter
from triton.runtime.interpreter import InterpretedFunction, InterpreterError

from ...errors import CaptureError, KernelLensError, UnsupportedKernelError
from .. import arguments
from . import data_values, interpreter_casts, launchers, tensor_likes
from .. import triton_compat as tc
from .libdevice_cpu import libdevice_cpu
from .interpreter_bounds import checked_memory, kernel_line_of, tensor_ranges
from .patching import patched as _patched

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
class Warmup:
    """A ``kernel.warmup(...)`` made during the eager forward and the handle it returned."""

    jit: Any
    handle: Any  # Triton's CompiledKernel on a GPU, an InterpretedHandle on a CPU-only host
    constexprs: dict[str, Any]  # what the binary was compiled with
    options: dict[str, Any]  # the non-parameter keywords passed to warmup (num_warps, ...)
    positional: int  # how many arguments warmup got positionally (the rest by keyword)


class CapturedLaunches(list):
    """The launches in program order; ``warmups`` lists the ``kernel.warmup(...)`` calls made
    among them (the symbolic trace hands the same handles back), ``launchers`` the library
    launchers and ``torch.library`` ops they came through."""

    def __init__(self, launches: Any = (), warmups: Any = ()) -> None:
        super().__init__(launches)
        self.warmups: list[Warmup] = list(warmups)
        self.launchers = launchers.LauncherLog()  # library launchers and custom ops seen
        self.data_log: list = []  # data-dependent ops' eager results (trace.data_values)
        self.after_launch: Callable[[CapturedLaunch], None] | None = None

    def append(self, launch: CapturedLaunch) -> None:
        """Record ``launch`` (it has just run) and hand it to ``after_launch``, if set: what
        ``kernel_lens verify`` reads each launch's results with."""
        super().append(launch)
        if self.after_launch is not None:
            self.after_launch(launch)


@dataclass
class Capture:
    launches: list[CapturedLaunch] = field(default_factory=CapturedLaunches)
    outputs: Any = None
    native: bool = False

    @property
    def warmups(self) -> list[Warmup]:
        return getattr(self.launches, "warmups", [])


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
    """Reject argument kinds kernel_lens cannot lift, naming the kernel and the argument
    (:func:`.arguments.check_arguments`), and tensors on different devices."""
    kernel = kernel_name(jit_fn)
    jit = innermost_jit(jit_fn)
    arguments.check_arguments(jit, kernel, params)
    devices = {t.device.type for t in arguments.tensors_of(jit, params)}
    if len(devices) > 1:
        raise CaptureError(f"kernel {kernel}: tensor arguments live on different devices {devices}")


_interpreted: dict[int, Any] = {}
_ORIG_PATCH_LANG_TENSOR: Any = None
_ORIG_PATCH_LANG: Any = None


def _interpreted_fn(jit_fn: Any) -> Any:
    fn = _interpreted.get(id(jit_fn))
    if fn is None:
        fn = _interpreted[id(jit_fn)] = InterpretedFunction(jit_fn.fn)
    return fn


def _call_helper_interpreted(self: Any, *args: Any, **kwargs: Any) -> Any:
    """A @triton.jit helper called from an interpreted kernel runs interpreted too.

    (InterpretedFunction.__call__ patches triton.language without restoring it, which breaks
    later real compilations; here the patch is scoped to the call.)
    """
    fn = _interpreted_fn(self)
    scope = interpreter._patch_lang(self.fn)
    try:
        return fn.rewrite()(*args, **kwargs)
    finally:
        scope.restore()


class _LibdeviceScope:
    """Triton's interpreter patch scope, plus patched dict entries (a kernel's globals)."""

    active = 0  # scopes open: the libdevice modules are patched by the outermost one

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.items: list[tuple[dict, str, Any]] = []
        _LibdeviceScope.active += 1

    def set_attr(self, obj: Any, name: str, value: Any) -> None:
        self.inner.set_attr(obj, name, value)

    def set_item(self, table: dict, key: str, value: Any) -> None:
        self.items.append((table, key, table[key]))
        table[key] = value

    def restore(self) -> None:
        while self.items:
            table, key, value = self.items.pop()
            table[key] = value
        self.inner.restore()
        _LibdeviceScope.active -= 1


def _no_cuda_libdevice(name: str) -> Callable:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise UnsupportedKernelError(
            f"libdevice.{name} has no CUDA implementation in Triton's CUDA libdevice "
            f"(triton.language.extra.cuda.libdevice), so no GPU build of this kernel exists "
            f"either; use a libdevice function that module defines")
    return missing


def _patch_lang_libdevice(fn: Any) -> Any:
    """Triton's ``_patch_lang`` plus libdevice, mapped as Triton's code generator maps it for a
    CUDA target: the CUDA wrappers get the interpreter's semantic, and the backend-neutral stubs
    (module attributes, and names a kernel imported from either module) resolve to them. The
    other builtins of ``tl.extra.cuda`` (``gdc_wait``, ...) get the interpreter's semantic too,
    as attributes and as names a kernel imported."""
    stub, cuda = tc.libdevice_modules()
    extra, gdc = tc.cuda_extra_modules()
    outermost = not _LibdeviceScope.active  # helpers run inside their kernel's scope
    scope = _LibdeviceScope(_ORIG_PATCH_LANG(fn))

    def impl(name: str) -> Callable:
        return getattr(cuda, name) if hasattr(cuda, name) else _no_cuda_libdevice(name)

    try:
        if outermost:
            interpreter._patch_builtin(cuda, interpreter.interpreter_builder, scope)
            for module in (extra, gdc):
                interpreter._patch_builtin(module, interpreter.interpreter_builder, scope)
            for name, value in vars(stub).items():
                if callable(value) and getattr(value, "__module__", None) == stub.__name__:
                    scope.set_attr(stub, name, impl(name))
        modules = (stub.__name__, cuda.__name__)
        for key, value in list(fn.__globals__.items()):
            if not callable(value) or isinstance(value, type):
                continue
            module = getattr(value, "__module__", None)
            if module in modules:
                scope.set_item(fn.__globals__, key, impl(value.__name__))
            elif module == gdc.__name__:
                scope.set_item(fn.__globals__, key, getattr(gdc, value.__name__))
    except BaseException:
        scope.restore()
        raise
    return scope


def _extern_elementwise(self: Any, lib_name: str, lib_path: str, symbol: str, args: list,
                        ret_type: Any, is_pure: bool) -> Any:
    """``InterpreterBuilder.create_extern_elementwise``: a libdevice call evaluated on the CPU."""
    name = tc.libdevice_symbols().get(symbol)
    if name is None:
        raise UnsupportedKernelError(f"extern function {symbol!r} (library {lib_name!r}) is not "
                                     f"CUDA libdevice; Triton's interpreter cannot run it on the "
                                     f"CPU: capture this model on a GPU")
    try:
        data = libdevice_cpu(name, [a.data for a in args], interpreter._get_np_dtype(ret_type))
    except LookupError:
        raise CaptureError(
            f"libdevice.{name} ({symbol}) has no CPU evaluation in kernel_lens, so Triton's "
            f"interpreter cannot run it on a CPU-only host: capture this model on a GPU (inputs "
            f"on 'cuda'), or use another libdevice function") from None
    return interpreter.TensorHandle(data, ret_type.scalar)


#: Triton's grid dependency control (``tl.extra.cuda.gdc_wait`` / ``gdc_launch_dependents``): the
#: only inline assembly the interpreter runs, as nothing. It orders a launch after the one before
#: it on the stream, and the interpreter runs launches one after another anyway.
_GDC_ASM = re.compile(r"\s*griddepcontrol\.(wait|launch_dependents)\s*;")


class _AsmResults:
    """What ``create_inline_asm`` returns: its results by index, as an MLIR op gives them."""

    def __init__(self, handles: list) -> None:
        self.handles = handles

    def get_result(self, i: int) -> Any:
        return self.handles[i]


def _inline_asm(self: Any, asm: str, constraints: str, values: list, types: list, is_pure: bool,
                pack: int) -> Any:
    """``InterpreterBuilder.create_inline_asm``: grid dependency control runs as nothing (its
    dummy int32 result is 0); any other assembly cannot run on the CPU."""
    if _GDC_ASM.match(asm) and not values:
        return _AsmResults([interpreter.TensorHandle(np.zeros(1, dtype=np.int32), tl.int32)
                            for _ in types])
    raise UnsupportedKernelError(f"inline assembly {asm.strip()[:60]!r} cannot run in Triton's "
                                 f"interpreter on the CPU: capture this model on a GPU (inputs on "
                                 f"'cuda')")


def _patch_lang_tensor_numpy2(tensor: Any, scope: Any) -> None:
    """Triton 3.6's interpreter turns scalars into ints with int(ndarray), which numpy >= 2.4
    rejects for 1-element arrays of rank > 0; convert through .item() instead."""
    _ORIG_PATCH_LANG_TENSOR(tensor, scope)
    scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0].item()))


def _scalar_types(jit_fn: Any, specialization: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Triton's signature type ('i32', 'u64', 'fp32', 'u1', ...) of each scalar parameter, as
    Triton's own binder decides it for this launch (annotations included); a tuple parameter's
    entry is the tuple of its elements' types."""
    if specialization is None:
        _, specialization, _ = tc.binder_for(jit_fn, 90)(*args, **kwargs)
    return {p.name: ty for p, (ty, _) in zip(jit_fn.params, specialization)
            if not p.is_constexpr and (tc.is_scalar_type(ty) or isinstance(ty, tuple))}


def _typed_scalar(kernel: str, name: str, ty: Any, value: Any) -> Any:
    """``value`` as the interpreter's typed scalar of Triton type ``ty`` (what the kernel sees on
    a GPU: a Python float typed fp32 arrives rounded to fp32, as a tensor with ``.to()``);
    elements of a tuple argument each as their own type."""
    if isinstance(ty, tuple):
        items = [_typed_scalar(kernel, f"{name}[{i}]", t, v) for i, (t, v) in enumerate(zip(ty, value))]
        return type(value)(*items) if arguments.is_namedtuple(value) else tuple(items)
    if not tc.is_scalar_type(ty):
        return value
    if isinstance(value, float) and ty.startswith(("i", "u")) and ty != "u1":
        raise CaptureError(f"kernel {kernel}: argument {name!r} is typed {ty} but got the float "
                           f"{value!r}; pass an int")
    try:
        return tc.interpreter_scalar(ty, value)
    except (ValueError, OverflowError) as exc:
        raise CaptureError(f"kernel {kernel}: argument {name!r} = {value!r}: {exc}") from None


def _interpreter_failure(kernel: str, exc: BaseException, bf16: bool = False) -> KernelLensError:
    """The interpreter's failure in one line: the kernel, its line (the innermost frame of the
    user's code), what failed and how to get past it. ``bf16``: the launch has bf16 tensors."""
    cause = exc.__cause__ if isinstance(exc, InterpreterError) and exc.__cause__ is not None else exc
    if isinstance(cause, KernelLensError):  # raised by our own patches (libdevice): name the kernel
        return type(cause)(f"kernel {kernel}: {cause}")
    text = str(cause).strip() or repr(cause)
    tb = cause.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    innermost = tb.tb_frame.f_code.co_filename if tb is not None else ""
    language = f"{os.sep}triton{os.sep}language{os.sep}" in innermost
    where = kernel_line_of(cause)
    hint = "compile on a host with a CUDA GPU, where the capture runs the kernel natively"
    if innermost and where.startswith(f" at {innermost}:"):  # the user's own code raised
        hint = "the kernel line named raised it (it would on a GPU too)"
    elif language and isinstance(cause, (ValueError, TypeError)) and "Interpreter" not in text:
        hint = "Triton's language refuses the kernel line named (it would on a GPU too)"  # its own checks
    elif bf16 or "bf16" in text or "bfloat16" in text:
        hint = ("Triton's CPU interpreter computes with numpy, which has no bfloat16: compute in fp32 "
                "there (x.to(tl.float32)), give fp32 example inputs, or " + hint)
    return CaptureError(f"kernel {kernel}{where}: Triton's interpreter failed to run "
                        f"this launch: {type(cause).__name__}: {text}; {hint}")


def interpret_launch(jit_fn: Any, args: tuple, kwargs: dict, grid: tuple,
                     specialization: Any = None) -> None:
    """Execute one launch on CPU tensors with Triton's interpreter.

    Scalars are handed over as the interpreter's typed scalars of the types Triton's binder
    gives them (``specialization``, computed here if not given), as Triton's JIT types them:
    bools as i1, ints as i32/i64/u64, Python floats as fp32, annotated parameters as annotated.
    A failure inside the interpreter raises :class:`CaptureError` naming the kernel.
    """
    global _ORIG_PATCH_LANG_TENSOR, _ORIG_PATCH_LANG
    if _ORIG_PATCH_LANG_TENSOR is None:
        _ORIG_PATCH_LANG_TENSOR = interpreter._patch_lang_tensor
        _ORIG_PATCH_LANG = interpreter._patch_lang
    kernel = kernel_name(jit_fn)
    try:
        types = _scalar_types(jit_fn, specialization, args, kwargs)
    except Exception as exc:
        raise _binder_failure(jit_fn, tc.bind_params(jit_fn, args, kwargs), exc) from exc
    params = tc.bind_params(jit_fn, args, kwargs)
    for name, ty in types.items():
        params[name] = _typed_scalar(kernel, name, ty, params[name])
    with _patched(tc.JITFunction, "__call__", _call_helper_interpreted), \
            _patched(interpreter, "_patch_lang_tensor", _patch_lang_tensor_numpy2), \
            _patched(interpreter, "_patch_lang", _patch_lang_libdevice), \
            _patched(interpreter.InterpreterBuilder, "create_extern_elementwise",
                     _extern_elementwise), \
            _patched(interpreter.InterpreterBuilder, "create_inline_asm", _inline_asm), \
            interpreter_casts.rounded_casts():
        try:
            with checked_memory(tensor_ranges(params), kernel=kernel):
                _interpreted_fn(jit_fn).run(grid=grid, warmup=False, **params)
        except KernelLensError:
            raise
        except Exception as exc:
            bf16 = any(getattr(t, "dtype", None) == torch.bfloat16 for t in params.values())
            raise _interpreter_failure(kernel, exc, bf16) from exc


def _binder_failure(jit_fn: Any, params: dict[str, Any], exc: BaseException) -> CaptureError:
    """Triton's binder rejected an argument (e.g. an int outside [-2**63, 2**64)): name it."""
    kernel = kernel_name(jit_fn)
    culprit = next((n for n, v in params.items() if isinstance(v, int) and not isinstance(v, bool)
                    and not -2**63 <= v < 2**64), None)
    where = f" argument {culprit!r} = {params[culprit]}:" if culprit else ""
    hint = " (Triton takes integer scalars in [-2**63, 2**64))" if culprit else ""
    return CaptureError(f"kernel {kernel}:{where} Triton cannot type the launch's arguments: "
                        f"{type(exc).__name__}: {exc}{hint}")


class InterpretedHandle:
    """What ``kernel.warmup(...)`` returns while capturing on a CPU-only host, where Triton's
    interpreter compiles nothing. Like Triton's CompiledKernel, ``handle[grid](*args)`` (a 3-entry
    grid, every parameter positional, constexprs included) launches the kernel; the attributes
    of a compiled binary (``n_regs``, ``metadata``, ...) raise :class:`CaptureError`."""

    def __init__(self, jit: Any) -> None:
        self.jit = jit
        self.record: Warmup | None = None  # the warmup that made it

    def __getitem__(self, grid: Any) -> Callable:
        if not isinstance(grid, (tuple, list)) or len(grid) != 3:
            raise CaptureError(f"kernel {kernel_name(self.jit)}: a compiled kernel is launched "
                               f"with a 3-entry grid, handle[(x, y, z)](...); got {grid!r}")
        return lambda *args, stream=None: self.run(*grid, stream, None, None, None, None, None,
                                                   *args)

    def run(self, grid_0: Any, grid_1: Any, grid_2: Any, stream: Any, function: Any,
            packed_metadata: Any, launch_metadata: Any, enter_hook: Any, exit_hook: Any,
            *args: Any) -> None:
        raise CaptureError(f"kernel {kernel_name(self.jit)}: the handle kernel.warmup(...) "
                           f"returned was launched outside kernel_lens's capture")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise CaptureError(
            f"kernel {kernel_name(self.jit)}: the handle kernel.warmup(...) returned has no "
            f"{name!r} on a CPU-only host (Triton's interpreter compiles no binary; only "
            f"handle[grid](*args) launches work): capture on a GPU, or size the launch without it")


def handle_info(handle: Any, warmups: list[Warmup]) -> Warmup:
    """What launching ``handle`` (a warmed-up kernel) means: its kernel, the constexprs it was
    compiled with and its options. A CompiledKernel warmed up before capture is read off
    Triton's own record of its compilation."""
    for w in warmups:
        if w.handle is handle:
            return w
    if isinstance(handle, InterpretedHandle):  # kept from an earlier capture
        return handle.record
    jit = getattr(getattr(handle, "src", None), "fn", None)
    if not isinstance(jit, tc.JITFunction):
        name = getattr(handle, "name", type(handle).__name__)
        raise UnsupportedKernelError(
            f"a compiled kernel ({name}) not built from a @triton.jit function was launched; "
            f"kernel_lens captures @triton.jit kernels only")
    constexpr = {i: p.name for i, p in enumerate(jit.params) if p.is_constexpr}
    constexprs = {constexpr[path[0]]: value for path, value in handle.src.constants.items()
                  if len(path) == 1 and path[0] in constexpr}
    md, names = handle.metadata, {p.name for p in jit.params}
    defaults = vars(tc.backend_for(90).parse_options({}))
    options = {k: getattr(md, k) for k in ("num_warps", "num_stages", "num_ctas", "maxnreg")
               if getattr(md, k, None) != defaults.get(k) and k not in names}
    # parameters named like compile options (the tutorial's num_stages) go by keyword, so that
    # they set the option as well, as when the kernel was compiled
    first = next((i for i, p in enumerate(jit.params) if p.name in tc.option_names(90)),
                 len(jit.params))
    return Warmup(jit, handle, constexprs, options, first)


def launch_handle(info: Warmup, grid: tuple, args: tuple) -> None:
    """A launch through a compiled handle, ``handle[grid](*args)``, made as the equivalent
    ``kernel[grid](...)`` call shaped like the warmup call (same positional prefix, keywords and
    options, hence the same compile options), so that capture and trace record it like any
    launch. The handle takes every parameter positionally; constexprs are those it was compiled
    with."""
    names = [p.name for p in info.jit.params]
    if len(args) != len(names):
        raise CaptureError(
            f"kernel {kernel_name(info.jit)}: the compiled handle was launched with {len(args)} "
            f"arguments but the kernel has {len(names)} parameters (a compiled kernel takes every "
            f"parameter positionally, constexprs included)")
    values = {**dict(zip(names, args)), **info.constexprs}
    positional = [values[n] for n in names[:info.positional]]
    keywords = {n: values[n] for n in names[info.positional:]}
    info.jit.run(*positional, grid=tuple(grid), warmup=False, **keywords, **info.options)


def _warmup(jit_fn: Any, handle: Any, args: tuple, kwargs: dict) -> Warmup:
    params = tc.bind_params(jit_fn, args, kwargs)
    names = {p.name for p in jit_fn.params}
    constexprs = {p.name: params[p.name] for p in jit_fn.params if p.is_constexpr}
    options = {k: v for k, v in kwargs.items() if k not in names}
    return Warmup(jit_fn, handle, constexprs, options, len(args))


class _Recorder:
    """Holds the state of one capture while the forward runs with Triton patched."""

    def __init__(self, arch: int, native: bool, autotune: dict[str, dict] | None) -> None:
        self.arch = arch
        self.native = native
        self.autotune = autotune or {}
        self.launches = CapturedLaunches()
        self.benchmarking = 0
        self.fake_timing = 0
        self.in_triton = 0  # inside Triton's own JITFunction.run (its launches are its own)

    def _triton(self, orig: Callable, *args: Any, **kwargs: Any) -> Any:
        self.in_triton += 1
        try:
            return orig(*args, **kwargs)
        finally:
            self.in_triton -= 1

    # JITFunction.run
    def run(self, orig: Callable, jit_fn: Any, args: tuple, grid: Any, warmup: bool, kwargs: dict) -> Any:
        if self.benchmarking:
            return self._triton(orig, jit_fn, *args, grid=grid, warmup=warmup, **kwargs)
        if warmup:
            return self.warmup(orig, jit_fn, args, grid, kwargs)
        kernel = kernel_name(jit_fn)
        args, kwargs = tensor_likes.replace(  # same pointers, as views of the storage they point into
            [p.name for p in jit_fn.params], args, kwargs,
            lambda obj, name: tensor_likes.eager_view(obj, kernel, name))
        params = tc.bind_params(jit_fn, args, kwargs)
        check_arguments(jit_fn, params)
        try:
            _, specialization, options = tc.binder_for(jit_fn, self.arch)(*args, **kwargs)
        except Exception as exc:
            raise _binder_failure(jit_fn, params, exc) from exc
        # Triton compiles with backend.parse_options(kwargs): a keyword naming a compile option
        # sets it even when it also names a parameter (the softmax tutorial's num_stages).
        options = {**{k: v for k, v in kwargs.items()
                      if k in params and k in tc.option_names(self.arch)}, **options}
        grid_value = grid(params) if callable(grid) else grid
        concrete = _normalize_grid(grid_value, kernel, _concrete(kernel))
        if self.native:
            handle = self._triton(orig, jit_fn, *args, grid=grid, warmup=False, **kwargs)
        else:
            interpret_launch(jit_fn, args, kwargs, concrete, specialization)
            handle = self._launched_handle(jit_fn, params, options)
        self.launches.append(CapturedLaunch(jit_fn, params, list(specialization), dict(options), concrete))
        return handle

    def _launched_handle(self, jit_fn: Any, params: dict, options: dict) -> InterpretedHandle:
        """What JITFunction.run returns on a CPU-only host: a handle that launches the same
        binary again (libraries cache it, then launch ``handle[grid](*args)`` themselves)."""
        handle = InterpretedHandle(jit_fn)
        constexprs = {p.name: params[p.name] for p in jit_fn.params if p.is_constexpr}
        first = next((i for i, p in enumerate(jit_fn.params) if p.name in tc.option_names(self.arch)),
                     len(jit_fn.params))
        handle.record = Warmup(jit_fn, handle, constexprs, dict(options), first)
        return handle

    # JITFunction.run(..., warmup=True), what kernel.warmup(...) calls
    def warmup(self, orig: Callable, jit_fn: Any, args: tuple, grid: Any, kwargs: dict) -> Any:
        if self.native:
            handle = self._triton(orig, jit_fn, *args, grid=grid, warmup=True, **kwargs)
        else:
            handle = InterpretedHandle(jit_fn)
        record = _warmup(jit_fn, handle, args, kwargs)
        if not self.native:
            handle.record = record
        self.launches.warmups.append(record)
        return handle

    # CompiledKernel.run / InterpretedHandle.run: a launch through a warmed-up handle
    def handle_run(self, handle: Any, grid_0: Any, grid_1: Any, grid_2: Any, *rest: Any) -> None:
        launch_handle(handle_info(handle, self.launches.warmups), (grid_0, grid_1, grid_2),
                      rest[6:])

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
            # Triton's disk cache of timings (cache_results=True) needs an active driver to key
            # it and would hand back a GPU's choice over the override: neither applies here.
            saved, tuner.cache = tuner.cache, {}
            saved_disk, tuner.cache_results = tuner.cache_results, False
            self.fake_timing = 0
            try:
                ret = orig(tuner, *args, **kwargs)
            finally:
                tuner.cache, tuner.cache_results = saved, saved_disk
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
            _patched(tc.Autotuner, "_bench", bench), \
            patched_handles(lambda: not recorder.in_triton, recorder.handle_run):
        yield recorder


@contextlib.contextmanager
def patched_handles(ours: Callable[[], bool], handle_run: Callable) -> Iterator[None]:
    """Launches through warmed-up handles (``compiled[grid](...)``, ``compiled.run(...)``) go to
    ``handle_run(handle, grid_0, grid_1, grid_2, stream, ...launcher args..., *args)`` while
    ``ours()``; Triton's own launches (inside JITFunction.run) stay untouched."""
    launcher = CompiledKernel.__dict__["run"]

    def compiled_run(kernel: Any) -> Callable:
        return functools.partial(handle_run, kernel) if ours() else launcher.__get__(kernel)

    def interpreted_run(handle: Any, *args: Any) -> None:
        handle_run(handle, *args)

    with _patched(CompiledKernel, "run", property(compiled_run)), \
            _patched(InterpretedHandle, "run", interpreted_run):
        yield


def _devices(inputs: tuple) -> set[str]:
    return {t.device.type for t in inputs if isinstance(t, torch.Tensor)}


_CUDA_ONLY = ("cuda", "CUDA", "Torch not compiled with", "device=", "on the CPU", "cpu", "CPU",
              "No device", "driver")


def _forward_failure(exc: BaseException, native: bool) -> CaptureError:
    """The model's own code raised during the eager forward: one line naming where."""
    frames = traceback.extract_tb(exc.__traceback__)
    skip = ("/kernel_lens/", "/torch/", "/triton/")  # the user's or the library's own frame
    user = [f for f in frames if not any(part in f.filename for part in skip)] or frames
    where = f" at {user[-1].filename}:{user[-1].lineno} (in {user[-1].name})" if user else ""
    text = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    hint = ""
    if not native and any(word in text for word in _CUDA_ONLY):
        hint = ("; on a CPU-only host kernel_lens runs the kernels through Triton's interpreter "
                "on CPU tensors, but this code needs a CUDA device: capture on a GPU (example "
                "inputs on 'cuda')")
    return CaptureError(f"the model's forward raised {type(exc).__name__}: {text}{where}{hint}")


def capture(model: Callable, example_inputs: tuple, arch: int,
            autotune: dict[str, dict] | None = None,
            after_launch: Callable[[CapturedLaunch], None] | None = None,
            launches_needed: bool = True) -> Capture:
    """Run ``model(*example_inputs)`` once, recording every Triton launch in program order
    (``after_launch`` is called with each right after it ran). A forward that launches none is
    refused unless ``launches_needed`` is false (an extra example whose branch launches none)."""
    devices = _devices(example_inputs)
    native = "cuda" in devices
    if native and devices != {"cuda"}:
        raise CaptureError(f"example inputs mix devices {devices}; put them all on one device")
    recorder = _Recorder(arch, native, autotune)
    recorder.launches.after_launch = after_launch
    launcher_log = launchers.LauncherLog()
    with recording(recorder), launchers.capturing(launcher_log, recorder.launches), \
            data_values.recording(recorder.launches.data_log), torch.no_grad(), \
            torch.compiler.set_stance("force_eager"):  # a @torch.compile'd helper runs as written
        try:
            outputs = model(*example_inputs)
        except KernelLensError:
            raise
        except Exception as exc:
            raise _forward_failure(exc, native) from exc
    if not recorder.launches and launches_needed:
        raise CaptureError("the forward launched no @triton.jit kernel; nothing to compile")
    recorder.launches.launchers = launcher_log
    return Capture(recorder.launches, outputs, native)
