"""The few Triton internals kernel_lens relies on, reached in one place.

Triton's own binder decides argument types and specialization; using it (rather than a copy
of its rules) keeps our binaries identical to what Triton's JIT would launch.
"""

from __future__ import annotations

import functools
from typing import Any

from triton.backends.compiler import GPUTarget
from triton.compiler import make_backend
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction, create_function_from_signature

__all__ = ["Autotuner", "Heuristics", "JITFunction", "backend_for", "binder_for", "bind_params",
           "target_for"]


def target_for(arch: int) -> GPUTarget:
    return GPUTarget("cuda", arch, 32)


@functools.lru_cache(maxsize=None)
def backend_for(arch: int) -> Any:
    return make_backend(target_for(arch))


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


def is_constexpr_param(jit_fn: JITFunction, name: str) -> bool:
    return any(p.name == name and p.is_constexpr for p in jit_fn.params)

