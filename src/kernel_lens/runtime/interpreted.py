"""A compiled model evaluated on the CPU: the checking path, never a substitute for the GPU one.

``CompiledModel.run`` with CPU tensors lands here. The artifact's own ONNX graph is evaluated by
ONNX's reference evaluator (standard ops, the size pieces' ``If`` nodes, initializers as the
folder holds them), and each kernel_lens launch node by Triton's interpreter, from what the IR
holds: the kernel's text and the launch plan (:mod:`kernel_lens.codegen.plan`), the same contract
the CUDA op is generated from. So a node here reads the symbols from its inputs and checks their
ranges and the other dims, picks the kernel variant by its guards, allocates its outputs (fresh,
or a copy of the input holding the initial contents, exactly as the generated C++ does), points
each tensor parameter at its node tensor plus the plan's element offset, and launches the
kernel's grid. A fresh output starts as a poison pattern (NaN for floats), so a part no kernel
writes and something reads shows as a difference, never as a lucky zero.

Slow (an interpreter per program instance, numpy per ONNX op): it is for checking small sizes
(``kernel_lens verify`` on a CPU-only host, the test suite), and says so once.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import ml_dtypes  # onnx's own dependency: the reference evaluator's bf16 and fp8 arrays
import numpy as np
import onnx
import sympy
import torch
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..codegen.plan import LaunchPlan, ModelPlan, build_plan
from ..errors import InputError, KernelLensError, KernelSourceError, UntracedBranchError
from ..frontends.arguments import constexpr_from_ir, tuple_type
from ..frontends.capture.recorder import interpret_launch
from ..frontends.source import jit_from_ir
from ..ir import DType, GraphIR, KernelIR, KernelParam, ParamKind, parse
from ..ir.types import torch_name
from ..onnx.context import CHECK_OP, DOMAIN
from .evaluate import evaluator
from .signature import CallSignature

log = logging.getLogger(__name__)

MUTATED_PREFIX = "mutated_"
_said = False  # the one line saying the CPU path is the slow checking path


class LaunchRefused(KernelLensError):
    """A launch node refused its inputs, as the generated CUDA op would (a size out of range,
    a dim that disagrees with the IR, no kernel variant for the guards' values)."""


# The dtypes numpy lacks, as ml_dtypes spells them (ONNX's reference evaluator takes those).
_ML_DTYPES = {DType.bf16: ml_dtypes.bfloat16, DType.fp8e4nv: ml_dtypes.float8_e4m3fn,
              DType.fp8e5: ml_dtypes.float8_e5m2}


def to_numpy(t: torch.Tensor, dtype: DType) -> np.ndarray:
    """A CPU tensor's contents as the numpy array ONNX's reference evaluator takes (bf16 and
    fp8 as ml_dtypes arrays, bit for bit)."""
    t = t.detach().contiguous()
    if dtype in _ML_DTYPES:
        raw = t.view(torch.int16 if dtype == DType.bf16 else torch.uint8).numpy()
        return raw.view(_ML_DTYPES[dtype])
    return t.numpy()


def to_torch(a: Any, dtype: DType) -> torch.Tensor:
    """A numpy array (or scalar) of ``dtype`` as a CPU tensor that owns a copy of its contents."""
    a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray makes a 0-d array 1-d)
    if dtype in (DType.bf16, DType.fp8e4nv, DType.fp8e5):
        raw = torch.from_numpy(a.view(np.int16 if dtype == DType.bf16 else np.uint8))
        return raw.view(getattr(torch, torch_name(dtype)))
    return torch.from_numpy(a).to(getattr(torch, torch_name(dtype)))


def poison(shape: Sequence[int], dtype: DType) -> torch.Tensor:
    """What a fresh output holds before its kernel writes it: NaN (floats), 0x5A.. (integers)."""
    tdtype = getattr(torch, torch_name(dtype))
    if dtype.is_float:
        return torch.full(tuple(shape), float("nan"), dtype=tdtype)
    if dtype == DType.i1:
        return torch.ones(tuple(shape), dtype=torch.bool)
    return torch.full(tuple(shape), int("5A" * dtype.itemsize, 16), dtype=tdtype)


