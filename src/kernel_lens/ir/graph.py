"""GraphIR: the whole captured model — inputs, symbols, torch ops, kernel launches, kernels.

This document is the only contract between front-ends, passes and targets.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..archs import names as arch_names
from ..errors import IRError, SymbolicError
from ..fileio import atomic_write
from .kernel import DIGEST, Arch, Base64Bytes, ConstexprValue, KernelIR, ParamKind
from .names import Identifier, MAX_NAME
from .symbolic import SymbolInfo, SymExpr, parse, symbol
from .types import DType

SCHEMA_VERSION = "1.8"

# What one document may hold: far past any model (an 80-layer LLM launches a few thousand
# kernels), near enough that a crafted document is refused before it costs seconds or gigabytes.
MAX_SYMBOLS = 256
MAX_VALUES = 262_144
MAX_OPS = 65_536
MAX_LAUNCHES = 4_096
MAX_KERNELS = 1_024
MAX_PIECES = 64
MAX_BOXES = 256  # size boxes across all pieces
MAX_DEPTH = 64  # JSON nesting (a real document nests about 12 deep; pydantic's checks of a deeply
                # nested union cost time that grows with every level past ~250)
UNBOUNDED = 1 << 62  # the top of a declared range with no max, in a size box


class _Model(BaseModel):
    # Float constants (scalar kernel arguments) may be inf or nan: JSON gets Infinity/NaN.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")


def _one_nan(value: object) -> object:
    """Every float nan becomes the one ``math.nan`` object: pydantic's ``==`` compares field
    dicts (identity first), so an IR holding a nan stays equal to itself across a JSON round trip."""
    return math.nan if isinstance(value, float) and value != value else value


ScalarConstant = Annotated[ConstexprValue, AfterValidator(_one_nan)]


class TensorValue(_Model):
    """A tensor flowing through the graph: a graph input, a weight, or an intermediate."""

    name: Identifier
    dtype: DType
    shape: list[SymExpr]
    strides: list[SymExpr]
    kind: Literal["input", "constant", "intermediate"]

    @model_validator(mode="after")
    def _one_stride_per_dim(self) -> "TensorValue":
        if len(self.strides) != len(self.shape):
            raise ValueError(f"value {self.name}: {len(self.shape)} dims but {len(self.strides)} strides")
        return self


class ConstantData(_Model):
    """Raw contents of a weight or buffer the model owns (little-endian, row-major)."""

    dtype: DType
    shape: list[Annotated[int, Field(ge=0)]]
    data: Base64Bytes

    @model_validator(mode="after")
    def _data_fills_the_shape(self) -> "ConstantData":
        want = math.prod(self.shape) * self.dtype.itemsize
        if len(self.data) != want:
            raise ValueError(f"a {self.dtype.value} constant of shape {self.shape} holds {want} bytes, "
                             f"not {len(self.data)}")
        return self


# Arguments of torch ops: references to tensors, symbolic ints, constants, lists of those.
class ValueArg(_Model):
    ref: Identifier


class SymArg(_Model):
    sym: SymExpr


class ConstArg(_Model):
    const: Union[bool, int, float, str, None]


class ListArg(_Model):
    items: list["OpArg"]


OpArg = Union[ValueArg, SymArg, ConstArg, ListArg]
ListArg.model_rebuild()


class TorchOp(_Model):
    """A PyTorch (ATen) operation between kernel launches, as torch.export recorded it."""

    order: int = Field(description="position in program order, shared with launches")
    op: str = Field(description="ATen overload, e.g. 'aten.empty_like.default'")
    args: list[OpArg] = Field(default_factory=list)
    kwargs: dict[str, OpArg] = Field(default_factory=dict)
    outputs: list[Identifier] = Field(description="names of the tensors it produces")
    aliases: list[Identifier] = Field(
        default_factory=list, description="input tensors its outputs may share memory with (views, in-place)"
    )


ArgRole = Literal["input", "output", "inplace", "scalar", "constexpr"]


class LaunchArg(_Model):
    """How one kernel parameter is bound at one launch."""

    name: Identifier
    role: ArgRole | None = Field(description="None only before role inference")
    value: Identifier | None = Field(default=None, description="tensor parameters: the tensor's name")
    expr: SymExpr | None = Field(
        default=None, description="integer scalars: the value as an expression of graph dims"
    )
    constant: ScalarConstant = Field(
        default=None, description="float/bool scalars and constexprs: the value; tensor "
        "descriptors: the padding ('zero' or 'nan')"
    )
    shape: list[SymExpr] | None = Field(default=None, description="tensors: shape at the launch")
    strides: list[SymExpr] | None = Field(default=None, description="tensors: strides, in elements")
    storage_offset: SymExpr | None = Field(default=None, description="tensors: offset, in elements")
    desc_shape: list[SymExpr] | None = Field(
        default=None, description="tensor descriptors: the descriptor's shape (of the tensor it "
        "reads, from `value`'s storage offset on)")
    desc_strides: list[SymExpr] | None = Field(
        default=None, description="tensor descriptors: the descriptor's strides, in elements")


class Dispatch(_Model):
    """Which kernel specialization serves a launch for given values of its guarded constexprs."""

    when: dict[Identifier, Union[bool, int]] = Field(
        description="guard name -> its value: a truth value (heuristics) or an integer (a "
        "constexpr computed from sizes, e.g. next_power_of_2(n), one binary per value)")
    kernel: Identifier


class Launch(_Model):
    """One kernel launch, in program order."""

    order: int = Field(description="position in program order, shared with torch ops")
    kernel: Identifier = Field(description="key into GraphIR.kernels")
    grid: tuple[SymExpr, SymExpr, SymExpr]
    args: list[LaunchArg] = Field(description="one per kernel parameter, in signature order")
    captured_grid: tuple[int, int, int] = Field(description="the grid seen during capture")
    guards: dict[Identifier, SymExpr] = Field(
        default_factory=dict,
        description="constexprs computed from dynamic dims (e.g. by @triton.heuristics, or "
        "next_power_of_2 of a size): name -> boolean or integer sympy expression over graph dims, "
        "evaluated at run time",
    )
    dispatch: list[Dispatch] = Field(
        default_factory=list,
        description="with guards: the kernel to launch for each combination of guard values",
    )


class SizeBox(_Model):
    """A box of sizes: each listed symbol within [min, max] (inclusive); others anywhere in their
    declared range."""

    ranges: dict[Identifier, tuple[int, int]]

    def contains(self, values: dict[str, int]) -> bool:
        return all(lo <= values[s] <= hi for s, (lo, hi) in self.ranges.items())


class SizePiece(_Model):
    """Part of the declared ranges served by a graph of its own: the model's Python code branches
    on a size, so torch.export traced one branch per piece (see ``GraphIR.pieces``)."""

    when: list[SizeBox] = Field(min_length=1, description="the sizes it serves: any of these boxes")
    graph: "GraphIR" = Field(description="a complete graph for those sizes (it has no pieces)")


class ValueBranch(_Model):
    """One path through a forward that branches on tensor values, traced from one example
    (see ``GraphIR.branches``): its graph's ``checks`` say when it serves a call."""

    example: int = Field(ge=0, description="the example that took it: 0 the example inputs, "
                         "k the k-th of extra_examples")
    graph: "GraphIR" = Field(description="a complete graph for the calls its checks admit (it has "
                             "no pieces and no branches)")


