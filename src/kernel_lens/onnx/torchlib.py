"""ATen ops -> ONNX through onnxscript's torchlib: the translations ``torch.onnx.export`` uses.

Each IR :class:`~kernel_lens.ir.graph.TorchOp` is translated by calling the torchlib function
that torch's own exporter registers for that ATen overload, under torch's own recording
evaluator (``OpRecorder``), with the same argument conventions as the exporter: tensors are
ONNX values typed and shaped from the IR, symbolic integers are 0-d int64 values computed at run
time from the graph inputs' dims, dtypes are ONNX type codes, and implicit type promotion is made
explicit first with torch's own promotion rules. The recorded nodes are appended to the
lowering's graph. kernel_lens keeps only what it must control itself: kernel launch nodes, the
memory model (views, in-place writes, allocations) and writing through views
(:mod:`kernel_lens.onnx.aten`).

Why from the IR and not ``torch.onnx.export`` of the traced program: the IR is the contract
between the front end and every target, passes may change it, and ``compile --from-ir`` and
third-party front ends have no exported program. See ``docs/onnx_lowering.md``.
"""

from __future__ import annotations

import json
import logging
from functools import lru_cache
from importlib.metadata import version as dist_version
from typing import Any

import onnx_ir

from .. import aten_facts
from ..errors import UnsupportedKernelError
from ..ir.graph import ConstArg, ListArg, OpArg, SymArg, TorchOp, ValueArg
from ..ir.types import DType, dtype_from_torch, torch_name
from ..toolchain import entry_cache
from .context import ONNX_DTYPES, LoweringContext, onnx_dtype



def _exporter():
    """torch's exporter internals (imported on first use: they pull in onnxscript)."""
    # lazy: torch and onnxscript (seconds), only when an op is translated (not on a cached lowering)
    from torch.onnx._internal.exporter import _building, _core, _registration  # noqa: F401
    return _building, _core, _registration


@lru_cache(maxsize=None)
def registry(opset: int) -> Any:
    """torch's ONNX registry populated from torchlib for ``opset`` (built once per process)."""
    _, _, _registration = _exporter()
    quiet = logging.getLogger(_registration.__name__)
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # "torchvision is not installed. Skipping torchvision::nms"
    try:
        return _registration.ONNXRegistry.from_torchlib(opset)
    finally:
        quiet.setLevel(level)


def function_for(op_name: str, opset: int) -> Any:
    """The torchlib function translating ``op_name`` (real-valued inputs), or None."""
    target = aten_facts.overload(op_name)
    if target is None:
        return None
    metas = [m for m in registry(opset).get_decomps(target) if not m.is_complex]
    return metas[0].onnx_function if metas else None


def translatable(op_name: str, opset: int) -> bool:
    """Whether torchlib translates ``op_name``: answered from a cached list of torchlib's ATen
    overloads (per torch, onnxscript and opset), so the front end does not build the registry
    (about a second) when nothing changed."""
    return op_name in _translatable_names(opset)


@lru_cache(maxsize=None)
def _translatable_names(opset: int) -> frozenset[str]:
    import torch  # lazy: torch takes seconds; the onnx layer imports no torch (targets emit and build without it)

    key = entry_cache.key_of("torchlib-ops/2", torch.__version__, dist_version("onnxscript"), opset)
    body = entry_cache.read("torchlib", key, ".json")
    if body is not None:
        try:
            return frozenset(json.loads(body))
        except ValueError:
            pass
    names = sorted({_ir_name(target) for target, metas in registry(opset).functions.items()
                    if any(not m.is_complex for m in metas)} - {None})
    entry_cache.write("torchlib", key, json.dumps(names).encode(), ".json")
    return frozenset(names)


def _ir_name(target: Any) -> str | None:
    """The IR's name of a registry key: ``'aten::add.Tensor'`` -> ``'aten.add.Tensor'``,
    ``'aten::abs'`` -> ``'aten.abs.default'``; None for the rest (Python builtins, higher-order
    ops: the registry's other keys)."""
    if isinstance(target, str) and "::" in target:
        namespace, rest = target.split("::", 1)
        packet, _, overload = rest.partition(".")
        return f"{namespace}.{packet}.{overload or 'default'}"
    return None


@lru_cache(maxsize=1)
def _promotion_table() -> Any:
    from torch.onnx._internal.fx.passes import type_promotion  # lazy: torch, only when translating
    return type_promotion.TypePromotionTable()