class _Exprs:
    """IR expression text evaluated exactly at a node's symbol values (each parsed once)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self._ints: dict[str, Any] = {}
        self._exprs: dict[str, sympy.Basic] = {}

    def int(self, text: str, values: dict[str, int]) -> int:
        fn = self._ints.get(text)
        if fn is None:
            expr = parse(text, self.names)
            used = sorted(s.name for s in expr.free_symbols)
            fn = self._ints[text] = (used, evaluator(expr, used))
        used, f = fn
        return f([values[s] for s in used])

    def value(self, text: str, values: dict[str, int]) -> bool | int:
        """A guard: a truth value or an integer."""
        expr = self._exprs.get(text)
        if expr is None:
            expr = self._exprs[text] = parse(text, self.names)
        got = expr.xreplace({s: sympy.Integer(values[s.name]) for s in expr.free_symbols})
        if got in (sympy.true, sympy.false):
            return bool(got)
        if got.is_Integer:
            return int(got)
        raise KernelLensError(f"guard {text} did not evaluate at {values}: {got}")


class LaunchNode:
    """One launch node of the graph, run by Triton's interpreter as the CUDA op runs it."""

    def __init__(self, plan: LaunchPlan, kernels: dict[str, KernelIR], names: list[str]) -> None:
        self.plan = plan
        self.kernels = kernels
        self.exprs = _Exprs(names)

    def __call__(self, arrays: Sequence[Any]) -> list[np.ndarray]:
        plan = self.plan
        where = f"launch {plan.index} ({plan.kernel})"
        if len(arrays) != len(plan.inputs):
            raise LaunchRefused(f"{where}: the node has {len(arrays)} inputs, the plan {len(plan.inputs)}")
        tensors = [to_torch(a, i.dtype) for a, i in zip(arrays, plan.inputs)]
        values = self._symbols(tensors, where)
        outputs = []
        for o in plan.outputs:
            shape = [self.exprs.int(d, values) for d in o.shape]
            if o.copy_from is not None:
                held = tensors[o.copy_from]
                if list(held.shape) != shape:
                    raise LaunchRefused(f"{where}: output {o.name} holds the contents of input "
                                        f"{o.copy_from} of shape {list(held.shape)}, expected {shape}")
                outputs.append(held.clone())
            else:
                outputs.append(poison(shape, o.dtype))
        kernel = self.kernels[self._variant(values, where)]
        kwargs = self._arguments(kernel, tensors, outputs, values)
        grid = tuple(self.exprs.int(g, values) for g in plan.grid)
        if min(grid) > 0:  # the CUDA op launches nothing for an empty grid
            interpret_launch(self._jit(kernel), (), kwargs, grid)
        return [to_numpy(t, o.dtype) for t, o in zip(outputs, plan.outputs)]

    def _symbols(self, tensors: list[torch.Tensor], where: str) -> dict[str, int]:
        plan = self.plan
        for k, (t, i) in enumerate(zip(tensors, plan.inputs)):
            if t.dim() != i.rank:
                raise LaunchRefused(f"{where}: input {k} ({i.value}) has rank {t.dim()}, expected {i.rank}")
        values = {}
        for s in plan.symbols:
            size = tensors[s.input].shape[s.dim]
            value, rest = divmod(size - s.offset, s.scale)
            if rest or value < s.min or (s.max is not None and value > s.max):
                raise LaunchRefused(f"{where}: dynamic dim {s.name} = {value} (input {s.input} dim "
                                    f"{s.dim} = {size}) is outside [{s.min}, {s.max}]")
            values[s.name] = value
        for c in plan.dim_checks:
            want = self.exprs.int(c.expr, values)
            if tensors[c.input].shape[c.dim] != want:
                raise LaunchRefused(f"{where}: input {c.input} dim {c.dim} is "
                                    f"{tensors[c.input].shape[c.dim]}, expected {c.expr} = {want}")
        return values

    def _variant(self, values: dict[str, int], where: str) -> str:
        got = {g.name: self.exprs.value(g.expr, values) for g in self.plan.guards}
        for case in self.plan.dispatch:
            if all(got.get(name) == want for name, want in case.when.items()):
                return case.kernel
        raise LaunchRefused(f"{where}: no kernel variant was compiled for the guard values {got}")

    def _arguments(self, kernel: KernelIR, tensors: list[torch.Tensor], outputs: list[torch.Tensor],
                   values: dict[str, int]) -> dict[str, Any]:
        leaves: dict[str, Any] = {}
        for p in self.plan.pointers:
            base = (tensors if p.slot == "in" else outputs)[p.index]
            flat = base.view(-1) if base.dim() else base.reshape(1)
            offset = self.exprs.int(p.offset, values) if p.offset is not None else 0
            if flat.element_size() != p.itemsize:
                raise KernelLensError(f"kernel {kernel.name}: parameter {p.param!r} reads "
                                      f"{p.itemsize}-byte elements from a {flat.dtype} tensor")
            leaves[p.param] = flat[offset:]
        for d in self.plan.descriptors:
            leaves[d.param] = TensorDescriptor(
                leaves[d.param], [self.exprs.int(s, values) for s in d.shape],
                [self.exprs.int(s, values) for s in d.strides],
                list(kernel.param(d.param).block_shape), padding="nan" if d.nan else "zero")
        for s in self.plan.scalars:
            if s.expr is not None:
                leaves[s.param] = self.exprs.int(s.expr, values)
            else:
                leaves[s.param] = {"double": float, "bool": bool}.get(s.ctype, int)(s.constant)
        resolve = self._resolver(kernel)
        for p in kernel.leaves():
            if p.kind == ParamKind.constexpr:
                leaves[p.name] = constexpr_from_ir(p.constexpr_value, resolve)
            elif p.name not in leaves:  # a pointer parameter given None
                leaves[p.name] = None
        annotated = {p.name for p in self._jit(kernel).params if p.is_constexpr}
        return {p.name: _assembled(p, leaves, p.name in annotated) for p in kernel.params}

    @staticmethod
    def _resolver(kernel: KernelIR):
        helpers = {h.qualname: h for h in kernel.helpers}

        def resolve(qualname: str) -> Any:
            if qualname not in helpers:
                raise KernelSourceError(f"kernel {kernel.name}: the @triton.jit function {qualname} "
                                        f"it takes is not among its helpers in the IR")
            return jit_from_ir(helpers[qualname], helpers)
        return resolve

    @staticmethod
    def _jit(kernel: KernelIR) -> Any:
        return jit_from_ir(kernel.source, {h.qualname: h for h in kernel.helpers})