class RuntimeSymbol(_Model):
    """A size that comes from tensor VALUES, not from input shapes (a ``nonzero()`` count, an
    ``.item()`` used as a size): the graph computes it at run time, at position ``order``, and
    launches read it like any other size."""

    order: int = Field(description="position in program order where it becomes known")
    value: Identifier = Field(description="the tensor it is read from")
    dim: int | None = Field(default=None, ge=0, description="its dim ``dim``; None: the value of "
                            "its one element (``.item()``)")
    carrier: Identifier | None = Field(
        default=None, description="``.item()`` symbols: a tensor of no elements and shape "
        "[symbol, 0] made at ``order``, through which launches read the symbol from a dim")
    min: int = Field(default=0, ge=0, description="smallest value the model's code allows")
    max: int | None = Field(default=None, description="largest value the model's code allows")
    example: int = Field(description="its value in the example run")
    where: str = Field(default="", max_length=4 * MAX_NAME, description="the model's line that made it")

    @model_validator(mode="after")
    def _carried(self) -> "RuntimeSymbol":
        if (self.dim is None) != (self.carrier is not None):
            raise ValueError("an .item() symbol (dim None) has a carrier; a dim symbol has none")
        if self.max is not None and self.max < self.min:
            raise ValueError(f"its range [{self.min}, {self.max}] is empty (max < min)")
        return self


