"""The launch plan: what every native target needs to know about each kernel launch, as data.

Built once from the IR (:func:`build_plan`) and rendered by printers: the int64 C++ printer
(``codegen.cxx``) for the shared launch code, TensorRT's ``IExprBuilder`` printer
(``codegen.trt_expr``) for plugin output shapes and workspace sizes. Expressions stay symbolic
(IR expression text over the graph's dimension symbols) until a printer renders them; nothing
here is C++.

Per launch (one graph node):
- ``inputs``/``outputs``: the node's tensors in node order, with dtype and rank; an output's
  shape, byte size, and the input holding its initial contents when the kernel writes in place;
- ``symbols``: which node input and dim each dimension symbol is read from (``(dim - offset) /
  scale``), with its declared range; ``dim_checks``: every other input dim and its expression;
- ``pointers``: each tensor parameter's node slot and element offset (a tensor descriptor's
  base too); ``descriptors``: each tensor descriptor's shape and strides (expressions) and
  padding; ``scalars``: runtime (an expression) or baked (a constant), with the C++ type the
  kernel's ABI converts from;
- ``guards`` and ``dispatch``: which kernel variant runs; ``grid``; ``workspace``: the scratch
  bytes the launch needs at most (over the binaries it may pick), as an expression.
Per kernel: its binaries in dispatch order, each with the assumptions (``predicates``) it was
specialized under and its visible ABI arguments (a tensor descriptor's parts each one argument:
a TMA descriptor to encode, with ``tma``'s parameters, or the base pointer, then shapes and
strides, as Triton's driver passes them).
"""

from __future__ import annotations

from typing import Literal, Optional, Union

import sympy
from pydantic import BaseModel, ConfigDict

from ..errors import UnsupportedKernelError
from ..ir import DType, GraphIR, KernelBinary, KernelIR, Launch, ParamKind, SymExpr, format_expr, parse
from .launch_io import launch_io

SCRATCH_ALIGN = 256  # bytes: each scratch buffer starts at this alignment inside a workspace


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


class PlanInput(_Model):
    value: str          # the IR value
    dtype: DType
    rank: int


class PlanOutput(_Model):
    value: str          # the IR value written (its root)
    name: str           # the node output's name (a new version of ``value`` unless fresh)
    dtype: DType
    shape: list[SymExpr]
    nbytes: SymExpr
    copy_from: Optional[int]  # node input holding the initial contents (in-place), or None


class SymbolRead(_Model):
    """``name = (dims of node input `input` at `dim` - offset) / scale``, within [min, max]."""

    name: str
    input: int
    dim: int
    scale: int = 1
    offset: int = 0
    min: int
    max: Optional[int]


class DimCheck(_Model):
    input: int
    dim: int
    expr: SymExpr


class PointerArg(_Model):
    param: str
    slot: Literal["in", "out"]
    index: int                # node input or output index
    offset: SymExpr           # elements from the tensor's start
    itemsize: int


class DescriptorArg(_Model):
    """A tensor descriptor: its base is a pointer (``pointers``); these are its own fields."""

    param: str
    shape: list[SymExpr]
    strides: list[SymExpr]   # in elements
    nan: bool                # padding="nan"


class ScalarArg(_Model):
    """A scalar parameter: ``expr`` evaluated per call (runtime) or ``constant`` (baked)."""

    param: str
    ctype: Literal["int64_t", "uint64_t", "double", "bool"]
    expr: Optional[SymExpr] = None
    constant: Union[bool, int, float, None] = None


class Guard(_Model):
    name: str
    expr: str  # a boolean IR expression, or an integer one for a constexpr computed from sizes
    kind: Literal["bool", "int"] = "bool"


class DispatchCase(_Model):
    when: dict[str, Union[bool, int, float, str]]
    kernel: str


class Predicate(_Model):
    """An assumption a binary was specialized under, on a pointer (``p``) or scalar (``v``)."""

    param: str
    local: Literal["p", "v"]
    check: Literal["aligned16", "divisible16", "equal_to_1", "int32"]


class AbiArg(_Model):
    name: str           # the parameter
    pointer: bool
    ctype: str          # the ABI's C type (scalars)
    part: Literal["value", "tma", "shape", "stride", "nan"] = "value"  # of a tensor descriptor
    dim: Optional[int] = None


class TmaPlan(_Model):
    """How to encode one descriptor's CUtensorMap for a binary (Triton's fill_tma_descriptor)."""

    elem_type: int      # CUtensorMapDataType as the host API numbers it
    elem_size: int
    swizzle: int
    block: list[int]
    fp4_padded: bool


