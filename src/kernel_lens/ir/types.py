"""Element and scalar types, named the way Triton names them, with their torch and C spellings."""

from __future__ import annotations

from enum import Enum

from ..errors import UnsupportedKernelError


class DType(str, Enum):
    """Element type of a tensor or exact type of a scalar parameter (Triton's names)."""

    i1 = "i1"
    i8 = "i8"
    i16 = "i16"
    i32 = "i32"
    i64 = "i64"
    u8 = "u8"
    u16 = "u16"
    u32 = "u32"
    u64 = "u64"
    fp8e4nv = "fp8e4nv"
    fp8e5 = "fp8e5"
    fp16 = "fp16"
    bf16 = "bf16"
    fp32 = "fp32"
    fp64 = "fp64"

    @property
    def c_type(self) -> str:
        return _C_TYPES[self]

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self.value.startswith(("fp", "bf"))


_C_TYPES = {
    DType.i1: "bool", DType.i8: "int8_t", DType.i16: "int16_t", DType.i32: "int32_t",
    DType.i64: "int64_t", DType.u8: "uint8_t", DType.u16: "uint16_t", DType.u32: "uint32_t",
    DType.u64: "uint64_t", DType.fp8e4nv: "uint8_t", DType.fp8e5: "uint8_t",
    DType.fp16: "uint16_t", DType.bf16: "uint16_t", DType.fp32: "float", DType.fp64: "double",
}
_ITEMSIZE = {
    DType.i1: 1, DType.i8: 1, DType.i16: 2, DType.i32: 4, DType.i64: 8, DType.u8: 1,
    DType.u16: 2, DType.u32: 4, DType.u64: 8, DType.fp8e4nv: 1, DType.fp8e5: 1, DType.fp16: 2,
    DType.bf16: 2, DType.fp32: 4, DType.fp64: 8,
}

# torch dtype name (str(torch.float16) without the "torch." prefix) -> DType.
_TORCH_NAMES = {
    "bool": DType.i1, "int8": DType.i8, "int16": DType.i16, "int32": DType.i32,
    "int64": DType.i64, "uint8": DType.u8, "uint16": DType.u16, "uint32": DType.u32,
    "uint64": DType.u64, "float8_e4m3fn": DType.fp8e4nv, "float8_e5m2": DType.fp8e5,
    "float16": DType.fp16, "bfloat16": DType.bf16, "float32": DType.fp32, "float64": DType.fp64,
}
_TORCH_BY_DTYPE = {v: k for k, v in _TORCH_NAMES.items()}


def dtype_from_torch(torch_dtype: object) -> DType:
    name = str(torch_dtype).removeprefix("torch.")
    try:
        return _TORCH_NAMES[name]
    except KeyError:
        raise UnsupportedKernelError(
            f"tensor dtype {name} is not supported; supported: {', '.join(_TORCH_NAMES)}"
        ) from None


def torch_name(dtype: DType) -> str:
    """The torch attribute name of a DType (``torch.<name>``)."""
    return _TORCH_BY_DTYPE[dtype]


def dtype_from_triton(name: str) -> DType:
    """Map a Triton signature type ('fp32', '*fp16', 'i32', 'u1') to a DType."""
    name = name.lstrip("*k")
    if name == "u1":
        return DType.i1
    try:
        return DType(name)
    except ValueError:
        raise UnsupportedKernelError(f"Triton type {name!r} is not supported") from None
