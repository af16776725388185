"""ATen → standard ONNX: one small function per ATen overload, registered in :data:`TRANSLATIONS`.

Each translator receives the lowering context (:class:`kernel_lens.onnx.lower.Lowering`) and the
:class:`~kernel_lens.ir.graph.TorchOp`, and returns one ONNX tensor name per ``op.outputs``. It
reads its tensor inputs with ``ctx.tensor(arg)`` (the value at this point of the program: the
latest version of its root, views re-derived from it) and its integer arguments with
``ctx.int1(arg)`` / ``ctx.sym(expr)``, which compute symbolic sizes at run time from the graph
inputs' dims: nothing is baked from the capture sizes. Result dtypes and shapes come from the IR's
values (``ctx.out(op)``), so torch's type promotion and ``-1`` sizes are already resolved.

Translators raise :class:`~kernel_lens.errors.UnsupportedKernelError` (without position: the
lowering adds it) for argument combinations ONNX cannot express.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable

import sympy

from ..errors import UnsupportedKernelError
from ..ir.graph import ConstArg, ListArg, OpArg, SymArg, TorchOp, ValueArg
from ..ir.types import DType

if TYPE_CHECKING:  # pragma: no cover
    from .lower import Lowering

Translator = Callable[["Lowering", TorchOp], list[str]]

TRANSLATIONS: dict[str, Translator] = {}
"""ATen overload name ('aten.add.Tensor') -> translator."""

INVERSE_VIEWS: dict[str, Callable[["Lowering", TorchOp, str], str]] = {}
"""View ops through which an in-place torch op can write: (ctx, view op, new contents of the
view) -> new contents of the view's source. Whole-source views (reshape-like, transpose-like)
map the values back; slice (step 1) and select splice them into the source's current contents."""

ALLOCATING = frozenset({"aten.empty_like.default", "aten.empty.memory_format",
                        "aten.empty_strided.default", "aten.new_empty.default",
                        "aten.new_empty_strided.default", "aten.empty.default"})
"""Ops whose result has undefined contents: never emitted by themselves. A launch that fully
writes the buffer produces it; any other reader sees zeros (ConstantOfShape)."""

TRUE_VIEWS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.transpose.int", "aten.t.default",
    "aten.permute.default", "aten.slice.Tensor", "aten.select.int", "aten.unsqueeze.default",
    "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.expand.default",
    "aten.alias.default", "aten.detach.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.chunk.default", "aten.unbind.int", "aten.narrow.default",
    "aten.as_strided.default", "aten.unflatten.int", "aten.view_as.default",
})
"""Ops that always return a view of their input (their memory *is* the input's)."""

MAY_ALIAS = frozenset({
    "aten.reshape.default", "aten.contiguous.default", "aten.flatten.using_ints",
    "aten.reshape_as.default", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device",
    "aten.to.other", "aten.type_as.default",
})
"""Ops whose schema says the output *may* alias the input (the IR then lists the input in
``aliases`` either way): a copy when torch changed the dtype or turned a non-dense input into a
dense result, a view otherwise (see ``Lowering.copies``)."""

INT64_MAX = 9223372036854775807


def register(*names: str, inverse: Callable | None = None) -> Callable[[Translator], Translator]:
    def deco(fn: Translator) -> Translator:
        for name in names:
            TRANSLATIONS[name] = fn
            if inverse is not None:
                INVERSE_VIEWS[name] = inverse
        return fn
    return deco


def supported_ops() -> list[str]:
    return sorted(set(TRANSLATIONS) | ALLOCATING)


def is_inplace(op_name: str) -> bool:
    """'aten.add_.Tensor' -> True (ATen's in-place naming: the base name ends in '_')."""
    parts = op_name.split(".")
    base = parts[1] if len(parts) >= 3 else parts[-1]
    return base.endswith("_") and not base.endswith("__")


def functional_name(op_name: str) -> str:
    """'aten.add_.Tensor' -> 'aten.add.Tensor'."""
    parts = op_name.split(".")
    parts[1] = parts[1][:-1]
    return ".".join(parts)


