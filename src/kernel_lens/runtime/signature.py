"""What a call of a compiled model takes and gives, from the IR alone, for every runner.

Built once per model: each input's dtype, rank and the dims it must have (integers, or exact
evaluators of the symbol values), where each symbol is read from (input, dim, ``scale*s +
offset``) and its declared range, and each output's dtype and shape evaluators. A call then
costs a few microseconds of plain Python: :meth:`CallSignature.symbol_values` checks the
tensors and reads the symbols, :meth:`CallSignature.output_shapes` gives the output shapes.
:meth:`CallSignature.checked` does both (and the ``out=`` and aliasing checks) once per layout
of a call's tensors and remembers the result, so a call repeating an accepted layout costs one
dictionary lookup. Nothing here knows ONNX Runtime or TensorRT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..archs import check_device as check_device_arch
from ..errors import InputError
from ..ir import DType, GraphIR, parse
from ..ir.types import torch_name
from .evaluate import evaluator

Shape = tuple[int, ...]
REMEMBERED = 64  # accepted layouts kept per signature (all forgotten at once when full)


def torch_dtype(dtype: DType) -> torch.dtype:
    return getattr(torch, torch_name(dtype))


@dataclass(frozen=True)
class InputSpec:
    name: str
    ir_dtype: DType
    dtype: torch.dtype
    rank: int
    checks: tuple[tuple[int, Callable | int, str], ...]  # (dim, expected: int or evaluator, IR text)


@dataclass(frozen=True)
class OutputSpec:
    name: str                       # the IR value
    ir_dtype: DType
    dtype: torch.dtype
    dims: tuple[Callable, ...] | None  # evaluators of the symbol values; None: the shape depends on
                                       # sizes from tensor values (known after the call)


@dataclass(frozen=True)
class CallSymbol:
    """A dynamic size of a call: read from graph input ``input``'s dim ``dim`` as
    ``(size - offset) / scale``, declared within [min, max]. (The launch wiring's
    :class:`kernel_lens.codegen.launch_io.SymbolSource` reads it from a node's inputs instead.)"""

    name: str
    input: int
    dim: int
    scale: int
    offset: int
    min: int
    max: int | None


def check_device(ir: GraphIR, index: int) -> int:
    """The arch of ``ir``'s binaries that CUDA device ``index`` runs (see
    :func:`kernel_lens.archs.pick_arch`), or :class:`~kernel_lens.errors.ArchError` in one line
    when it runs none of them."""
    major, minor = torch.cuda.get_device_capability(index)
    return check_device_arch(ir.built_archs(), major * 10 + minor, f"model {ir.name}")


@dataclass(frozen=True)
class CheckedCall:
    """What the checks of a call found: its symbol values, output shapes and device."""

    values: list[int]
    shapes: tuple[Shape, ...]
    device: torch.device


class PieceValues(list):
    """Symbol values of a call of a model split by size, and the piece serving them (its own
    values: its symbols are a subset of the model's, and it checks its own dims)."""

    def __init__(self, values: list[int], piece: int, own: list[int]) -> None:
        super().__init__(values)
        self.piece, self.own = piece, own


class CallSignature:
    """The inputs, symbols and outputs of a compiled model's call (see the module docstring).
    A model split by size (``ir.pieces``) reads its symbols, picks the piece whose boxes hold
    them, and lets that piece's signature check the dims and give the output shapes."""

    def __init__(self, ir: GraphIR, device_type: str = "cuda") -> None:
        self.model = ir.name
        self.device_type = device_type
        self.pieces = [([box.ranges for box in p.when], CallSignature(p.graph, device_type))
                       for p in ir.pieces]
        names = list(ir.symbols)
        sources = {(info.input, info.dim) for info in ir.symbols.values()
                   if info.scale == 1 and info.offset == 0}
        inputs = []
        for i, name in enumerate(ir.inputs):
            value = ir.values[name]
            checks = []
            for d, text in enumerate(value.shape):
                if (i, d) in sources or ir.pieces:
                    continue  # read, not checked: it defines its symbol (or a piece checks it)
                expr = parse(text)
                checks.append((d, int(expr) if expr.is_Integer else evaluator(expr, names), text))
            inputs.append(InputSpec(name, value.dtype, torch_dtype(value.dtype), len(value.shape),
                                    tuple(checks)))
        self.inputs: tuple[InputSpec, ...] = tuple(inputs)
        self.shapes_text = {name: ir.values[name].shape for name in ir.inputs}
        self.symbols: tuple[CallSymbol, ...] = tuple(
            CallSymbol(sym, info.input, info.dim, info.scale, info.offset, info.min, info.max)
            for sym, info in ir.symbols.items())
        self.outputs: tuple[OutputSpec, ...] = tuple(
            OutputSpec(name, ir.values[name].dtype, torch_dtype(ir.values[name].dtype),
                       None if _from_values(ir, i) else () if ir.pieces else
                       tuple(evaluator(parse(s), names) for s in ir.values[name].shape))
            for i, name in enumerate(ir.outputs))
        self._layouts: dict[tuple, CheckedCall] = {}  # input layout -> what its checks found
        self._accepted: dict[tuple, bool] = {}  # layouts and pointers whose out=/aliasing checks passed

    def checked(self, tensors: Sequence[torch.Tensor], out: Sequence[torch.Tensor] | None = None,
                written: tuple[int, ...] = ()) -> CheckedCall:
        """:meth:`symbol_values` and :meth:`output_shapes` of a call, then :meth:`check_out` when
        ``out`` is given and :meth:`check_written_inputs` when the model writes inputs
        (``written``: their indices), each done only for a layout not accepted before. The
        checks read nothing but what :func:`layout` records of each tensor (and the data
        pointers, for memory shared between tensors), so a call repeating an accepted layout is
        accepted as before and any other call meets every check again, raising as it would."""
        key = layout(tensors)
        call = self._layouts.get(key) if key is not None else None
        if call is None:
            values = self.symbol_values(tensors)
            call = CheckedCall(values, tuple(self.output_shapes(values)), tensors[0].device)
            if key is not None:
                _remember(self._layouts, key, call)
        if out is None and not written:
            return call
        facts = None
        if key is not None and (out is None or isinstance(out, (list, tuple))):
            outs = () if out is None else layout(out, pointers=True)
            if outs is not None:
                facts = (key, tuple([t.data_ptr() for t in tensors]), outs, written)
        if facts is None or facts not in self._accepted:
            if out is not None:
                self.check_out(out, call.shapes, call.device, tensors)
            if written:
                self.check_written_inputs(tensors, written)
            if facts is not None:
                _remember(self._accepted, facts, True)
        return call

    def symbol_values(self, tensors: Sequence[torch.Tensor]) -> list[int]:
        """The symbol values of a call (in the IR's symbol order), after checking every input."""
        if len(tensors) != len(self.inputs):
            raise InputError(f"{self.model} takes {len(self.inputs)} inputs "
                             f"({', '.join(s.name for s in self.inputs)}), got {len(tensors)}")
        device = None
        for spec, t in zip(self.inputs, tensors):
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {spec.name!r} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != self.device_type:
                raise InputError(f"input {spec.name!r} is on {t.device}; move it to a "
                                 f"{self.device_type.upper()} device")
            if device is None:
                device = t.device
            elif t.device != device:
                raise InputError(f"input {spec.name!r} is on {t.device}, other inputs on {device}")
            if t.dtype != spec.dtype:
                raise InputError(f"input {spec.name!r} has dtype {t.dtype}; the model was compiled for "
                                 f"{spec.dtype}")
            if t.dim() != spec.rank:
                raise InputError(f"input {spec.name!r} has rank {t.dim()}, expected {spec.rank} "
                                 f"(shape {self.shapes_text[spec.name]})")
            if not t.is_contiguous():
                raise InputError(f"input {spec.name!r} is not contiguous; pass x.contiguous()")
        values = []
        for s in self.symbols:
            size = tensors[s.input].shape[s.dim]
            value, rest = divmod(size - s.offset, s.scale)
            if rest or value < s.min or (s.max is not None and value > s.max):
                raise InputError(
                    f"input {self.inputs[s.input].name!r} dim {s.dim} = {size}: dynamic dim {s.name} "
                    f"must be in [{s.min}, {'inf' if s.max is None else s.max}]"
                    + (f" with size {s.scale}*{s.name}+{s.offset}" if s.scale != 1 or s.offset else ""))
            values.append(value)
        for spec, t in zip(self.inputs, tensors):  # static and shared dims
            for d, expected, text in spec.checks:
                want = expected if isinstance(expected, int) else expected(values)
                if t.shape[d] != want:
                    raise InputError(f"input {spec.name!r} dim {d} is {t.shape[d]}, expected {text} = {want}")
        if self.pieces:
            named = {s.name: v for s, v in zip(self.symbols, values)}
            for k, (boxes, piece) in enumerate(self.pieces):
                if any(all(lo <= named[s] <= hi for s, (lo, hi) in box.items()) for box in boxes):
                    return PieceValues(values, k, piece.symbol_values(tensors))
            raise InputError(f"{self.model}: no piece of the model serves the sizes {named} "
                             f"(the pieces cover the declared ranges: recompile)")
        return values

    def output_shapes(self, values: Sequence[int]) -> list[Shape]:
        if self.pieces:
            return self.pieces[values.piece][1].output_shapes(values.own)
        return [None if o.dims is None else tuple(f(values) for f in o.dims) for o in self.outputs]

    def check_out(self, out: Sequence[torch.Tensor], shapes: Sequence[Shape], device,
                  inputs: Sequence[torch.Tensor] = ()) -> None:
        """``out=`` tensors: one per output, contiguous, of the output's dtype, shape and device,
        sharing no memory with ``inputs`` (the call's input tensors) or with each other: the
        kernels would read what they are writing."""
        if len(out) != len(shapes):
            raise InputError(f"out= holds {len(out)} tensors; {self.model} has {len(shapes)} outputs")
        for i, (t, shape, o) in enumerate(zip(out, shapes, self.outputs)):
            if shape is None:
                raise InputError(f"out[{i}]: output {i}'s shape depends on tensor values (a size "
                                 f"computed at run time); leave out= unset")
            if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape or t.dtype != o.dtype \
                    or t.device != device or not t.is_contiguous():
                raise InputError(f"out[{i}] must be a contiguous {o.dtype} tensor of shape {shape} "
                                 f"on {device}")
        spans = [(f"input {spec.name!r}", _span(t)) for spec, t in zip(self.inputs, inputs)]
        for i, t in enumerate(out):
            mine = _span(t)
            for what, span in spans:
                if mine[0] < span[1] and span[0] < mine[1]:
                    raise InputError(f"out[{i}] shares memory with {what}; pass a separate output "
                                     f"tensor (torch.empty_like), or leave out= unset")
            spans.append((f"out[{i}]", mine))


    def check_written_inputs(self, tensors: Sequence[torch.Tensor], written: Sequence[int]) -> None:
        """Inputs the model writes in place (``written``: their indices) share memory with no
        other input: a kernel would read what another part of the model is overwriting (the same
        tensor passed twice, or a view of it)."""
        for i in written:
            mine = _span(tensors[i])
            for j, t in enumerate(tensors):
                other = _span(t)
                if j != i and mine[0] < other[1] and other[0] < mine[1]:
                    raise InputError(f"input {self.inputs[i].name!r} is written in place by the model "
                                     f"and shares memory with input {self.inputs[j].name!r}; pass "
                                     f"separate tensors (clone one of them)")


def _from_values(ir: GraphIR, index: int) -> bool:
    """Whether output ``index``'s shape depends on tensor values: it uses a size computed from
    them, or (a model traced from several examples) the value branches give it other shapes."""
    if ir.pieces:  # pieces give other shapes by design; each piece is judged on its own
        return any(_from_values(p.graph, index) for p in ir.pieces)
    graphs = ir.graphs()
    shapes = {tuple(g.values[g.outputs[index]].shape) for g in graphs}
    return len(shapes) > 1 or any(s.name in g.runtime_symbols for g in graphs
                                  for d in g.values[g.outputs[index]].shape for s in parse(d).free_symbols)


def layout(tensors: Sequence[object], pointers: bool = False) -> tuple | None:
    """Everything the checks of :class:`CallSignature` read from each tensor: its class, device,
    dtype, shape and strides (which decide contiguity), with ``pointers`` its data pointer too
    (which, with the rest, decides the bytes it spans). None when one of them is no strided
    tensor: such a call is always checked in full."""
    key = []
    for t in tensors:
        if not isinstance(t, torch.Tensor) or t.layout is not torch.strided:
            return None
        key.append((type(t), t.device, t.dtype, t.shape, t.stride(), t.data_ptr()) if pointers
                   else (type(t), t.device, t.dtype, t.shape, t.stride()))
    return tuple(key)


def _remember(cache: dict, key: tuple, value: object) -> None:
    """``cache[key] = value``, forgetting everything first when ``cache`` is full (a bound on
    the memory of a caller whose layouts never repeat)."""
    if len(cache) >= REMEMBERED:
        cache.clear()
    cache[key] = value


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes from a tensor's first element to the end of its last, [start, end), by its
    strides (a strided view reaches past ``numel`` elements; empty for a tensor of no elements)."""
    start = t.data_ptr()
    if t.numel() == 0:
        return start, start
    low = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s < 0)
    high = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if s > 0)
    size = t.element_size()
    return start + low * size, start + (high + 1) * size
