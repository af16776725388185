"""kernel_lens: compile PyTorch models with custom Triton kernels for ONNX Runtime and TensorRT.

Public API: :func:`compile`, :class:`CompiledModel`, :class:`PassManager`, :class:`Pass`,
the IR (:mod:`kernel_lens.ir`) and the typed errors (:mod:`kernel_lens.errors`).
"""

from .errors import KernelLensError
from .version import __version__


def __getattr__(name: str):
    # Heavy imports (torch, triton) only when the API is used, so `--version` stays instant.
    if name in ("compile", "CompiledModel", "load", "lift"):
        from . import compiler  # lazy: torch and triton (seconds to import)
        return getattr(compiler, name)
    if name in ("PassManager", "Pass", "PassContext", "PassResult", "default_pipeline"):
        from . import passes  # lazy: the IR (pydantic, sympy)
        return getattr(passes, name)
    if name == "GraphIR":
        from .ir import GraphIR  # lazy: pydantic, sympy
        return GraphIR
    if name in ("register_target", "Target", "available_targets"):
        from .targets import base  # lazy: the IR (pydantic, sympy)
        return getattr(base, name)
    raise AttributeError(f"module 'kernel_lens' has no attribute {name!r}")


__all__ = ["CompiledModel", "GraphIR", "KernelLensError", "Pass", "PassContext", "PassManager",
           "PassResult", "Target", "available_targets", "compile", "default_pipeline", "lift",
           "load", "register_target", "__version__"]