# ------------------------------------------------------------------------------- argument binding
class Args:
    """An op's positional and keyword arguments bound to the ATen schema's names."""

    def __init__(self, op: TorchOp, names: list[str]):
        if len(op.args) > len(names):
            raise UnsupportedKernelError(f"{op.op} got {len(op.args)} positional arguments, "
                                         f"expected at most {len(names)} ({', '.join(names)})")
        self.op = op
        self.values: dict[str, OpArg] = dict(zip(names, op.args))
        for key, arg in op.kwargs.items():
            self.values[key] = arg

    def has(self, name: str) -> bool:
        arg = self.values.get(name)
        return arg is not None and not (isinstance(arg, ConstArg) and arg.const is None)

    def arg(self, name: str) -> OpArg:
        try:
            return self.values[name]
        except KeyError:
            raise UnsupportedKernelError(f"{self.op.op}: missing argument {name!r}") from None

    def const(self, name: str, default: Any = None) -> Any:
        """A Python constant (lists of constants included)."""
        arg = self.values.get(name)
        if arg is None:
            return default
        value = py_const(arg, f"{self.op.op} argument {name!r}")
        return default if value is None else value


def py_const(arg: OpArg, what: str) -> Any:
    if isinstance(arg, ConstArg):
        return arg.const
    if isinstance(arg, ListArg):
        return [py_const(a, what) for a in arg.items]
    raise UnsupportedKernelError(f"{what} must be a constant here, got {arg.model_dump()}")


def _norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _rank(ctx: "Lowering", arg: OpArg) -> int:
    return len(ctx.value_of(arg).shape)


# ------------------------------------------------------------------------------- identity / cast
@register("aten.clone.default", "aten.contiguous.default", "aten.alias.default",
          "aten.detach.default", "aten.lift_fresh_copy.default", "aten._to_copy.default",
          "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
          "aten.type_as.default", "aten.copy.default",
          inverse=lambda ctx, op, x: x)
def _identity_or_cast(ctx: "Lowering", op: TorchOp) -> list[str]:
    src = op.args[1] if op.op == "aten.copy.default" else op.args[0]
    out = ctx.out(op)
    x = ctx.cast(ctx.tensor(src), ctx.value_of(src).dtype, out.dtype)
    if op.op == "aten.copy.default":  # copy(self, src): src broadcast to self's shape
        return [ctx.node("Expand", [x, ctx.shape(out)])]
    return [ctx.node("Identity", [x])]


# ------------------------------------------------------------------------------- shape views
def _reshape_back(ctx: "Lowering", op: TorchOp, x: str) -> str:
    return ctx.node("Reshape", [x, ctx.shape(ctx.value_of(op.aliases[0]))], allowzero=1)


@register("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default",
          "aten.flatten.using_ints", "aten.unflatten.int", "aten.reshape_as.default",
          "aten.view_as.default", "aten.squeeze.default", "aten.squeeze.dim",
          "aten.squeeze.dims", inverse=_reshape_back)
def _reshape(ctx: "Lowering", op: TorchOp) -> list[str]:
    # The target shape is the IR's result shape (symbolic, -1 already resolved), computed at run
    # time; allowzero keeps a genuine 0 size a 0. squeeze of a non-1 dim is a no-op in torch: the
    # result shape says which dims really went away.
    x = ctx.tensor(op.args[0])
    return [ctx.node("Reshape", [x, ctx.shape(ctx.out(op))], allowzero=1)]


@register("aten.unsqueeze.default", inverse=_reshape_back)
def _unsqueeze(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "dim"])
    return [ctx.node("Unsqueeze", [ctx.tensor(a.arg("self")), ctx.i64([a.const("dim")])])]


def permutation(ctx: "Lowering", op: TorchOp) -> list[int]:
    rank = _rank(ctx, op.args[0])
    if op.op == "aten.t.default":
        return [1, 0] if rank == 2 else list(range(rank))
    if op.op == "aten.permute.default":
        return [_norm_dim(d, rank) for d in Args(op, ["self", "dims"]).const("dims")]
    a = Args(op, ["self", "dim0", "dim1"])
    perm = list(range(rank))
    d0, d1 = _norm_dim(a.const("dim0"), rank), _norm_dim(a.const("dim1"), rank)
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return perm