def _assembled(p: KernelParam, leaves: dict[str, Any], annotated: bool) -> Any:
    """A parameter's value as the launch passes it: a tuple rebuilt from its leaves; a constexpr
    of a parameter not annotated ``tl.constexpr`` (or inside a tuple) wrapped in
    ``tl.constexpr``, as the user had to pass it (Triton's binder refuses a bare ``tl.dtype``)."""
    if p.kind == ParamKind.tuple:
        return tuple_type(p.type_name, p.fields)(*[_assembled(item, leaves, False) for item in p.items])
    value = leaves[p.name]
    if p.kind == ParamKind.constexpr and not annotated and not isinstance(value, tl.constexpr) \
            and value is not None and not callable(value):
        return tl.constexpr(value)
    return value


def _launch_op_class(domain: str, op_type: str, nodes: dict[int, LaunchNode]) -> type:
    from onnx.reference.op_run import OpRun  # lazy: onnx.reference takes 0.2 s to import

    def _run(self, *arrays, launch=None, **_attributes):
        node = nodes.get(launch)
        if node is None:
            raise KernelLensError(f"the graph's node {op_type} names launch {launch}, which the IR "
                                  f"does not have; the folder's graph and IR come from different "
                                  f"builds: recompile")
        return tuple(node(arrays))

    return type(op_type, (OpRun,), {"op_domain": domain, "_run": _run})


def _check_op_class() -> type:
    """``kernel_lens::Check`` (see :mod:`kernel_lens.onnx.context`): the call stops with the
    node's message where its condition is false."""
    from onnx.reference.op_run import OpRun  # lazy: onnx.reference takes 0.2 s to import

    def _run(self, cond, message=None, **_attributes):
        if not bool(np.asarray(cond).all()):
            text = message.decode() if isinstance(message, bytes) else str(message)
            raise UntracedBranchError(text)
        return (np.zeros((0,), dtype=np.bool_),)

    return type(CHECK_OP, (OpRun,), {"op_domain": DOMAIN, "_run": _run})