class BinaryPlan(_Model):
    index: int
    predicates: list[Predicate]
    args: list[AbiArg]
    tma: dict[str, TmaPlan] = {}  # descriptor parameter -> its encoding, when passed as TMA


class LaunchPlan(_Model):
    index: int
    order: int
    kernel: str
    inputs: list[PlanInput]
    outputs: list[PlanOutput]
    symbols: list[SymbolRead]
    dim_checks: list[DimCheck]
    pointers: list[PointerArg]
    descriptors: list[DescriptorArg]
    scalars: list[ScalarArg]
    guards: list[Guard]
    dispatch: list[DispatchCase]
    grid: tuple[SymExpr, SymExpr, SymExpr]
    workspace: SymExpr


class ModelPlan(_Model):
    name: str
    symbols: list[str]
    launches: list[LaunchPlan]
    kernels: dict[str, list[BinaryPlan]]


def _numel_bytes(shape: list[str], itemsize: int, names: list[str]) -> str:
    numel = sympy.Integer(1)
    for s in shape:
        numel *= parse(s, names)
    return format_expr(numel * itemsize)


def _binaries(kernel: KernelIR) -> list[BinaryPlan]:
    plans = []
    for bi, binary in enumerate(kernel.binaries):
        if binary.num_ctas != 1:
            raise UnsupportedKernelError(f"kernel {kernel.name}: num_ctas={binary.num_ctas} (thread-block "
                                         f"clusters) is not supported by the kernel_lens launcher yet")
        predicates = []
        for pname, spec in binary.assumptions.items():
            local = "p" if kernel.param(pname).kind == ParamKind.tensor else "v"
            for check in ("aligned16", "divisible16", "equal_to_1", "int32"):
                if getattr(spec, check):
                    predicates.append(Predicate(param=pname, local=local, check=check))
        args = []
        for abi in binary.abi:
            if abi.hidden:
                continue
            param = kernel.param(abi.name)
            pointer = param.binds_tensor and abi.part == "value"
            if param.kind == ParamKind.scalar and param.dtype in (DType.fp16, DType.bf16,
                                                                 DType.fp8e4nv, DType.fp8e5):
                raise UnsupportedKernelError(
                    f"kernel {kernel.name}: scalar {abi.name!r} is annotated {param.dtype.value}; "
                    f"only fp32/fp64 float scalars are supported (pass a Python float)")
            args.append(AbiArg(name=abi.name, pointer=pointer, ctype=abi.c_type, part=abi.part,
                               dim=abi.dim))
        descriptors = [p for p in kernel.leaves() if p.kind == ParamKind.tensordesc]
        tma = {}
        for param, meta in zip(descriptors, binary.tensordesc_meta or []):
            if meta is not None:
                tma[param.name] = TmaPlan(elem_type=_TMA_HOST_TYPE.get(meta.elem_type, meta.elem_type),
                                          elem_size=meta.elem_size, swizzle=meta.swizzle,
                                          block=list(meta.block_size), fp4_padded=meta.fp4_padded)
        plans.append(BinaryPlan(index=bi, predicates=predicates, args=args, tma=tma))
    return plans


# Triton numbers the TMA element types on the device side slightly differently from the host
# API's CUtensorMapDataType (triton/backends/nvidia/driver.py: TMA_DTYPE_DEVICE_TO_HOST).
_TMA_HOST_TYPE = {8: 10, 9: 8, 10: 9}


def _workspace(binaries: list[KernelBinary], grid: list[sympy.Expr]) -> sympy.Expr:
    """Scratch bytes of the launch at most: per binary, its global and profile scratch for
    every program (each buffer padded to ``SCRATCH_ALIGN``); the largest over ``binaries``."""
    programs = grid[0] * grid[1] * grid[2]
    sizes = []
    for b in binaries:
        total = sympy.Integer(0)
        for per_program in (b.global_scratch_size, b.profile_scratch_size):
            if per_program:
                total += SCRATCH_ALIGN * sympy.ceiling(per_program * b.num_ctas * programs / SCRATCH_ALIGN)
        sizes.append(total)
    return sympy.Max(*sizes) if len(sizes) > 1 else (sizes[0] if sizes else sympy.Integer(0))