def _transpose_back(ctx: "Lowering", op: TorchOp, x: str) -> str:
    perm = permutation(ctx, op)
    inverse = [perm.index(i) for i in range(len(perm))]
    return ctx.node("Transpose", [x], perm=inverse)


@register("aten.transpose.int", "aten.t.default", "aten.permute.default", inverse=_transpose_back)
def _transpose(ctx: "Lowering", op: TorchOp) -> list[str]:
    return [ctx.node("Transpose", [ctx.tensor(op.args[0])], perm=permutation(ctx, op))]


def _region(ctx: "Lowering", op: TorchOp, dim: int, start: Any, length: Any) -> tuple[str, str]:
    """(begin, end) of the region a slice/select view covers along ``dim`` of its source, as
    [1]-shaped run-time ints; ``start``/``length`` are sympy expressions (negative constants
    wrap around, as in torch)."""
    size = ctx.expr(ctx.value_of(op.aliases[0]).shape[dim])
    if start.is_Integer and start < 0:
        start = start + size
    if start.is_Integer and start == 0:
        begin = ctx.i64([0])
    else:
        start = sympy.Min(start, size)
        begin = ctx.sym(start)
    return begin, ctx.sym(start + length)


def _splice(ctx: "Lowering", op: TorchOp, dim: int, begin: str, end: str, x: str) -> str:
    """The source with the region [begin, end) along ``dim`` replaced by ``x``."""
    parent = ctx.tensor(op.aliases[0])
    axes = ctx.i64([dim])
    before = ctx.node("Slice", [parent, ctx.i64([0]), begin, axes])
    after = ctx.node("Slice", [parent, end, ctx.i64([INT64_MAX]), axes])
    return ctx.node("Concat", [before, x, after], axis=dim)


def _slice_back(ctx: "Lowering", op: TorchOp, x: str) -> str:
    a = Args(op, ["self", "dim", "start", "end", "step"])
    if a.has("step") and a.const("step") != 1:
        raise UnsupportedKernelError(f"writing through a strided slice (step {a.const('step')}) "
                                     f"is not supported")
    start = ctx.expr_arg(a.values["start"]) if a.has("start") else sympy.Integer(0)
    out = ctx.value_of(op.outputs[0])
    dim = _norm_dim(a.const("dim", 0), len(out.shape))
    begin, end = _region(ctx, op, dim, start, ctx.expr(out.shape[dim]))
    return _splice(ctx, op, dim, begin, end, x)


def _select_back(ctx: "Lowering", op: TorchOp, x: str) -> str:
    a = Args(op, ["self", "dim", "index"])
    dim = _norm_dim(a.const("dim"), _rank(ctx, a.arg("self")))
    begin, end = _region(ctx, op, dim, ctx.expr_arg(a.arg("index")), sympy.Integer(1))
    return _splice(ctx, op, dim, begin, end, ctx.node("Unsqueeze", [x, ctx.i64([dim])]))


@register("aten.slice.Tensor", inverse=_slice_back)
def _slice(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "dim", "start", "end", "step"])
    dim = _norm_dim(a.const("dim", 0), _rank(ctx, a.arg("self")))
    start = ctx.int1(a.values["start"]) if a.has("start") else ctx.i64([0])
    end = ctx.int1(a.values["end"]) if a.has("end") else ctx.i64([INT64_MAX])
    step = ctx.int1(a.values["step"]) if a.has("step") else ctx.i64([1])
    return [ctx.node("Slice", [ctx.tensor(a.arg("self")), start, end, ctx.i64([dim]), step])]


@register("aten.narrow.default")
def _narrow(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "dim", "start", "length"])
    dim = _norm_dim(a.const("dim"), _rank(ctx, a.arg("self")))
    start = ctx.int1(a.arg("start"))
    end = ctx.node("Add", [start, ctx.int1(a.arg("length"))])
    return [ctx.node("Slice", [ctx.tensor(a.arg("self")), start, end, ctx.i64([dim])])]


