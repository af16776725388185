"""What kernel_lens translates itself, around torchlib: writing through views, and the few
forms torchlib has no function for.

Every ATen op between launches is translated by onnxscript's torchlib
(:mod:`kernel_lens.onnx.torchlib`). This module holds only what the memory model controls:

* :data:`INVERSE_VIEWS`: how an in-place torch op writes *through* a view back into the view's
  source (reshape-like and transpose-like views map the values back; slice with step 1 and
  select splice them into the source's current contents);
* :data:`TRANSLATIONS`: in-place forms whose new contents kernel_lens computes itself
  (``copy_``: the source cast and broadcast to the target), ops torchlib lacks that the
  front end cannot decompose (``zero``, ``squeeze.dims``), and multi-output splits, which
  torchlib returns as an ONNX sequence that TensorRT's parser does not take.

Translators receive the lowering context (:class:`~kernel_lens.onnx.context.LoweringContext`) and the
:class:`~kernel_lens.ir.graph.TorchOp`, and return one ONNX tensor name per ``op.outputs``; they
raise :class:`~kernel_lens.errors.UnsupportedKernelError` (the lowering adds the position).
"""

from __future__ import annotations

from typing import Any, Callable

import sympy

from ..errors import UnsupportedKernelError
from ..ir.graph import ConstArg, ListArg, OpArg, SymArg, TorchOp, ValueArg
from ..ir.types import DType
from .context import LoweringContext


Translator = Callable[[LoweringContext, TorchOp], list[str]]

TRANSLATIONS: dict[str, Translator] = {}
"""ATen overload name -> kernel_lens's own translator (tried before torchlib)."""

INVERSE_VIEWS: dict[str, Callable[[LoweringContext, TorchOp, str], str]] = {}
"""View ops through which an in-place torch op can write: (ctx, view op, new contents of the
view) -> new contents of the view's source."""

INT64_MAX = 9223372036854775807


def register(*names: str) -> Callable[[Translator], Translator]:
    def deco(fn: Translator) -> Translator:
        for name in names:
            TRANSLATIONS[name] = fn
        return fn
    return deco