class RuntimeCheck(_Model):
    """A condition on sizes (run-time symbols among them) that the traced graph needs: the
    model's Python code branched on tensor values and the example took this way. A call where
    it is false stops with an error naming ``where`` (no traced graph serves it)."""

    order: int = Field(description="position in program order where it is checked")
    cond: SymExpr = Field(description="boolean expression over symbols that must hold")
    where: str = Field(default="", max_length=4 * MAX_NAME, description="the model's line that branched")


def _check_scalar(order: int, kernel: KernelIR, arg: "LaunchArg") -> None:
    """A scalar argument given as a constant holds a value of its parameter's type."""
    try:
        dtype = kernel.param(arg.name).dtype
    except KeyError:
        raise ValueError(f"launch {order}: argument {arg.name!r} is not a parameter of kernel "
                         f"{kernel.name}") from None
    value = arg.constant
    if dtype is None:
        return
    if dtype.is_float:
        ok = isinstance(value, (int, float))
    elif dtype == DType.i1:
        ok = isinstance(value, bool) or value in (0, 1)
    else:
        bits = dtype.itemsize * 8
        lo, hi = (0, 2 ** bits - 1) if dtype.value.startswith("u") else (-2 ** (bits - 1), 2 ** bits - 1)
        ok = isinstance(value, int) and lo <= value <= hi
    if not ok:
        raise ValueError(f"launch {order}: scalar argument {arg.name!r} is {value!r}, not a "
                         f"{dtype.value} value (kernel {kernel.name}'s parameter type)")


_ROLES = {ParamKind.tensor: ("input", "output", "inplace"), ParamKind.tensordesc: ("input", "output", "inplace"),
          ParamKind.scalar: ("scalar",), ParamKind.constexpr: ("constexpr",)}


def _check_launch(launch: "Launch", kernel: KernelIR, names: set[str]) -> None:
    """A launch's own names: one argument per parameter of its kernel, in order, with a role its
    kind takes, a tensor descriptor's shape and strides as long as its rank, every expression
    (arguments, grid, guards) over declared symbols, and dispatch conditions on its own guards."""
    where = f"launch {launch.order} ({kernel.name})"
    leaves = kernel.leaves()
    if [a.name for a in launch.args] != [p.name for p in leaves]:
        raise ValueError(f"{where}: binds {[a.name for a in launch.args]}; the kernel's parameters "
                         f"are {[p.name for p in leaves]} (one argument each, in signature order)")
    for arg, param in zip(launch.args, leaves):
        if arg.role is not None and arg.role not in _ROLES[param.kind]:
            raise ValueError(f"{where}: argument {arg.name!r} has role {arg.role!r}; a "
                             f"{param.kind.value} parameter takes {' or '.join(_ROLES[param.kind])}")
        if param.binds_tensor and arg.role is not None and arg.value is None:
            raise ValueError(f"{where}: tensor argument {arg.name!r} names no value")
        if arg.shape is not None and len(arg.strides or ()) != len(arg.shape):
            raise ValueError(f"{where}: argument {arg.name!r} has {len(arg.shape)} dims but "
                             f"{len(arg.strides or ())} strides")
        if param.kind == ParamKind.tensordesc and not (
                len(arg.desc_shape or ()) == len(arg.desc_strides or ()) == param.rank):
            raise ValueError(f"{where}: tensor descriptor {arg.name!r} of rank {param.rank} has "
                             f"{len(arg.desc_shape or ())} shape and {len(arg.desc_strides or ())} "
                             f"stride entries")
        texts = [arg.expr, arg.storage_offset, *(arg.shape or ()), *(arg.strides or ()),
                 *(arg.desc_shape or ()), *(arg.desc_strides or ())]
        _declared(where, f"argument {arg.name!r}", [t for t in texts if t is not None], names)
    _declared(where, "grid", list(launch.grid), names)
    _declared(where, "guards", list(launch.guards.values()), names)
    for case in launch.dispatch:
        unknown = set(case.when) - set(launch.guards)
        if unknown:
            raise ValueError(f"{where}: dispatch on {sorted(unknown)}, which are not guards of the launch")