@register("aten.select.int", inverse=_select_back)
def _select(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "dim", "index"])
    dim = _norm_dim(a.const("dim"), _rank(ctx, a.arg("self")))
    index = ctx.int0(a.arg("index"))
    return [ctx.node("Gather", [ctx.tensor(a.arg("self")), index], axis=dim)]


@register("aten.expand.default")
def _expand(ctx: "Lowering", op: TorchOp) -> list[str]:
    return [ctx.node("Expand", [ctx.tensor(op.args[0]), ctx.shape(ctx.out(op))])]


@register("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
          "aten.unbind.int")
def _split(ctx: "Lowering", op: TorchOp) -> list[str]:
    # Sizes of the pieces are the IR's result shapes along the split dim (symbolic, at run time).
    second = {"aten.split.Tensor": "split_size", "aten.split_with_sizes.default": "split_sizes",
              "aten.chunk.default": "chunks"}.get(op.op)
    a = Args(op, ["self", second, "dim"] if second else ["self", "dim"])
    src = a.arg("self")
    dim = _norm_dim(a.const("dim", 0), _rank(ctx, src))
    outs = [ctx.value_of(o) for o in op.outputs]
    if op.op == "aten.unbind.int":
        sizes = ctx.i64([1] * len(outs))
    else:
        sizes = ctx.concat_ints([ctx.sym(v.shape[dim]) for v in outs])
    pieces = ctx.node("Split", [ctx.tensor(src), sizes], n_out=len(outs), axis=dim)
    pieces = pieces if isinstance(pieces, list) else [pieces]
    if op.op == "aten.unbind.int":
        pieces = [ctx.node("Squeeze", [p, ctx.i64([dim])]) for p in pieces]
    return pieces


# ------------------------------------------------------------------------------- creation
def _filled(ctx: "Lowering", op: TorchOp, value: Any) -> list[str]:
    out = ctx.out(op)
    return [ctx.full(ctx.shape(out), value, out.dtype)]


@register("aten.zeros.default", "aten.zeros_like.default", "aten.new_zeros.default")
def _zeros(ctx: "Lowering", op: TorchOp) -> list[str]:
    return _filled(ctx, op, 0)


@register("aten.ones.default", "aten.ones_like.default", "aten.new_ones.default")
def _ones(ctx: "Lowering", op: TorchOp) -> list[str]:
    return _filled(ctx, op, 1)


@register("aten.full.default", "aten.full_like.default", "aten.new_full.default")
def _full(ctx: "Lowering", op: TorchOp) -> list[str]:
    names = {"aten.full.default": ["size", "fill_value"],
             "aten.full_like.default": ["self", "fill_value"],
             "aten.new_full.default": ["self", "size", "fill_value"]}[op.op]
    return _filled(ctx, op, Args(op, names).const("fill_value"))


@register("aten.scalar_tensor.default")
def _scalar_tensor(ctx: "Lowering", op: TorchOp) -> list[str]:
    return [ctx.scalar(Args(op, ["s"]).const("s"), ctx.out(op).dtype)]


@register("aten.zero.default")  # functional form of zero_
def _zero(ctx: "Lowering", op: TorchOp) -> list[str]:
    return _filled(ctx, op, 0)


@register("aten.fill.Scalar")  # functional form of fill_
def _fill(ctx: "Lowering", op: TorchOp) -> list[str]:
    return _filled(ctx, op, Args(op, ["self", "value"]).const("value"))


