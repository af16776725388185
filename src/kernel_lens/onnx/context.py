"""What a translator may ask of the lowering, and ONNX's dtype codes.

The lowering loop (:mod:`kernel_lens.onnx.lower`) calls the ATen table
(:mod:`kernel_lens.onnx.aten`) and the torchlib bridge (:mod:`kernel_lens.onnx.torchlib`) with
itself as the context; they see it through :class:`LoweringContext` and import this module,
never the loop, so imports run one way: lower -> aten, torchlib -> context.
"""

from __future__ import annotations

from typing import Any, Protocol, Union

import onnx
import sympy
from onnx import TensorProto, helper

from ..errors import SymbolicError
from ..ir.graph import OpArg, TensorValue, TorchOp
from ..ir.symbolic import parse
from ..ir.types import DType

DOMAIN = "kernel_lens"  # the domain of launch nodes (the custom ops kernel_lens generates)
DOMAIN_VERSION = 1
# A run-time check on sizes from tensor values (IR ``checks``): input a [1] bool, attribute
# ``message``; the call fails with the message where it is false. Output: a tensor of no elements.
CHECK_OUTPUT = "kernel_lens_check."  # its output's name: this, then the check's position
CHECK_OP = "KernelLensCheck"  # (no kernel id may be this: the lowering refuses one)

ONNX_DTYPES: dict[DType, int] = {
    DType.i1: TensorProto.BOOL, DType.i8: TensorProto.INT8, DType.i16: TensorProto.INT16,
    DType.i32: TensorProto.INT32, DType.i64: TensorProto.INT64, DType.u8: TensorProto.UINT8,
    DType.u16: TensorProto.UINT16, DType.u32: TensorProto.UINT32, DType.u64: TensorProto.UINT64,
    DType.fp8e4nv: TensorProto.FLOAT8E4M3FN, DType.fp8e5: TensorProto.FLOAT8E5M2,
    DType.fp16: TensorProto.FLOAT16, DType.bf16: TensorProto.BFLOAT16,
    DType.fp32: TensorProto.FLOAT, DType.fp64: TensorProto.DOUBLE,
}


def onnx_dtype(dtype: DType) -> int:
    """The ONNX element type code of an IR dtype."""
    return ONNX_DTYPES[DType(dtype)]


def value_info(name: str, dtype: DType, shape: list[str]) -> onnx.ValueInfoProto:
    """A tensor's value info: a literal dim is a ``dim_value``, anything else a ``dim_param``
    spelled as the IR spells it (a plain symbol is its own name)."""
    info = helper.make_tensor_value_info(name, onnx_dtype(dtype), [None] * len(shape))
    for dim, text in zip(info.type.tensor_type.shape.dim, shape):
        try:
            expr = parse(str(text))
        except SymbolicError:
            expr = None
        if expr is not None and expr.is_Integer:
            dim.dim_value = int(expr)
        else:
            dim.dim_param = str(text)
    return info


class LoweringContext(Protocol):
    """The lowering's state as translators use it (implemented by ``lower.Lowering``)."""

    opset: int
    nodes: list[Any]  # the nodes made so far, in order
    constant_farm: dict[Any, Any]  # torchlib constants, shared by every op

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, *, domain: str = "",
             outputs: list[str] | None = None, **attrs: Any) -> Union[str, list[str]]: ...
    def i64(self, values: list[int]) -> str: ...
    def scalar(self, value: Any, dtype: DType) -> str: ...
    def full(self, shape: str, value: Any, dtype: DType) -> str: ...
    def cast(self, name: str, src: DType, dst: DType) -> str: ...
    def scalar_of(self, name: str) -> str: ...
    def sym(self, expr: Union[str, sympy.Expr]) -> str: ...
    def expr(self, text: str) -> sympy.Expr: ...
    def expr_arg(self, arg: OpArg) -> sympy.Expr: ...
    def int1(self, arg: OpArg) -> str: ...
    def int0(self, arg: OpArg) -> str: ...
    def concat_ints(self, parts: list[str]) -> str: ...
    def shape(self, value: Union[TensorValue, str]) -> str: ...
    def value_of(self, arg: Union[OpArg, str]) -> TensorValue: ...
    def out(self, op: TorchOp, i: int = 0) -> TensorValue: ...
    def tensor(self, arg: Union[OpArg, str]) -> str: ...
    def add_recorded(self, nodes: list[Any], functions: dict[Any, Any]) -> None: ...
    def stop_unless(self, cond: str, message: str) -> None: ...
