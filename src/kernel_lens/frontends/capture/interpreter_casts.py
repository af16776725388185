"""Float conversions of Triton's interpreter, rounded as a GPU rounds them.

Triton 3.6's interpreter converts to and from bf16 and the fp8 types bit by bit
(``interpreter._convert_float``): it truncates fp32 -> bf16, turns fp64 -> bf16 into garbage
(``astype`` of the bit pattern), and its round-to-nearest loses the carry into the exponent (an
fp32 0.49 becomes fp8 e4m3 0.25). A capture on a CPU-only host computes the eager forward's
values with it, so a later kernel or torch op would see wrong inputs. Here every conversion
between two float types torch also has goes through torch, which rounds to nearest even as the
GPU's ``cvt.rn`` does; conversions to fp8 saturate to the largest finite value first, as
Triton's ``cvt.rn.satfinite`` does. Round-toward-zero (``fp_downcast_rounding="rtz"``) and the
fp8 types torch lacks keep the interpreter's own code.

``tl.dot`` of bf16 operands multiplies their bit patterns as integers (numpy has no bf16; the
interpreter keeps bf16 as uint16 and matmuls that): garbage, and the same garbage on both sides
of a CPU comparison, so it would pass as a check. Here such operands are widened to fp32 first
(exactly: a bf16 value is an fp32 value), as a GPU's tensor cores multiply them, and the products
accumulate in the accumulator's type.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import numpy as np
import torch
import triton.language as tl
from triton.runtime import interpreter

from .patching import patched

_TORCH = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32,
          "fp64": torch.float64, "fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2,
          "fp8e4b8": torch.float8_e4m3fnuz, "fp8e5b16": torch.float8_e5m2fnuz}
# bf16 and the fp8 types live in the interpreter as their bits (numpy has none of them)
_AS_BITS = {torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz,
            torch.float8_e5m2fnuz}


def _torch_dtype(ty: Any) -> torch.dtype | None:
    return _TORCH.get(getattr(ty, "name", None)) if isinstance(ty, tl.dtype) and ty.is_floating() else None


def convert(data: np.ndarray, src: Any, dst: Any) -> np.ndarray | None:
    """``data`` (the interpreter's representation of ``src`` values) converted to ``dst``, in
    the interpreter's representation of ``dst``; None when torch lacks one of the types."""
    source, target = _torch_dtype(src), _torch_dtype(dst)
    if source is None or target is None:
        return None
    array = np.ascontiguousarray(data)
    if source in _AS_BITS:
        values = torch.from_numpy(array.view(f"uint{8 * source.itemsize}").copy()).view(source)
    else:
        values = torch.from_numpy(array.copy())
    if target.itemsize == 1:  # satfinite: clamp to the largest finite fp8 value, keep nan
        top = torch.finfo(target).max
        values = torch.where(values.isnan(), values, values.clamp(-top, top))
    out = values.to(target)
    if target in _AS_BITS:
        return out.view(getattr(torch, f"uint{8 * target.itemsize}")).numpy()
    return out.numpy()


def _cast_impl(orig: Any) -> Any:
    def cast_impl(self: Any, src: Any, dst_type: Any) -> Any:
        data = convert(src.data, src.dtype.scalar, dst_type.scalar)
        if data is None:
            return orig(self, src, dst_type)
        return interpreter.TensorHandle(data, dst_type.scalar)
    return cast_impl


def _fp_to_fp(orig: Any) -> Any:
    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        rtz = rounding_mode is not None and "RTZ" in str(rounding_mode)
        data = None if rtz else convert(src.data, src.dtype.scalar, dst_type.scalar)
        if data is None:
            return orig(self, src, dst_type, rounding_mode)
        return interpreter.TensorHandle(data, dst_type.scalar)
    return create_fp_to_fp


def _widened(data: np.ndarray, ty: Any) -> np.ndarray:
    """bf16 operand bits as the fp32 values they are (other types as they are)."""
    if getattr(ty, "name", None) != "bf16":
        return data
    return (np.ascontiguousarray(data).astype(np.uint32) << 16).view(np.float32)


def _dot(orig: Any) -> Any:
    def create_dot(self: Any, a: Any, b: Any, d: Any, input_precision: Any, max_num_imprecise_acc: Any) -> Any:
        if "bf16" not in (getattr(a.dtype, "name", None), getattr(b.dtype, "name", None)):
            return orig(self, a, b, d, input_precision, max_num_imprecise_acc)
        acc = d.data.dtype
        product = np.matmul(_widened(a.data, a.dtype), _widened(b.data, b.dtype)).astype(acc)
        return interpreter.TensorHandle(product + d.data, d.dtype.scalar)
    return create_dot


@contextlib.contextmanager
def rounded_casts() -> Iterator[None]:
    """While active, the interpreter's float conversions round as a GPU's do, and bf16
    ``tl.dot`` multiplies values, not bit patterns (module docstring)."""
    builder = interpreter.InterpreterBuilder
    with patched(builder, "cast_impl", _cast_impl(builder.cast_impl)), \
            patched(builder, "create_fp_to_fp", _fp_to_fp(builder.create_fp_to_fp)), \
            patched(builder, "create_dot", _dot(builder.create_dot)):
        yield