@register("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(ctx: "Lowering", op: TorchOp) -> list[str]:
    names = {"aten.arange.default": ["end"], "aten.arange.start": ["start", "end"],
             "aten.arange.start_step": ["start", "end", "step"]}[op.op]
    a = Args(op, names)
    parts = [a.values.get("start", ConstArg(const=0)), a.arg("end"),
             a.values.get("step", ConstArg(const=1))]
    out = ctx.out(op)
    integral = all(isinstance(p, SymArg) or (isinstance(p, ConstArg) and isinstance(p.const, int)
                                             and not isinstance(p.const, bool)) for p in parts)
    if integral:
        scalars = [ctx.int0(p) for p in parts]
        return [ctx.cast(ctx.node("Range", scalars), DType.i64, out.dtype)]
    scalars = []
    for p in parts:  # fractional bounds or step: compute in double, like torch's accumulate type
        if isinstance(p, SymArg):
            scalars.append(ctx.cast(ctx.int0(p), DType.i64, DType.fp64))
        else:
            scalars.append(ctx.scalar(float(py_const(p, f"{op.op} bound")), DType.fp64))
    return [ctx.cast(ctx.node("Range", scalars), DType.fp64, out.dtype)]


# ------------------------------------------------------------------------------- elementwise
def _operand(ctx: "Lowering", arg: OpArg, dtype: DType) -> str:
    """A tensor or Python-scalar operand, in ``dtype``."""
    if isinstance(arg, ValueArg):
        return ctx.cast(ctx.tensor(arg), ctx.value_of(arg).dtype, dtype)
    if isinstance(arg, SymArg):
        return ctx.cast(ctx.scalar_of(ctx.sym(arg.sym)), DType.i64, dtype)
    return ctx.scalar(py_const(arg, "scalar operand"), dtype)


def _binary(onnx_op: str, swap: bool = False) -> Translator:
    def translate(ctx: "Lowering", op: TorchOp) -> list[str]:
        a = Args(op, ["self", "other", "alpha"])
        dtype = ctx.out(op).dtype
        lhs, rhs = _operand(ctx, a.arg("self"), dtype), _operand(ctx, a.arg("other"), dtype)
        alpha = a.const("alpha", 1)
        if alpha != 1:  # add/sub: self + alpha * other; rsub: other - alpha * self
            if swap:
                lhs = ctx.node("Mul", [lhs, ctx.scalar(alpha, dtype)])
            else:
                rhs = ctx.node("Mul", [rhs, ctx.scalar(alpha, dtype)])
        return [ctx.node(onnx_op, [rhs, lhs] if swap else [lhs, rhs])]
    return translate


register("aten.add.Tensor", "aten.add.Scalar")(_binary("Add"))
register("aten.sub.Tensor", "aten.sub.Scalar")(_binary("Sub"))
register("aten.rsub.Scalar", "aten.rsub.Tensor")(_binary("Sub", swap=True))
register("aten.mul.Tensor", "aten.mul.Scalar")(_binary("Mul"))
register("aten.div.Tensor", "aten.div.Scalar")(_binary("Div"))
register("aten.maximum.default")(_binary("Max"))
register("aten.minimum.default")(_binary("Min"))
register("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor")(_binary("Pow"))  # (self, exponent)


@register("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "other", "rounding_mode"])
    mode, dtype = a.const("rounding_mode"), ctx.out(op).dtype
    lhs, rhs = _operand(ctx, a.arg("self"), dtype), _operand(ctx, a.arg("other"), dtype)
    if mode is None:
        return [ctx.node("Div", [lhs, rhs])]
    if dtype.is_float:
        q = ctx.node("Div", [lhs, rhs])
        if mode == "floor":
            return [ctx.node("Floor", [q])]
        negative = ctx.node("Less", [q, ctx.scalar(0, dtype)])
        return [ctx.node("Where", [negative, ctx.node("Ceil", [q]), ctx.node("Floor", [q])])]
    if mode == "trunc":  # ONNX integer Div truncates
        return [ctx.node("Div", [lhs, rhs])]
    # floor for any signs: (a - mod(a, b)) / b with Python-style mod is an exact division
    m = ctx.node("Mod", [lhs, rhs], fmod=0)
    return [ctx.node("Div", [ctx.node("Sub", [lhs, m]), rhs])]


def _common_dtype(ctx: "Lowering", args: list[OpArg]) -> DType:
    tensors = [ctx.value_of(a).dtype for a in args if isinstance(a, ValueArg)]
    floats = [d for d in tensors if d.is_float]
    if floats:
        return max(floats, key=lambda d: d.itemsize)
    scalars = [a.const for a in args if isinstance(a, ConstArg)]
    if any(isinstance(s, float) for s in scalars):
        return DType.fp32
    return max(tensors, key=lambda d: d.itemsize) if tensors else DType.i64


def _compare(onnx_op: str, negate: bool = False) -> Translator:
    def translate(ctx: "Lowering", op: TorchOp) -> list[str]:
        a = Args(op, ["self", "other"])
        dtype = _common_dtype(ctx, [a.arg("self"), a.arg("other")])
        out = ctx.node(onnx_op, [_operand(ctx, a.arg("self"), dtype),
                                 _operand(ctx, a.arg("other"), dtype)])
        out = ctx.node("Not", [out]) if negate else out
        return [ctx.cast(out, DType.i1, ctx.out(op).dtype)]
    return translate


register("aten.eq.Tensor", "aten.eq.Scalar")(_compare("Equal"))
register("aten.ne.Tensor", "aten.ne.Scalar")(_compare("Equal", negate=True))
register("aten.lt.Tensor", "aten.lt.Scalar")(_compare("Less"))
register("aten.le.Tensor", "aten.le.Scalar")(_compare("LessOrEqual"))
register("aten.gt.Tensor", "aten.gt.Scalar")(_compare("Greater"))
register("aten.ge.Tensor", "aten.ge.Scalar")(_compare("GreaterOrEqual"))


@register("aten.where.self")
def _where(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["condition", "self", "other"])
    dtype = ctx.out(op).dtype
    cond = ctx.cast(ctx.tensor(a.arg("condition")), ctx.value_of(a.arg("condition")).dtype, DType.i1)
    return [ctx.node("Where", [cond, _operand(ctx, a.arg("self"), dtype),
                               _operand(ctx, a.arg("other"), dtype)])]


@register("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "mask", "value"])
    dtype = ctx.out(op).dtype
    mask = ctx.cast(ctx.tensor(a.arg("mask")), ctx.value_of(a.arg("mask")).dtype, DType.i1)
    return [ctx.node("Where", [mask, _operand(ctx, a.arg("value"), dtype),
                               _operand(ctx, a.arg("self"), dtype)])]


@register("aten.clamp.default")
def _clamp(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "min", "max"])
    dtype = ctx.out(op).dtype
    lo = ctx.scalar(a.const("min"), dtype) if a.has("min") else ""
    hi = ctx.scalar(a.const("max"), dtype) if a.has("max") else ""
    return [ctx.node("Clip", [_operand(ctx, a.arg("self"), dtype), lo, hi])]


def _unary(*steps: str) -> Translator:
    def translate(ctx: "Lowering", op: TorchOp) -> list[str]:
        x = _operand(ctx, op.args[0], ctx.out(op).dtype)
        for step in steps:
            x = ctx.node(step, [x])
        return [x]
    return translate


for _name, _steps in {
    "neg": ("Neg",), "exp": ("Exp",), "log": ("Log",), "sin": ("Sin",), "cos": ("Cos",),
    "tanh": ("Tanh",), "sigmoid": ("Sigmoid",), "sqrt": ("Sqrt",), "rsqrt": ("Sqrt", "Reciprocal"),
    "reciprocal": ("Reciprocal",), "abs": ("Abs",), "relu": ("Relu",), "erf": ("Erf",),
    "floor": ("Floor",), "ceil": ("Ceil",),
}.items():
    register(f"aten.{_name}.default")(_unary(*_steps))


@register("aten.silu.default")
def _silu(ctx: "Lowering", op: TorchOp) -> list[str]:
    x = _operand(ctx, op.args[0], ctx.out(op).dtype)
    return [ctx.node("Mul", [x, ctx.node("Sigmoid", [x])])]


@register("aten.gelu.default")
def _gelu(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "approximate"])
    dtype = ctx.out(op).dtype
    x = _operand(ctx, a.arg("self"), dtype)
    half = ctx.node("Mul", [x, ctx.scalar(0.5, dtype)])
    if a.const("approximate", "none") == "tanh":
        cube = ctx.node("Mul", [ctx.node("Mul", [x, x]), x])
        inner = ctx.node("Add", [x, ctx.node("Mul", [cube, ctx.scalar(0.044715, dtype)])])
        t = ctx.node("Tanh", [ctx.node("Mul", [inner, ctx.scalar(math.sqrt(2 / math.pi), dtype)])])
    else:
        t = ctx.node("Erf", [ctx.node("Mul", [x, ctx.scalar(1 / math.sqrt(2), dtype)])])
    return [ctx.node("Mul", [half, ctx.node("Add", [t, ctx.scalar(1, dtype)])])]


@register("aten.softmax.int", "aten._softmax.default", "aten.log_softmax.int",
          "aten._log_softmax.default")
def _softmax(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "dim", "dtype" if ".int" in op.op else "half_to_float"])
    kind = "LogSoftmax" if "log_softmax" in op.op else "Softmax"
    x = _operand(ctx, a.arg("self"), ctx.out(op).dtype)
    return [ctx.node(kind, [x], axis=a.const("dim"))]