def _declared(where: str, what: str, texts: list[str], names: set[str]) -> None:
    unknown = {s.name for text in texts for s in parse(text).free_symbols} - names
    if unknown:
        raise ValueError(f"{where}: {what} uses undeclared symbols {sorted(unknown)}")


class GraphIR(_Model):
    """A model whose forward launches Triton kernels, lifted into data.

    A model whose Python code branches on sizes has ``pieces``: each serves part of the declared
    ranges with a graph of its own, and a call runs the first piece whose boxes hold its sizes.
    The top level then keeps only the interface (inputs, outputs, symbols with their declared
    ranges); ``ops``, ``launches`` and ``kernels`` live in the pieces' graphs, and kernel ids are
    unique across pieces (targets build every piece into one library)."""

    schema_version: str = SCHEMA_VERSION
    name: Identifier = Field(description="safe identifier of the model: file stems, C++ and ONNX "
                             "names are made from it")
    display_name: str = Field(default="", max_length=4 * MAX_NAME,
                              description="the model's own name as the user wrote it (display only; "
                              "never used in a path, C++ or ONNX)")
    arch: Arch = Field(description="compute capability the capture ran for; the kernels' binaries "
                      "are built for it and for any further archs asked for (see built_archs)")
    symbols: dict[Identifier, SymbolInfo] = Field(
        default_factory=dict, max_length=MAX_SYMBOLS,
        description="dimension symbol -> which graph input and dim it is")
    inputs: list[Identifier] = Field(description="graph inputs, by value name, in call order")
    outputs: list[Identifier] = Field(description="graph outputs, by value name, in return order")
    values: dict[Identifier, TensorValue] = Field(default_factory=dict, max_length=MAX_VALUES)
    constants: dict[Identifier, ConstantData] = Field(default_factory=dict)
    ops: list[TorchOp] = Field(default_factory=list, max_length=MAX_OPS)
    launches: list[Launch] = Field(default_factory=list, max_length=MAX_LAUNCHES)
    kernels: dict[Identifier, KernelIR] = Field(default_factory=dict, max_length=MAX_KERNELS)
    runtime_symbols: dict[Identifier, RuntimeSymbol] = Field(
        default_factory=dict, max_length=MAX_SYMBOLS,
        description="sizes computed from tensor values at run time (nonzero counts, .item()): "
        "symbol -> the value and position it is read from")
    checks: list[RuntimeCheck] = Field(
        default_factory=list, max_length=MAX_OPS,
        description="conditions on tensor values the traced graph needs, checked at run time")
    facts: list[str] = Field(
        default_factory=list, description="what the IR is known to satisfy (passes' 'provides')"
    )
    passes_run: list[str] = Field(default_factory=list, description="passes applied, in order")
    graph_passes: list[Identifier] = Field(
        default_factory=list, max_length=64,
        description="optimizations the lowering applies to the ONNX graph, in this order "
        "(kernel_lens.compile's optimize=: names of kernel_lens.onnx.graph_passes; empty: none)")
    proven_at: list[dict[Identifier, int]] = Field(
        default_factory=list, max_length=2 * MAX_PIECES,
        description="sizes (symbol -> value) besides the example at which the front end captured "
        "and traced the model again and found this graph: the same ops, constants and launches "
        "(grids, scalars, constexprs). Empty: traced at its example only (a size range torch "
        "reasons about soundly; see docs/usage.md, 'Size pieces proven at their ends')")
    pieces: list[SizePiece] = Field(
        default_factory=list, max_length=MAX_PIECES, description="size branches: the graphs serving parts of the declared "
        "ranges, tried in order (empty: one graph, this one, serves every size)")
    branches: list[ValueBranch] = Field(
        default_factory=list, max_length=MAX_PIECES, description="value branches: graphs traced "
        "from several examples that took different branches on tensor values, tried in order; the "
        "first whose checks hold serves the call, and a call no branch admits fails with the last "
        "branch's check (empty: one graph)")

    @model_validator(mode="before")
    @classmethod
    def _within_limits(cls, data):
        """Sizes checked before anything is validated: a crafted document costs no time."""
        if isinstance(data, dict):
            for field, limit in (("symbols", MAX_SYMBOLS), ("values", MAX_VALUES), ("ops", MAX_OPS),
                                 ("launches", MAX_LAUNCHES), ("kernels", MAX_KERNELS),
                                 ("pieces", MAX_PIECES), ("branches", MAX_PIECES)):
                held = data.get(field)
                if isinstance(held, (list, dict)) and len(held) > limit:
                    raise ValueError(f"{field} holds {len(held)} entries; an IR holds at most "
                                     f"{limit} (a limit of kernel_lens, far past any real model)")
        return data

    @model_validator(mode="after")
    def _pieces_are_consistent(self) -> "GraphIR":
        if not self.pieces:
            return self
        if self.ops or self.launches or self.kernels:
            raise ValueError("a graph with pieces keeps its ops, launches and kernels in the pieces")
        owners: dict[str, int] = {}
        for k, piece in enumerate(self.pieces):
            g = piece.graph
            if g.pieces:
                raise ValueError(f"piece {k}: a piece's graph has no pieces of its own (it may "
                                 f"have value branches)")
            if g.inputs != self.inputs or len(g.outputs) != len(self.outputs):
                raise ValueError(f"piece {k}: its graph takes inputs {g.inputs} and gives "
                                 f"{len(g.outputs)} outputs; the model takes {self.inputs} and gives "
                                 f"{len(self.outputs)}")
            unknown = {s for box in piece.when for s in box.ranges} - set(self.symbols)
            if unknown | (set(g.symbols) - set(self.symbols)):
                raise ValueError(f"piece {k} uses undeclared symbols "
                                 f"{sorted(unknown | (set(g.symbols) - set(self.symbols)))}")
            for kid in g.all_kernels():
                if owners.setdefault(kid, k) != k:
                    raise ValueError(f"kernel id {kid!r} is used by pieces {owners[kid]} and {k}; "
                                     f"kernel ids are unique across pieces")
        self._pieces_tile_the_ranges()
        return self

    @model_validator(mode="after")
    def _branches_are_consistent(self) -> "GraphIR":
        """Branches hold the whole graph (the top level only the interface), each takes the
        model's inputs and gives its outputs, every branch has checks (a branch without any
        would serve every call, and the branches after it none), and kernel ids are unique."""
        if not self.branches:
            return self
        if self.pieces:
            raise ValueError("a graph has size pieces or value branches, not both")
        if len(self.branches) < 2:
            raise ValueError("value branches come two or more (one branch is a plain graph)")
        if self.ops or self.launches or self.kernels or self.runtime_symbols or self.checks:
            raise ValueError("a graph with value branches keeps its ops, launches, kernels, run-time "
                             "symbols and checks in the branches")
        owners: dict[str, int] = {}
        for k, branch in enumerate(self.branches):
            g = branch.graph
            if g.pieces or g.branches:
                raise ValueError(f"branch {k}: a branch's graph has no pieces or branches of its own")
            if g.inputs != self.inputs or len(g.outputs) != len(self.outputs):
                raise ValueError(f"branch {k}: its graph takes inputs {g.inputs} and gives "
                                 f"{len(g.outputs)} outputs; the model takes {self.inputs} and gives "
                                 f"{len(self.outputs)}")
            if set(g.symbols) - set(self.symbols):
                raise ValueError(f"branch {k} uses undeclared symbols "
                                 f"{sorted(set(g.symbols) - set(self.symbols))}")
            if not g.checks:
                raise ValueError(f"branch {k} has no checks: it would serve every call")
            for i, (top, mine) in enumerate(zip(self.outputs, g.outputs)):
                want, got = self.values[top], g.values[mine]
                if (got.dtype, len(got.shape)) != (want.dtype, len(want.shape)):
                    raise ValueError(f"branch {k}: output {i} is {got.dtype.value} of rank "
                                     f"{len(got.shape)}, the model's {want.dtype.value} of rank "
                                     f"{len(want.shape)}")
            for kid in g.kernels:
                if owners.setdefault(kid, k) != k:
                    raise ValueError(f"kernel id {kid!r} is used by branches {owners[kid]} and {k}; "
                                     f"kernel ids are unique across branches")
        for i, top in enumerate(self.outputs):  # the runner binds outputs by the model's shape
            shapes = {tuple(b.graph.values[b.graph.outputs[i]].shape) for b in self.branches}
            if len(shapes) == 1 and shapes != {tuple(self.values[top].shape)}:
                raise ValueError(f"output {i} has shape {self.values[top].shape}, every branch "
                                 f"{list(next(iter(shapes)))}")
        return self

    def _pieces_tile_the_ranges(self) -> None:
        """The pieces' boxes are non-empty, inside the declared ranges, pairwise disjoint, and
        together cover every size of the declared ranges: a call's sizes fall in exactly one box,
        so ``run()`` (the first piece that holds them) and the ONNX graph (each piece's ``If``,
        the last one where no other matched) pick the same piece."""
        boxes = [(k, box) for k, piece in enumerate(self.pieces) for box in piece.when]
        if len(boxes) > MAX_BOXES:
            raise ValueError(f"the pieces hold {len(boxes)} size boxes; at most {MAX_BOXES}")
        named = sorted({s for _, box in boxes for s in box.ranges})
        declared = {s: (self.symbols[s].min, UNBOUNDED if self.symbols[s].max is None
                        else self.symbols[s].max) for s in named}
        spans = []
        for k, box in boxes:
            for s, (lo, hi) in box.ranges.items():
                if not declared[s][0] <= lo <= hi <= declared[s][1]:
                    raise ValueError(f"piece {k}: {s} in [{lo}, {hi}] is empty or outside the declared "
                                     f"range [{declared[s][0]}, {self.symbols[s].max}]")
            spans.append((k, [box.ranges.get(s, declared[s]) for s in named]))
        for i, (k, a) in enumerate(spans):
            for j, b in spans[i + 1:]:
                if all(lo <= hi2 and lo2 <= hi for (lo, hi), (lo2, hi2) in zip(a, b)):
                    raise ValueError(f"pieces {k} and {j} overlap (both serve "
                                     f"{dict(zip(named, (max(x[0], y[0]) for x, y in zip(a, b))))}); "
                                     f"a size must fall in exactly one piece")
        volume = sum(math.prod(hi - lo + 1 for lo, hi in span) for _, span in spans)
        if volume != math.prod(hi - lo + 1 for lo, hi in declared.values()):
            ranges = ", ".join(f"{s} in [{self.symbols[s].min}, {self.symbols[s].max}]" for s in named)
            raise ValueError(f"the pieces leave sizes of the declared ranges ({ranges}) in no piece")

    @model_validator(mode="after")
    def _archs_are_consistent(self) -> "GraphIR":
        """Every kernel is built for the same archs, ``arch`` among them: the launch code picks
        one arch for the device and runs that arch's binaries only."""
        built = {kid: sorted({b.arch for b in k.binaries}) for kid, k in self.all_kernels().items()
                 if k.binaries}
        first, want = next(iter(built.items()), (None, None))
        bare = [kid for kid in self.all_kernels() if kid not in built]
        if built and bare:
            raise ValueError(f"kernel {bare[0]!r} has no binaries; kernel {first!r} has binaries for "
                             f"{arch_names(want)}: every kernel is built for the same archs")
        for kid, archs in built.items():
            if archs != want:
                raise ValueError(f"kernel {kid!r} has binaries for {arch_names(archs)} but kernel "
                                 f"{first!r} for {arch_names(want)}; every kernel is built for the "
                                 f"same archs")
            if self.arch not in archs:
                raise ValueError(f"arch is sm_{self.arch} but kernel {kid!r} has binaries for "
                                 f"{arch_names(archs)} only")
        return self

    def built_archs(self) -> list[tuple[int, bool]]:
        """The archs the kernels are built for, ascending, each with whether it runs on exactly
        that arch (a binary's PTX targets its ``a`` variant) or also, JIT-compiled from PTX, on
        later ones (the input of :func:`kernel_lens.archs.pick_arch`)."""
        specific: dict[int, bool] = {}
        for kernel in self.all_kernels().values():
            for b in kernel.binaries:
                specific[b.arch] = specific.get(b.arch, False) or b.arch_specific
        return sorted(specific.items()) or [(self.arch, False)]

    def parts(self) -> list[Union[SizePiece, ValueBranch]]:
        """The size pieces or the value branches (each holds a ``graph``); empty for one graph."""
        return [*self.pieces, *self.branches]

    def graphs(self) -> list["GraphIR"]:
        """The graphs that run: this one, or each piece's and each value branch's (a piece's
        graph may have value branches: then each of them), in the order targets number them."""
        return [g for p in self.parts() for g in p.graph.graphs()] or [self]

    def all_kernels(self) -> dict[str, KernelIR]:
        """Every kernel of every graph that runs, by id."""
        return {kid: k for g in self.graphs() for kid, k in g.kernels.items()}

    def piece_for(self, values: dict[str, int]) -> "GraphIR":
        """The graph serving sizes ``values`` (symbol -> value): this one, or the first piece
        whose boxes hold them."""
        if not self.pieces:
            return self
        for piece in self.pieces:
            if any(box.contains(values) for box in piece.when):
                return piece.graph
        raise IRError(f"no piece of {self.name} serves the sizes {values}")

    @model_validator(mode="after")
    def _references_resolve(self) -> "GraphIR":
        names = set(self.symbols) | set(self.runtime_symbols)
        if set(self.symbols) & set(self.runtime_symbols):
            raise ValueError(f"symbols {sorted(set(self.symbols) & set(self.runtime_symbols))} are both "
                             f"input dims and run-time symbols")
        for name, info in self.runtime_symbols.items():
            for value in [info.value, info.carrier]:
                if value is not None and value not in self.values:
                    raise ValueError(f"run-time symbol {name!r} reads {value!r}, not a value of the graph")
            if info.dim is not None and info.dim >= len(self.values[info.value].shape):
                raise ValueError(f"run-time symbol {name!r} reads dim {info.dim} of {info.value!r}, "
                                 f"which has rank {len(self.values[info.value].shape)}")
            if info.carrier is not None and self.values[info.carrier].shape != [name, "0"]:
                raise ValueError(f"run-time symbol {name!r}: its carrier {info.carrier!r} has shape "
                                 f"{self.values[info.carrier].shape}, not [{name}, 0]")
        for check in self.checks:
            _declared(f"check at {check.order}", "condition", [check.cond], names)
        for name in names:
            try:
                ok = parse(name) == symbol(name)
            except SymbolicError as exc:
                raise ValueError(str(exc)) from None
            if not ok:
                raise ValueError(f"symbol name {name!r} is reserved in the IR expression grammar")
        for key, value in self.values.items():
            if value.name != key:
                raise ValueError(f"value {key!r} is named {value.name!r}")
        for key, kernel in self.kernels.items():
            if kernel.id != key:
                raise ValueError(f"kernel {key!r} has id {kernel.id!r}")
        for name in [*self.inputs, *self.outputs]:
            if name not in self.values:
                raise ValueError(f"graph input/output {name!r} is not a known value")
        for name, info in self.symbols.items():  # the runtime reads tensors[input].shape[dim]
            if not 0 <= info.input < len(self.inputs):
                raise ValueError(f"symbol {name!r} reads input {info.input}; the graph has "
                                 f"{len(self.inputs)} inputs (indices 0 to {len(self.inputs) - 1})")
            shape = self.values[self.inputs[info.input]].shape
            if not 0 <= info.dim < len(shape):
                raise ValueError(f"symbol {name!r} reads dim {info.dim} of input "
                                 f"{self.inputs[info.input]!r}, which has rank {len(shape)}")
        for launch in self.launches:
            for kernel in [launch.kernel, *(d.kernel for d in launch.dispatch)]:
                if kernel not in self.kernels:
                    raise ValueError(f"launch {launch.order} refers to unknown kernel {kernel!r}")
            kernel = self.kernels[launch.kernel]
            _check_launch(launch, kernel, names)
            for arg in launch.args:
                if arg.value is not None and arg.value not in self.values:
                    raise ValueError(f"launch {launch.order}: argument {arg.name!r} names tensor "
                                     f"{arg.value!r}, which is not a value of the graph")
                if arg.role == "scalar" and arg.expr is None:
                    _check_scalar(launch.order, kernel, arg)
        return self

    # --- convenience -------------------------------------------------------------------------
    def nodes(self) -> list[Union[TorchOp, Launch]]:
        """Torch ops and launches merged in program order."""
        return sorted([*self.ops, *self.launches], key=lambda n: n.order)

    def symbol_names(self) -> list[str]:
        """Every symbol an expression may use: input dims, then sizes from tensor values."""
        return [*self.symbols, *self.runtime_symbols]

    def symbol_ranges(self) -> dict[str, tuple[int, int | None]]:
        """symbol -> (min, max) for every symbol (max None: unbounded)."""
        return {n: (s.min, s.max) for n, s in [*self.symbols.items(), *self.runtime_symbols.items()]}

    def symbol_examples(self) -> dict[str, int]:
        """symbol -> its value in the example run, for every symbol."""
        return {n: s.example for n, s in [*self.symbols.items(), *self.runtime_symbols.items()]}

    # --- JSON I/O ----------------------------------------------------------------------------
    def to_json(self, indent: int | None = 1) -> str:
        return self.model_dump_json(indent=indent)

    def fingerprint(self) -> str:
        """A sha256 of the whole document (what caches are keyed by): its JSON with every byte
        field (weights, cubins) as its own sha256 rather than base64 (seconds less per GB)."""
        return hashlib.sha256(self.model_dump_json(context=DIGEST).encode()).hexdigest()

    @classmethod
    def from_json(cls, text: str) -> "GraphIR":
        try:
            raw = json.loads(text)
        except ValueError as exc:  # JSONDecodeError, or an integer too long to convert
            raise IRError(f"IR is not valid JSON: {str(exc):.200}") from None
        except RecursionError:
            raise IRError("IR is not valid JSON: nested too deeply") from None
        depth = _nesting(raw)
        if depth > MAX_DEPTH:
            raise IRError(f"IR document nests {depth} levels deep; an IR nests at most {MAX_DEPTH} "
                          f"(a limit of kernel_lens, far past any real model): regenerate it")
        version = str(raw.get("schema_version", "")) if isinstance(raw, dict) else ""
        if version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise IRError(
                f"IR schema version {version or '(missing)'} is not compatible with this "
                f"kernel_lens (schema {SCHEMA_VERSION}); regenerate the IR with this version"
            )
        try:
            return cls.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "the document"
            raise IRError(f"IR document is invalid at {where}: {str(first['msg'])[:300]} "
                          f"({exc.error_count()} error{'s' if exc.error_count() > 1 else ''}); "
                          f"regenerate it (kernel_lens dump-ir FILE --json, or recompile)\n{exc}") from None
        except RecursionError:
            raise IRError("IR document is nested too deeply to validate") from None

    def save(self, path: str | Path) -> Path:
        """Write the JSON document atomically (a link at ``path`` is replaced, not followed)."""
        return atomic_write(path, self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> "GraphIR":
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise IRError(f"cannot read IR document {path}: {exc}") from None
        return cls.from_json(text)


SizePiece.model_rebuild()
ValueBranch.model_rebuild()


def _nesting(raw: object) -> int:
    """How deeply the JSON value ``raw`` nests (a scalar: 0), counted without recursion and
    stopping once past MAX_DEPTH."""
    deepest, stack = 0, [(raw, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_DEPTH:
            return deepest
        stack.extend((child, depth + 1) for child in children)
    return deepest


def json_schema() -> dict:
    """GraphIR's JSON schema, the document's own properties at the top level (GraphIR is
    recursive through ``pieces``, so pydantic gives it as a reference into ``$defs``)."""
    schema = GraphIR.model_json_schema()
    ref = schema.pop("$ref", None)
    if ref is not None:
        schema = {**schema["$defs"][ref.rsplit("/", 1)[1]], "$defs": schema["$defs"]}
    return schema
