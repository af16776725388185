"""How one launch becomes one graph node: its inputs, outputs and where its symbols come from.

Shared by the ONNX lowering (which wires the node) and every target (whose generated code reads
the node's inputs and writes its outputs in exactly this order). Derived from the IR alone.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..aten_facts import allocates_uninitialized, is_inplace
from ..errors import IRError
from ..ir.graph import GraphIR, Launch
from ..ir.kernel import ParamKind
from ..ir.symbolic import parse



@dataclass(frozen=True)
class SymbolSource:
    """symbol = (dims of node input ``input`` at ``dim`` - offset) / scale."""

    input: int
    dim: int
    scale: int = 1
    offset: int = 0


@dataclass
class LaunchIO:
    """The node for one launch. Inputs are IR value names; outputs are (value, new name)."""

    inputs: list[str] = field(default_factory=list)
    outputs: list[tuple[str, str]] = field(default_factory=list)
    # per written value: the node input holding its initial contents (inplace), or None (fresh)
    copy_from: dict[str, int | None] = field(default_factory=dict)
    # per tensor parameter: ("in", input index) or ("out", output index)
    bindings: dict[str, tuple[str, int]] = field(default_factory=dict)
    symbols: dict[str, SymbolSource] = field(default_factory=dict)


def root_of(ir: GraphIR, value: str) -> str:
    """The tensor owning ``value``'s memory: follow views and in-place ops to their source.

    A kernel handed a view (transpose, slice, ...) receives the root's memory plus the view's
    storage offset and strides, exactly as torch passes it, so no copy changes the layout.
    """
    producers = {out: op for op in ir.ops for out in op.outputs}
    seen = set()
    while value in producers and producers[value].aliases and value not in seen:
        seen.add(value)
        value = producers[value].aliases[0]
    return value


def fresh_allocation(ir: GraphIR, value: str) -> bool:
    """True when ``value`` comes straight from an allocating torch op (contents undefined)."""
    producer = next((op for op in ir.ops if value in op.outputs), None)
    return producer is not None and allocates_uninitialized(producer.op)


def symbols_used(ir: GraphIR, launch: Launch) -> list[str]:
    """Symbols the node needs at run time: grid, scalars, guards, the shapes of the tensors it
    binds (outputs are allocated from them, inputs' dims checked against them), strides and
    tensor descriptors' shapes and strides."""
    names = ir.symbol_names()
    texts = [*launch.grid, *launch.guards.values()]
    for arg in launch.args:
        if arg.expr is not None:
            texts.append(arg.expr)
        if arg.value is not None:  # outputs are shaped, inputs' dims checked, from symbols
            texts += ir.values[root_of(ir, arg.value)].shape
        if arg.storage_offset is not None:
            texts.append(arg.storage_offset)
        texts += [*(arg.desc_shape or []), *(arg.desc_strides or [])]
    used = set()
    for text in texts:
        used |= {s.name for s in parse(text, names).free_symbols}
    return [n for n in names if n in used]


def launch_io(ir: GraphIR, launch: Launch, version_suffix: str) -> LaunchIO:
    """Node wiring for ``launch``; written values get the name ``f"{value}{version_suffix}"``
    unless the node creates them (fresh allocations keep their name)."""
    kernel = ir.kernels[launch.kernel]
    missing = [a.name for a in launch.args if kernel.param(a.name).binds_tensor
               and a.value is not None and a.role is None]
    if missing:
        raise IRError(f"launch {launch.order} ({launch.kernel}): tensor arguments {missing} have no "
                      f"role; run the role-inference pass first")
    io = LaunchIO()
    # (argument, root value whose memory it points into)
    tensor_args = [(a, root_of(ir, a.value)) for a in launch.args
                   if kernel.param(a.name).binds_tensor and a.value is not None]
    written = {r for a, r in tensor_args if a.role in ("output", "inplace")}
    # a write through a view, or a partial write, keeps the rest of the root: it is read too
    read = {r for a, r in tensor_args if a.role in ("input", "inplace") or a.value != r}
    # contents undefined before this launch: the node creates the tensor as a fresh output
    undefined = {r for _, r in tensor_args
                 if fresh_allocation(ir, r) and not _written_before(ir, launch, r)}
    for _, root in tensor_args:  # inputs: read values and initial contents of inplace values
        needs_input = root in read or (root in written and root not in undefined)
        if needs_input and root not in io.inputs:
            io.inputs.append(root)
    for _, root in tensor_args:
        if root in written and all(v != root for v, _ in io.outputs):
            fresh = root not in read and root in undefined
            io.outputs.append((root, root if fresh else f"{root}{version_suffix}"))
            io.copy_from[root] = None if fresh else io.inputs.index(root)
    out_index = {v: i for i, (v, _) in enumerate(io.outputs)}
    for arg, root in tensor_args:
        if root in out_index:
            io.bindings[arg.name] = ("out", out_index[root])
        else:
            io.bindings[arg.name] = ("in", io.inputs.index(root))
    for sym in symbols_used(ir, launch):
        io.symbols[sym] = _symbol_source(ir, io, sym)
    return io


def _written_before(ir: GraphIR, launch: Launch, root: str) -> bool:
    """True when something wrote ``root`` before ``launch`` (its contents are then defined, and
    a kernel writing part of it keeps the rest): an earlier launch, or an in-place torch op on
    the root or on any view of it (``out[..., rot:].copy_(x[..., rot:])``, ``out.zero_()``)."""
    for op in ir.ops:
        if op.order < launch.order and op.aliases and is_inplace(op.op) \
                and root_of(ir, op.aliases[0]) == root:
            return True
    for other in ir.launches:
        if other.order >= launch.order:
            continue
        kernel = ir.kernels[other.kernel]
        for arg in other.args:
            if (kernel.param(arg.name).binds_tensor and arg.value is not None
                    and arg.role in ("output", "inplace") and root_of(ir, arg.value) == root):
                return True
    return False


def _symbol_source(ir: GraphIR, io: LaunchIO, sym: str) -> SymbolSource:
    for i, value in enumerate(io.inputs):
        for d, dim in enumerate(ir.values[value].shape):
            if dim == sym:
                return SymbolSource(i, d)
    runtime = ir.runtime_symbols.get(sym)
    if runtime is not None:  # a size from tensor values: a dim of its tensor, or of its carrier
        value, dim = (runtime.value, runtime.dim) if runtime.dim is not None else (runtime.carrier, 0)
        if value not in io.inputs:
            io.inputs.append(value)  # read for its shape only
        return SymbolSource(io.inputs.index(value), dim)
    info = ir.symbols[sym]
    graph_input = ir.inputs[info.input]
    if graph_input not in io.inputs:
        io.inputs.append(graph_input)  # a shape-only input: the node reads its dims, not its data
    return SymbolSource(io.inputs.index(graph_input), info.dim, info.scale, info.offset)