# ------------------------------------------------------------------------------- linear algebra
@register("aten.linear.default")
def _linear(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["input", "weight", "bias"])
    dtype = ctx.out(op).dtype
    w = _operand(ctx, a.arg("weight"), dtype)
    w_t = ctx.node("Transpose", [w], perm=[1, 0]) if _rank(ctx, a.arg("weight")) == 2 else w
    y = ctx.node("MatMul", [_operand(ctx, a.arg("input"), dtype), w_t])
    if a.has("bias"):
        y = ctx.node("Add", [y, _operand(ctx, a.arg("bias"), dtype)])
    return [y]


@register("aten.matmul.default", "aten.mm.default", "aten.bmm.default")
def _matmul(ctx: "Lowering", op: TorchOp) -> list[str]:
    dtype = ctx.out(op).dtype
    return [ctx.node("MatMul", [_operand(ctx, op.args[0], dtype), _operand(ctx, op.args[1], dtype)])]


@register("aten.addmm.default")
def _addmm(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "mat1", "mat2", "beta", "alpha"])
    dtype = ctx.out(op).dtype
    prod = ctx.node("MatMul", [_operand(ctx, a.arg("mat1"), dtype), _operand(ctx, a.arg("mat2"), dtype)])
    bias = _operand(ctx, a.arg("self"), dtype)
    if a.const("alpha", 1) != 1:
        prod = ctx.node("Mul", [prod, ctx.scalar(a.const("alpha"), dtype)])
    if a.const("beta", 1) != 1:
        bias = ctx.node("Mul", [bias, ctx.scalar(a.const("beta"), dtype)])
    return [ctx.node("Add", [prod, bias])]


