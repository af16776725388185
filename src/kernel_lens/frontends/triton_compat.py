"""The few Triton internals kernel_lens relies on, reached in one place.

Triton's own binder decides argument types and specialization; using it (rather than a copy
of its rules) keeps our binaries identical to what Triton's JIT would launch.
"""

from __future__ import annotations

import ast
import functools
import inspect
from typing import Any

import numpy as np
import torch
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.language.extra import libdevice
from triton.language.extra import cuda as cuda_extra
from triton.language.extra.cuda import gdc
from triton.language.extra.cuda import libdevice as cuda_libdevice
from triton.runtime import interpreter
from triton.runtime.jit import JITFunction, KernelInterface, create_function_from_signature

from ..ir.types import dtype_from_triton, torch_name

__all__ = ["Autotuner", "Heuristics", "JITFunction", "backend_for", "binder_for", "bind_params",
           "interpreter_scalar", "is_scalar_type", "libdevice_modules", "libdevice_symbols",
           "target_for"]


def target_for(arch: int) -> GPUTarget:
    return GPUTarget("cuda", arch, 32)


@functools.lru_cache(maxsize=None)
def backend_for(arch: int) -> Any:
    return make_backend(target_for(arch))


@functools.lru_cache(maxsize=None)
def option_names(arch: int) -> frozenset[str]:
    """Names of Triton's compile options (num_warps, num_stages, maxnreg, ...) for ``arch``."""
    return frozenset(vars(backend_for(arch).parse_options({})))


_binders: dict[tuple[int, int], Any] = {}


def binder_for(jit_fn: JITFunction, arch: int) -> Any:
    """Triton's binder: (*args, **kwargs) -> (bound params, [(type, spec key)], options)."""
    key = (id(jit_fn), arch)
    if key not in _binders:
        _binders[key] = create_function_from_signature(jit_fn.signature, jit_fn.params,
                                                       backend_for(arch))
    return _binders[key]


def bind_params(jit_fn: JITFunction, args: tuple, kwargs: dict) -> dict[str, Any]:
    """Bind launch arguments to the kernel's parameters (defaults applied), ignoring options."""
    names = {p.name for p in jit_fn.params}
    bound = jit_fn.signature.bind(*args, **{k: v for k, v in kwargs.items() if k in names})
    bound.apply_defaults()
    return dict(bound.arguments)


def bind_partial_names(jit_fn: JITFunction, args: tuple, kwargs: dict) -> list[str]:
    """The parameters a launch's own arguments give (positionally or by keyword)."""
    names = [p.name for p in jit_fn.params]
    return names[:len(args)] + [k for k in kwargs if k in names]


def is_constexpr_param(jit_fn: JITFunction, name: str) -> bool:
    return any(p.name == name and p.is_constexpr for p in jit_fn.params)



def is_scalar_type(ty: object) -> bool:
    """Whether a binder signature type names a scalar ('i32', 'u64', 'fp32', 'u1', ...), not a
    pointer ('*fp32'), a folded 'constexpr' or a tuple/descriptor type."""
    return isinstance(ty, str) and ty != "constexpr" and not ty.startswith(("*", "tensordesc"))


def interpreter_scalar(ty: str, value: Any) -> Any:
    """A scalar launch argument as Triton's interpreter should hold it: a ``tl.tensor`` of the
    binder's signature type ``ty`` over a one-element numpy array of that type.

    Triton 3.6's interpreter leaves Python floats as floats (so ``eps.to(tl.float32)`` fails),
    stores bools in int32 data typed int1 (a ValueError) and ints in [2**31, 2**32) in uint32
    data typed i64, and ignores annotations (``x: tl.float64``, ``n: tl.uint32``). Values that
    are not bool/int/float (None) are returned unchanged. Raises ValueError when ``value`` does
    not fit ``ty``.
    """
    if not isinstance(value, (bool, int, float)):
        return value
    tt = tl.str_to_ty(ty, None)
    np_dtype = interpreter._get_np_dtype(tt)
    if tt.is_int1():
        data = np.array([bool(value)], dtype=np_dtype)
    elif tt.is_int():
        info = np.iinfo(np_dtype)
        if not info.min <= int(value) <= info.max:
            raise ValueError(f"does not fit its Triton type {ty} [{info.min}, {info.max}]")
        data = np.array([int(value)], dtype=np_dtype)
    elif tt.is_floating() and np.issubdtype(np_dtype, np.floating):
        with np.errstate(over="ignore"):  # a GPU launch rounds to +-inf as well
            data = np.array([float(value)], dtype=np_dtype)
    elif tt.is_floating():  # bf16 / fp8: the interpreter stores their bits
        t = torch.tensor([float(value)], dtype=getattr(torch, torch_name(dtype_from_triton(ty))))
        data = t.view(getattr(torch, f"uint{t.element_size() * 8}")).numpy().astype(np_dtype)
    else:
        return value
    return tl.tensor(interpreter.TensorHandle(data, tt), tt)


# --- libdevice: where Triton keeps it (the CPU evaluation is :mod:`.libdevice_cpu`) ---------

def libdevice_modules() -> tuple[Any, Any]:
    """(backend-neutral stub module, CUDA libdevice module) of the installed Triton."""
    return libdevice, cuda_libdevice


def cuda_extra_modules() -> tuple[Any, Any]:
    """(``triton.language.extra.cuda``, its grid dependency control module ``gdc``): where
    ``gdc_wait`` / ``gdc_launch_dependents`` are defined and re-exported."""
    return cuda_extra, gdc


@functools.lru_cache(maxsize=None)
def libdevice_symbols() -> dict[str, str]:
    """CUDA libdevice symbol ('__nv_tanhf') -> the libdevice function dispatching to it ('tanh'),
    read off Triton's CUDA wrappers."""
    tree = ast.parse(inspect.getsource(libdevice_modules()[1]))
    return {node.value: fn.name for fn in tree.body if isinstance(fn, ast.FunctionDef)
            for node in ast.walk(fn)
            if isinstance(node, ast.Constant) and str(node.value).startswith("__nv_")}