def _cumsum_class() -> type:
    """ONNX ``CumSum`` as ONNX Runtime runs it: the axis a 0-D tensor or a 1-D one of one
    element (torchlib's ``repeat_interleave`` gives the latter; ONNX's reference evaluator
    takes only the former)."""
    from onnx.reference.ops.op_cum_sum import CumSum  # lazy: onnx.reference takes 0.2 s

    def _run(self, x, axis=None, exclusive=None, reverse=None):
        if axis is not None and np.asarray(axis).size == 1:
            axis = np.asarray(axis).reshape(())
        return CumSum._run(self, x, axis, exclusive=exclusive, reverse=reverse)

    return type("CumSum", (CumSum,), {"op_domain": "", "_run": _run})


def launch_nodes(model: onnx.ModelProto) -> set[tuple[str, str]]:
    """(domain, op_type) of every node, at any depth, that is a kernel launch (it carries the
    ``launch`` attribute the lowering gives every launch node, whatever the target names it)."""
    found = set()

    def visit(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if any(a.name == "launch" and a.type == onnx.AttributeProto.INT for a in node.attribute):
                found.add((node.domain, node.op_type))
            for a in node.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    visit(a.g)
    visit(model.graph)
    return found


class InterpretedModel:
    """A compiled model's ONNX graph evaluated on the CPU (module docstring); ``run`` takes and
    returns CPU tensors and updates the inputs the model writes, as the CUDA runner does."""

    def __init__(self, ir: GraphIR, model: onnx.ModelProto | str | Path) -> None:
        from onnx.reference import ReferenceEvaluator  # lazy: 0.2 s to import, CPU runs only

        if not isinstance(model, onnx.ModelProto):
            model = onnx.load(str(model))
        self.ir = ir
        self.signature = CallSignature(ir, "cpu")
        self.plan: ModelPlan = build_plan(ir)
        kernels = ir.all_kernels()
        names = list(self.plan.symbols)
        self.nodes = {p.index: LaunchNode(p, kernels, names) for p in self.plan.launches}
        ops = [_launch_op_class(domain, op_type, self.nodes) for domain, op_type in launch_nodes(model)]
        ops += [_check_op_class(), _cumsum_class()]
        self.evaluator = ReferenceEvaluator(model, new_ops=ops)
        self._outputs = [o.name for o in model.graph.output]
        self._written = [ir.inputs.index(n.removeprefix(MUTATED_PREFIX)) for n in self._outputs
                         if n.startswith(MUTATED_PREFIX)]

    def run(self, *tensors: torch.Tensor, out: Sequence[torch.Tensor] | None = None):
        global _said
        call = self.signature.checked(tensors, out, tuple(self._written))
        if not _said:
            _said = True
            log.warning("CPU tensors: evaluating the compiled graph with ONNX's "
                        "reference evaluator and each Triton launch with Triton's interpreter "
                        "(a slow checking path; CUDA tensors run the compiled kernels)")
        specs = self.signature.inputs
        feeds = {spec.name: to_numpy(t, spec.ir_dtype) for spec, t in zip(specs, tensors)}
        try:
            results = self.evaluator.run(None, feeds)
        except KernelLensError:
            raise
        except Exception as exc:  # the reference evaluator raises what its ops raise
            cause = exc
            while cause.__cause__ is not None and not isinstance(cause, KernelLensError):
                cause = cause.__cause__
            if isinstance(cause, KernelLensError):
                raise cause from None
            raise KernelLensError(f"{self.ir.name}: ONNX's reference evaluator failed on the "
                                  f"compiled graph: {type(exc).__name__}: {str(exc)[:300]}") from exc
        by_name = dict(zip(self._outputs, results))
        outputs = []
        for i, (spec, shape) in enumerate(zip(self.signature.outputs, call.shapes)):
            got = to_torch(by_name[f"output_{i}"], spec.ir_dtype)
            if shape is not None and tuple(got.shape) != tuple(shape):
                raise KernelLensError(f"{self.ir.name}: output {i} has shape {tuple(got.shape)}, the "
                                      f"IR says {tuple(shape)}")
            if out is not None:
                out[i].copy_(got)
                got = out[i]
            outputs.append(got)
        for k in self._written:
            name = self.ir.inputs[k]
            tensors[k].copy_(to_torch(by_name[MUTATED_PREFIX + name], specs[k].ir_dtype))
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