@register("aten.outer.default")
def _outer(ctx: "Lowering", op: TorchOp) -> list[str]:
    dtype = ctx.out(op).dtype
    col = ctx.node("Unsqueeze", [_operand(ctx, op.args[0], dtype), ctx.i64([1])])
    row = ctx.node("Unsqueeze", [_operand(ctx, op.args[1], dtype), ctx.i64([0])])
    return [ctx.node("Mul", [col, row])]


@register("aten.embedding.default")
def _embedding(ctx: "Lowering", op: TorchOp) -> list[str]:
    return [ctx.node("Gather", [ctx.tensor(op.args[0]), ctx.tensor(op.args[1])], axis=0)]


@register("aten.scaled_dot_product_attention.default")
def _sdpa(ctx: "Lowering", op: TorchOp) -> list[str]:
    """softmax(Q·Kᵀ·scale (+ causal/explicit mask)) · V, with torch's top-left causal mask."""
    a = Args(op, ["query", "key", "value", "attn_mask", "dropout_p", "is_causal"])
    if a.const("dropout_p", 0.0):
        raise UnsupportedKernelError("scaled_dot_product_attention with dropout_p > 0 is random; "
                                     "capture the model in eval mode (dropout_p=0)")
    if a.const("enable_gqa", False):
        raise UnsupportedKernelError("scaled_dot_product_attention with enable_gqa=True is not "
                                     "supported; repeat the key/value heads explicitly")
    dtype = ctx.out(op).dtype
    q, k, v = (_operand(ctx, a.arg(n), dtype) for n in ("query", "key", "value"))
    rank = _rank(ctx, a.arg("query"))
    perm = list(range(rank))
    perm[-2], perm[-1] = perm[-1], perm[-2]
    scores = ctx.node("MatMul", [q, ctx.node("Transpose", [k], perm=perm)])
    if a.has("scale"):
        scale = ctx.scalar(float(a.const("scale")), dtype)
    else:
        head_dim = ctx.value_of(a.arg("query")).shape[-1]
        if head_dim.isdigit():
            scale = ctx.scalar(1.0 / math.sqrt(int(head_dim)), dtype)
        else:  # symbolic head dim: 1/sqrt(E) at run time
            e = ctx.cast(ctx.scalar_of(ctx.sym(head_dim)), DType.i64, dtype)
            scale = ctx.node("Reciprocal", [ctx.node("Sqrt", [e])])
    scores = ctx.node("Mul", [scores, scale])
    neg_inf = ctx.scalar(float("-inf"), dtype)
    if a.const("is_causal", False):
        lq = ctx.node("Shape", [q], start=-2, end=-1)
        lk = ctx.node("Shape", [k], start=-2, end=-1)
        ones = ctx.full(ctx.node("Concat", [lq, lk], axis=0), True, DType.i1)
        mask = ctx.node("Trilu", [ones], upper=0)
        scores = ctx.node("Where", [mask, scores, neg_inf])
    if a.has("attn_mask"):
        mask_arg = a.arg("attn_mask")
        if ctx.value_of(mask_arg).dtype == DType.i1:
            scores = ctx.node("Where", [ctx.tensor(mask_arg), scores, neg_inf])
        else:
            scores = ctx.node("Add", [scores, _operand(ctx, mask_arg, dtype)])
    probs = ctx.node("Softmax", [scores], axis=-1)
    return [ctx.node("MatMul", [probs, v])]