class _Call:
    """One translation: IR arguments -> exporter-style arguments -> recorded nodes."""

    def __init__(self, ctx: LoweringContext, op: TorchOp):
        self.ctx, self.op = ctx, op
        self.target = aten_facts.overload(op.op)
        schema = self.target._schema
        self.arg_types = {a.name: str(a.type) for a in schema.arguments}
        self.positional = [a.name for a in schema.arguments if not a.kwarg_only]

    # ------------------------------------------------------------------ arguments
    def value(self, onnx_name: str, dtype: DType, shape: list[str]) -> Any:
        ir = onnx_ir
        dims = []
        for d in shape:
            e = self.ctx.expr(d)
            dims.append(int(e) if e.is_Integer else ir.SymbolicDim(str(d)))
        return ir.Value(name=onnx_name, type=ir.TensorType(ir.DataType(onnx_dtype(dtype))),
                        shape=ir.Shape(dims))

    def convert(self, arg: OpArg, kind: str) -> Any:
        ctx = self.ctx
        if isinstance(arg, ValueArg):
            v = ctx.value_of(arg)
            if kind == "List[Optional[Tensor]]" and v.dtype == DType.i32:  # an index list (aten.index,
                # index_put): torch takes int32 indices, ONNX's GatherND/ScatterND int64 only
                return self.value(ctx.cast(ctx.tensor(arg), DType.i32, DType.i64), DType.i64, v.shape)
            return self.value(ctx.tensor(arg), v.dtype, v.shape)
        if isinstance(arg, SymArg):
            e = ctx.expr(arg.sym)
            if e.is_Integer:
                return int(e)
            return self.value(ctx.scalar_of(ctx.sym(e)), DType.i64, [])
        if isinstance(arg, ListArg):
            return [self.convert(a, kind) for a in arg.items]
        assert isinstance(arg, ConstArg)
        value = arg.const
        if isinstance(value, str) and value.startswith("torch."):
            return self._dtype_code(value)
        return value

    @staticmethod
    def _dtype_code(text: str) -> Any:
        """``'torch.float16'`` -> its ONNX type code, as the exporter passes dtypes; other torch
        enums (layouts, memory formats) stay strings, as the exporter passes them."""
        import torch  # lazy: the onnx layer imports no torch at module level

        _, _core, _ = _exporter()
        dtype = getattr(torch, text.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            return text
        return int(_core.torch_dtype_to_onnx_dtype(dtype))

    def arguments(self) -> tuple[list[Any], dict[str, Any]]:
        op = self.op
        names = self.positional
        if len(op.args) > len(names):
            raise UnsupportedKernelError(f"{op.op} got {len(op.args)} positional arguments, its "
                                         f"schema has {len(names)}")
        args = [self.convert(a, self.arg_types[n]) for a, n in zip(op.args, names)]
        kwargs = {}
        for key, arg in op.kwargs.items():
            kwargs[key] = self.convert(arg, self.arg_types.get(key, ""))
            if key == "dtype" and kwargs[key] is None:
                kwargs[key] = -1  # as torch's exporter passes an unset dtype
        self._promote(args, kwargs)
        return args, kwargs

    def _promote(self, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Make torch's implicit type promotion explicit (Cast), as torch's exporter does."""
        rule = _promotion_table().get_rule(self.target.overloadpacket)
        if rule is None:
            return
        import torch  # lazy: the onnx layer imports no torch at module level

        def fake(arg: OpArg) -> Any:
            if isinstance(arg, ValueArg):
                v = self.ctx.value_of(arg)
                dtype = getattr(torch, torch_name(DType(v.dtype)))
                return torch.empty([1] * len(v.shape), dtype=dtype, device="meta")
            if isinstance(arg, SymArg):
                return 1
            if isinstance(arg, ListArg):
                return [fake(a) for a in arg.items]
            return arg.const

        try:
            snapshot = rule.preview_type_promotion(
                tuple(fake(a) for a in self.op.args), {k: fake(a) for k, a in self.op.kwargs.items()})
        except Exception:  # a rule that does not apply to these arguments: nothing to promote
            return
        for where, index, dtype in ([(args, i, d) for i, d in snapshot.args_dtypes.items()]
                                    + [(kwargs, k, d) for k, d in snapshot.kwargs_dtypes.items()]):
            if isinstance(where, list) and index >= len(where) or \
                    isinstance(where, dict) and index not in where:
                continue
            where[index] = self._cast(where[index], dtype_from_torch(dtype))

    def _cast(self, value: Any, dtype: DType) -> Any:
        ir = onnx_ir
        if not isinstance(value, ir.Value):
            return value
        if value.dtype == ir.DataType(ONNX_DTYPES[dtype]):
            return value
        src = next(d for d, code in ONNX_DTYPES.items() if ir.DataType(code) == value.dtype)
        name = self.ctx.cast(value.name, src, dtype)
        return self.value(name, dtype, [str(d) for d in value.shape])

    # ------------------------------------------------------------------ the call
    def run(self, function: Any) -> list[str]:
        import onnxscript  # lazy: ~0.3 s, only when a torchlib translation runs

        _building, _, _ = _exporter()
        args, kwargs = self.arguments()
        ctx = self.ctx
        tracer = _building.OpRecorder(onnxscript.values.Opset("", ctx.opset), ctx.constant_farm)
        try:
            with onnxscript.evaluator.default_as(tracer):
                result = function(*args, **kwargs)
        except UnsupportedKernelError:
            raise
        except Exception as exc:
            cause = exc.__cause__ or exc
            raise UnsupportedKernelError(
                f"torchlib's translation of {self.op.op} failed: {type(cause).__name__}: "
                f"{str(cause).strip().splitlines()[0] if str(cause).strip() else ''}") from exc
        ctx.add_recorded(tracer.nodes, tracer.functions)
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        ir = onnx_ir
        names = []
        for r in results:
            if isinstance(r, ir.Value):
                names.append(r.name)
            elif isinstance(r, (list, tuple)):  # e.g. split: a list of values
                names.extend(x.name for x in r)
            else:
                raise UnsupportedKernelError(f"torchlib's translation of {self.op.op} returned "
                                             f"{type(r).__name__}, not ONNX values")
        if len(names) < len(self.op.outputs):
            raise UnsupportedKernelError(f"torchlib's translation of {self.op.op} returned "
                                         f"{len(names)} values for {len(self.op.outputs)} outputs")
        return names[:len(self.op.outputs)]


def translate(ctx: LoweringContext, op: TorchOp, name: str | None = None) -> list[str] | None:
    """ONNX names of ``op``'s outputs, translated by torchlib as ``name`` (default: ``op.op``);
    None when torchlib has no translation for it."""
    function = function_for(name or op.op, ctx.opset)
    if function is None:
        return None
    if name is not None and name != op.op:
        op = op.model_copy(update={"op": name})
    return _Call(ctx, op).run(function)