def _scalar(param_dtype: DType, arg) -> ScalarArg:
    if arg.expr is not None:
        return ScalarArg(param=arg.name, ctype="int64_t", expr=arg.expr)
    if param_dtype.is_float:  # passed to the kernel as its ABI type (float/double)
        return ScalarArg(param=arg.name, ctype="double", constant=float(arg.constant))
    if param_dtype == DType.i1:
        return ScalarArg(param=arg.name, ctype="bool", constant=bool(arg.constant))
    value = int(arg.constant)
    return ScalarArg(param=arg.name, ctype="uint64_t" if value >= 2**63 else "int64_t", constant=value)


def plan_launch(ir: GraphIR, index: int, launch: Launch) -> LaunchPlan:
    names = ir.symbol_names()
    ranges = ir.symbol_ranges()
    io = launch_io(ir, launch, f"__{launch.order}")
    if not io.inputs:
        raise UnsupportedKernelError(
            f"launch {index} of kernel {launch.kernel} reads no tensor and has no dynamic "
            f"dims; kernel_lens nodes need at least one input")
    symbols = [SymbolRead(name=sym, input=src.input, dim=src.dim, scale=src.scale, offset=src.offset,
                          min=ranges[sym][0], max=ranges[sym][1])
               for sym, src in io.symbols.items()]
    sources = {(src.input, src.dim) for src in io.symbols.values() if src.scale == 1 and not src.offset}
    dim_checks = [DimCheck(input=k, dim=d, expr=text)  # every other input dim must agree with the IR
                  for k, value in enumerate(io.inputs)
                  for d, text in enumerate(ir.values[value].shape) if (k, d) not in sources]
    inputs = [PlanInput(value=v, dtype=ir.values[v].dtype, rank=len(ir.values[v].shape)) for v in io.inputs]
    outputs = []
    for root, name in io.outputs:
        v = ir.values[root]
        outputs.append(PlanOutput(value=root, name=name, dtype=v.dtype, shape=list(v.shape),
                                  nbytes=_numel_bytes(v.shape, v.dtype.itemsize, names),
                                  copy_from=io.copy_from[root]))
    kernel = ir.kernels[launch.kernel]
    pointers, descriptors, scalars = [], [], []
    for arg in launch.args:
        param = kernel.param(arg.name)
        if param.binds_tensor and arg.value is not None:
            slot, k = io.bindings[arg.name]
            pointers.append(PointerArg(param=arg.name, slot=slot, index=k, offset=arg.storage_offset,
                                       itemsize=param.dtype.itemsize))
        if param.kind == ParamKind.tensordesc:
            descriptors.append(DescriptorArg(param=arg.name, shape=list(arg.desc_shape),
                                             strides=list(arg.desc_strides),
                                             nan=arg.constant == "nan"))
        elif param.kind == ParamKind.scalar:
            scalars.append(_scalar(param.dtype, arg))
    dispatch = [DispatchCase(when=dict(d.when), kernel=d.kernel) for d in launch.dispatch] or \
        [DispatchCase(when={}, kernel=launch.kernel)]
    grid = [parse(g, names) for g in launch.grid]
    binaries = [b for case in dispatch for b in ir.kernels[case.kernel].binaries]
    return LaunchPlan(index=index, order=launch.order, kernel=launch.kernel, inputs=inputs,
                      outputs=outputs, symbols=symbols, dim_checks=dim_checks, pointers=pointers,
                      descriptors=descriptors, scalars=scalars, guards=[Guard(name=g, expr=t, kind=_guard_kind(launch, g))
                                               for g, t in launch.guards.items()],
                      dispatch=dispatch, grid=tuple(launch.grid),
                      workspace=format_expr(_workspace(binaries, grid)))


def _guard_kind(launch: Launch, name: str) -> str:
    values = [d.when[name] for d in launch.dispatch if name in d.when]
    return "int" if any(not isinstance(v, bool) for v in values) else "bool"


def build_plan(ir: GraphIR) -> ModelPlan:
    """The launch plan of every launch of ``ir`` and the binaries of every kernel they run; for a
    model split by size, every piece's launches, numbered piece after piece (as the ONNX
    lowering numbers its launch nodes)."""
    launches = []
    for graph in ir.graphs():
        offset = len(launches)
        launches += [plan_launch(graph, offset + i, launch) for i, launch in enumerate(graph.launches)]
    kernels = ir.all_kernels()
    used = dict.fromkeys(case.kernel for p in launches for case in p.dispatch)
    symbols = list(dict.fromkeys(s for g in [ir, *ir.graphs()] for s in g.symbol_names()))
    return ModelPlan(name=ir.name, symbols=symbols, launches=launches,
                     kernels={k: _binaries(kernels[k]) for k in used})