# ------------------------------------------------------------------------------- reductions
def _reduce(onnx_op: str) -> Translator:
    def translate(ctx: "Lowering", op: TorchOp) -> list[str]:
        a = Args(op, ["self", "dim", "keepdim"])
        dims = a.const("dim")
        if isinstance(dims, int):
            dims = [dims]
        x = _operand(ctx, a.arg("self"), ctx.out(op).dtype)
        inputs = [x] + ([ctx.i64(list(dims))] if dims else [])
        return [ctx.node(onnx_op, inputs, keepdims=int(bool(a.const("keepdim", False))))]
    return translate


register("aten.sum.default", "aten.sum.dim_IntList")(_reduce("ReduceSum"))
register("aten.mean.default", "aten.mean.dim")(_reduce("ReduceMean"))
register("aten.amax.default")(_reduce("ReduceMax"))
register("aten.amin.default")(_reduce("ReduceMin"))


# ------------------------------------------------------------------------------- joins
@register("aten.cat.default", "aten.concat.default")
def _cat(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["tensors", "dim"])
    out = ctx.out(op)
    dim = _norm_dim(a.const("dim", 0), len(out.shape))
    items = a.arg("tensors").items
    return [ctx.node("Concat", [_operand(ctx, t, out.dtype) for t in items], axis=dim)]


@register("aten.stack.default")
def _stack(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["tensors", "dim"])
    out = ctx.out(op)
    dim = _norm_dim(a.const("dim", 0), len(out.shape))
    parts = [ctx.node("Unsqueeze", [_operand(ctx, t, out.dtype), ctx.i64([dim])])
             for t in a.arg("tensors").items]
    return [ctx.node("Concat", parts, axis=dim)]


# ------------------------------------------------------------------------------- in-place forms
@register("aten.copy_.default")
def _copy_(ctx: "Lowering", op: TorchOp) -> list[str]:
    """self.copy_(src): the new contents of self are src, cast and broadcast to self."""
    a = Args(op, ["self", "src", "non_blocking"])
    target = ctx.value_of(a.arg("self"))
    src = _operand(ctx, a.arg("src"), target.dtype)
    return [ctx.node("Expand", [src, ctx.shape(target)])]


@register("aten.fill_.Tensor")
def _fill_tensor_(ctx: "Lowering", op: TorchOp) -> list[str]:
    a = Args(op, ["self", "value"])
    target = ctx.value_of(a.arg("self"))
    return [ctx.node("Expand", [_operand(ctx, a.arg("value"), target.dtype), ctx.shape(target)])]
