"""Kernels reached through other doors than ``kernel[grid](...)``: a library-style launch wrapper
(a ``triton.runtime.KernelInterface`` subclass doing host work on tensors), and the two patterns
PyTorch documents for Triton kernels (``torch.library.triton_op`` + ``wrap_triton``, and a
``torch.library.custom_op`` whose body launches a kernel)."""

import torch
import triton
import triton.language as tl
from torch.library import custom_op, triton_op, wrap_triton


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, s, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * s, mask=m)


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) + tl.load(y_ptr + i, mask=m), mask=m)


class CachingLauncher(triton.runtime.KernelInterface):
    """As FlagGems' LibEntry does: a cache key from ``data_ptr()`` alignment, strides and dtypes,
    the compiled kernel cached on the first call and launched through its handle afterwards."""

    def __init__(self, fn, alter=None, twice=False):
        self.fn = fn
        self.cache = {}
        self.alter = alter  # test hook: change an argument before launching (not faithful)
        self.twice = twice  # test hook: launch twice per call (not bypassable)

    def run(self, *args, **kwargs):
        grid = kwargs["grid"]
        key = tuple((a.dtype, a.data_ptr() % 16 == 0, tuple(a.stride())) if hasattr(a, "data_ptr")
                    else a for a in args)
        if self.alter is not None:
            args = self.alter(args)
        if self.twice:
            self.fn.run(*args, **kwargs)
        if key not in self.cache:
            self.cache[key] = self.fn.run(*args, **kwargs)
            return self.cache[key]
        kernel = self.cache[key]
        kernel[tuple(grid) + (1,) * (3 - len(grid))](*args, kwargs["BLOCK"])
        return kernel


scale = CachingLauncher(scale_kernel)


class WrapperModel(torch.nn.Module):
    """Two launches through the caching launcher: the second hits its compiled-kernel cache."""

    def __init__(self, launcher=scale):
        super().__init__()
        self.launcher = launcher

    def forward(self, x):
        a, b = torch.empty_like(x), torch.empty_like(x)
        n = x.numel()
        self.launcher[(triton.cdiv(n, 64),)](x, a, n, 2.0, BLOCK=64)
        self.launcher[(triton.cdiv(n, 64),)](a, b, n, 3.0, BLOCK=64)
        return b


@triton_op("kl_tests::add_triton_op", mutates_args={})
def add_triton_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    wrap_triton(add_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


@custom_op("kl_tests::add_custom_op", mutates_args=(), device_types="cuda")
def add_custom_op(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


@add_custom_op.register_fake
def _(x, y):
    return torch.empty_like(x)


@custom_op("kl_tests::scale_inplace", mutates_args=("x",))
def scale_inplace(x: torch.Tensor, s: float) -> None:
    n = x.numel()
    scale_kernel[(triton.cdiv(n, 64),)](x, x, n, s, BLOCK=64)


class TorchLibraryModel(torch.nn.Module):
    """A triton_op, a CUDA-only custom_op and a mutating custom_op, with torch ops between."""

    def forward(self, x, y):
        z = add_custom_op(add_triton_op(x, y), y) * 2
        scale_inplace(z, 0.5)
        return z + 1


class WrapTritonModel(torch.nn.Module):
    """``wrap_triton`` called directly in forward (the torch.compile idiom)."""

    def forward(self, x, y):
        out = torch.empty_like(x)
        n = x.numel()
        wrap_triton(add_kernel)[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
        return out


_lib = torch.library.Library("kl_tests_opaque", "DEF")
_lib.define("add(Tensor x, Tensor y) -> Tensor")


def _opaque_add(x, y):
    out = torch.empty_like(x)
    n = x.numel()
    add_kernel[(triton.cdiv(n, 64),)](x, y, out, n, BLOCK=64)
    return out


_lib.impl("add", _opaque_add, "CPU")
_lib.impl("add", lambda x, y: torch.empty_like(x), "Meta")


class OpaqueOpModel(torch.nn.Module):
    """An op defined with ``Library.impl``: its body is not reachable from Python, so torch.export
    sees an opaque node."""

    def forward(self, x, y):
        return torch.ops.kl_tests_opaque.add(x, y)


class StridedBuffer:
    """As FlagGems' StridedBuffer: a tensor reinterpreted with its own shape, strides and offset
    (in elements); Triton takes it as a pointer through ``data_ptr()`` and ``dtype``."""

    def __init__(self, base, shape=None, strides=None, offset=0):
        self._base = base
        self.dtype = base.dtype
        self.offset = offset
        self._data_ptr = base.data_ptr() + offset * base.element_size()
        self.shape = tuple(shape if shape is not None else base.shape)
        self._strides = tuple(strides if strides is not None else base.stride())

    def data_ptr(self):
        return self._data_ptr

    def stride(self):
        return self._strides


class TensorLikeModel(torch.nn.Module):
    """The second half of ``x`` scaled into the first half of ``out``, both through
    StridedBuffers (the offset is computed from the size), launched through the caching
    launcher (which keys its cache on ``data_ptr()``)."""

    def forward(self, x):
        out = torch.zeros_like(x)
        half = x.shape[0] // 2
        src = StridedBuffer(x, shape=(half,), offset=half)
        dst = StridedBuffer(out, shape=(half,))
        scale[(triton.cdiv(half, 64),)](src, dst, half, 2.0, BLOCK=64)
        return out


class KeyedAutotuner(triton.runtime.Autotuner):
    """As fla's CachedAutotuner: a library's Autotuner subclass whose ``run`` looks up a config
    cache keyed on the arguments (here on ``data_ptr()``), then runs Triton's autotuner."""

    seen = []

    def run(self, *args, **kwargs):
        self.seen.append(tuple(a.data_ptr() % 16 for a in args if hasattr(a, "data_ptr")))
        return super().run(*args, **kwargs)


def _keyed_autotune(fn):
    return KeyedAutotuner(fn, fn.arg_names, [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128})],
                          key=["n"], reset_to_zero=None, restore_value=None)


scale_tuned = _keyed_autotune(scale_kernel)


class AutotunerSubclassModel(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        scale_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
        return out


cached_tuned = CachingLauncher(_keyed_autotune(scale_kernel))  # FlagGems: LibEntry(LibTuner(jit))


class WrappedAutotunerSubclassModel(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        cached_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
        return out


class OwnTuner(triton.runtime.Autotuner):
    """As FlagGems' LibTuner: an Autotuner subclass whose ``run`` picks the config itself (here
    the last one) and launches without Triton's Autotuner.run."""

    def run(self, *args, **kwargs):
        config = self.configs[-1]
        self.best_config = config
        return self.fn.run(*args, **kwargs, **config.all_kwargs())


own_tuned = CachingLauncher(OwnTuner(scale_kernel, scale_kernel.arg_names,
                                     [triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 128}, num_warps=8)],
                                     key=["n"], reset_to_zero=None, restore_value=None))


class OwnTunerModel(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        own_tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, out, n, 3.0)
        return out