def inverse(*names: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        for name in names:
            INVERSE_VIEWS[name] = fn
        return fn
    return deco


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


def _rank(ctx: LoweringContext, arg: OpArg) -> int:
    return len(ctx.value_of(arg).shape)


# ------------------------------------------------------------------------------- writing through views
@inverse("aten.alias.default", "aten.detach.default", "aten.contiguous.default",
         "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
         "aten.type_as.default", "aten.lift_fresh_copy.default", "aten._to_copy.default",
         "aten.clone.default", "aten.dropout.default")
def _same_back(ctx: LoweringContext, op: TorchOp, x: str) -> str:
    """Views that are the whole source, unchanged (a copy never reaches here: it has no alias)."""
    return x


@inverse("aten.reshape.default", "aten.view.default", "aten._unsafe_view.default",
         "aten.flatten.using_ints", "aten.unflatten.int", "aten.reshape_as.default",
         "aten.view_as.default", "aten.squeeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
         "aten.unsqueeze.default")
def _reshape_back(ctx: LoweringContext, op: TorchOp, x: str) -> str:
    return ctx.node("Reshape", [x, ctx.shape(ctx.value_of(op.aliases[0]))], allowzero=1)


def permutation(ctx: LoweringContext, op: TorchOp) -> list[int]:
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


@inverse("aten.transpose.int", "aten.t.default", "aten.permute.default")
def _transpose_back(ctx: LoweringContext, op: TorchOp, x: str) -> str:
    perm = permutation(ctx, op)
    inverse = [perm.index(i) for i in range(len(perm))]
    return ctx.node("Transpose", [x], perm=inverse)


def _region(ctx: LoweringContext, op: TorchOp, dim: int, start: Any, length: Any) -> tuple[str, str]:
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


def _splice(ctx: LoweringContext, op: TorchOp, dim: int, begin: str, end: str, x: str) -> str:
    """The source with the region [begin, end) along ``dim`` replaced by ``x``."""
    parent = ctx.tensor(op.aliases[0])
    axes = ctx.i64([dim])
    before = ctx.node("Slice", [parent, ctx.i64([0]), begin, axes])
    after = ctx.node("Slice", [parent, end, ctx.i64([INT64_MAX]), axes])
    return ctx.node("Concat", [before, x, after], axis=dim)


@inverse("aten.slice.Tensor")
def _slice_back(ctx: LoweringContext, op: TorchOp, x: str) -> str:
    a = Args(op, ["self", "dim", "start", "end", "step"])
    if a.has("step") and a.const("step") != 1:
        raise UnsupportedKernelError(f"writing through a strided slice (step {a.const('step')}) "
                                     f"is not supported")
    start = ctx.expr_arg(a.values["start"]) if a.has("start") else sympy.Integer(0)
    out = ctx.value_of(op.outputs[0])
    dim = _norm_dim(a.const("dim", 0), len(out.shape))
    begin, end = _region(ctx, op, dim, start, ctx.expr(out.shape[dim]))
    return _splice(ctx, op, dim, begin, end, x)


@inverse("aten.select.int")
def _select_back(ctx: LoweringContext, op: TorchOp, x: str) -> str:
    a = Args(op, ["self", "dim", "index"])
    dim = _norm_dim(a.const("dim"), _rank(ctx, a.arg("self")))
    begin, end = _region(ctx, op, dim, ctx.expr_arg(a.arg("index")), sympy.Integer(1))
    return _splice(ctx, op, dim, begin, end, ctx.node("Unsqueeze", [x, ctx.i64([dim])]))


# ------------------------------------------------------------------------------- own translations
def _operand(ctx: LoweringContext, arg: OpArg, dtype: DType) -> str:
    """A tensor, symbolic-int or Python-scalar operand, in ``dtype``."""
    if isinstance(arg, ValueArg):
        return ctx.cast(ctx.tensor(arg), ctx.value_of(arg).dtype, dtype)
    if isinstance(arg, SymArg):
        return ctx.cast(ctx.scalar_of(ctx.sym(arg.sym)), DType.i64, dtype)
    return ctx.scalar(py_const(arg, "scalar operand"), dtype)


@register("aten.copy_.default")
def _copy_(ctx: LoweringContext, op: TorchOp) -> list[str]:
    """self.copy_(src): the new contents of self are src, cast and broadcast to self."""
    a = Args(op, ["self", "src", "non_blocking"])
    target = ctx.value_of(a.arg("self"))
    src = _operand(ctx, a.arg("src"), target.dtype)
    return [ctx.node("Expand", [src, ctx.shape(target)])]


@register("aten.fill_.Tensor", "aten.fill_.Scalar")
def _fill_(ctx: LoweringContext, op: TorchOp) -> list[str]:
    a = Args(op, ["self", "value"])
    target = ctx.value_of(a.arg("self"))
    return [ctx.node("Expand", [_operand(ctx, a.arg("value"), target.dtype), ctx.shape(target)])]


@register("aten.zero_.default", "aten.zero.default")
def _zero(ctx: LoweringContext, op: TorchOp) -> list[str]:
    out = ctx.out(op)
    return [ctx.full(ctx.shape(out), 0, out.dtype)]


# torchlib returns the pieces as an ONNX sequence (SplitToSequence), which TensorRT's parser does
# not take: kernel_lens splits into separate tensors.
@register("aten.split.Tensor", "aten.split_with_sizes.default", "aten.chunk.default",
          "aten.unbind.int")
def _split(ctx: LoweringContext, op: TorchOp) -> list[str]:
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


@register("aten.masked_select.default")
def _masked_select(ctx: LoweringContext, op: TorchOp) -> list[str]:
    """The elements of ``self`` where ``mask`` holds, both broadcast, in row-major order: a 1-D
    tensor whose length (a size from tensor values) is known only at run time."""
    a = Args(op, ["self", "mask"])
    x, mask = ctx.tensor(a.arg("self")), ctx.tensor(a.arg("mask"))
    x = ctx.node("Expand", [x, ctx.node("Shape", [mask])])  # both to the broadcast shape
    mask = ctx.node("Expand", [mask, ctx.node("Shape", [x])])
    flat = ctx.i64([-1])
    return [ctx.node("Compress", [ctx.node("Reshape", [x, flat]), ctx.node("Reshape", [mask, flat])],
                     axis=0)]


@register("aten.repeat_interleave.Tensor")
def _repeat_interleave(ctx: LoweringContext, op: TorchOp) -> list[str]:
    """``repeat_interleave(repeats)``: index i repeated repeats[i] times, in the repeats' dtype
    (torchlib's translation compares int64 positions with the repeats as given, which ONNX
    refuses for int32 repeats). Position j's index is the count of cumulative sums <= j."""
    a = Args(op, ["repeats", "output_size"])
    repeats = ctx.value_of(a.arg("repeats"))
    ends = ctx.node("CumSum", [ctx.cast(ctx.tensor(a.arg("repeats")), repeats.dtype, DType.i64),
                               ctx.scalar(0, DType.i64)])
    total = ctx.node("ReduceSum", [ctx.cast(ctx.tensor(a.arg("repeats")), repeats.dtype, DType.i64)],
                     keepdims=0)
    pos = ctx.node("Range", [ctx.scalar(0, DType.i64), total, ctx.scalar(1, DType.i64)])
    passed = ctx.node("GreaterOrEqual", [ctx.node("Unsqueeze", [pos, ctx.i64([1])]),
                                         ctx.node("Unsqueeze", [ends, ctx.i64([0])])])
    index = ctx.node("ReduceSum", [ctx.cast(passed, DType.i1, DType.i64), ctx.i64([1])], keepdims=0)
    return [ctx.cast(index, DType.i64, ctx.out(op).dtype)]


@register("aten.sort.default", "aten.sort.stable")
def _sort(ctx: LoweringContext, op: TorchOp) -> list[str]:
    """``torch.sort``: ONNX ``TopK`` over the whole dim, which the spec makes order equal values
    by index, lower first, in either direction: a stable sort (``stable=True``; torch's order of
    ties in an unstable sort is its own). Torch puts NaN above every number; TopK leaves NaN's
    place unspecified, so a call whose input holds a NaN stops with an error (a run-time check)."""
    names = ["self", "dim", "descending"] if op.op == "aten.sort.default" else ["self"]
    a = Args(op, names)
    src = a.arg("self")
    value = ctx.value_of(src)
    x = ctx.tensor(src)
    if not value.shape:  # a 0-d tensor: itself, index 0
        return [ctx.node("Identity", [x]), ctx.scalar(0, DType.i64)]
    dim = _norm_dim(a.const("dim", -1), len(value.shape))
    if value.dtype.is_float:
        nan = ctx.node("ReduceSum", [ctx.cast(ctx.node("IsNaN", [x]), DType.i1, DType.i64)], keepdims=0)
        ctx.stop_unless(ctx.node("Equal", [nan, ctx.scalar(0, DType.i64)]),
                        f"torch.sort ({op.op}, position {op.order}) got a NaN: torch orders NaN above "
                        f"every number, ONNX TopK leaves its place unspecified; sort NaN-free values "
                        f"(e.g. torch.nan_to_num first)")
    count = ctx.node("Slice", [ctx.node("Shape", [x]), ctx.i64([dim]), ctx.i64([dim + 1])])
    values, indices = ctx.node("TopK", [x, count], n_out=2, axis=dim,
                               largest=int(bool(a.const("descending", False))), sorted=1)
    return [values, indices]


@register("aten.squeeze.dims")
def _squeeze_dims(ctx: LoweringContext, op: TorchOp) -> list[str]:
    # squeezing a dim that is not 1 is a no-op in torch: the IR's result shape says which went
    return [ctx.node("Reshape", [ctx.tensor(op.args[0]), ctx.shape(ctx.out(op))], allowzero=1)]
