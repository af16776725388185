"""The part of code generation every target shares: from GraphIR to the launch functions.

Each launch becomes one C++ function ``kl_launch_<i>(const kl::Driver&, kl::LaunchContext&)``
that reads its symbols from node input dims, shapes and fills its outputs, evaluates grid and
scalars with exact int64 semantics, picks the kernel variant (heuristic guards) and the first
binary whose specialization assumptions hold, and launches it. Targets only wrap these
functions in their host API (an OrtCustomOp, a TensorRT plugin, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import jinja2
import sympy

from ...errors import SymbolicError, UnsupportedKernelError
from ...ir import DType, GraphIR, KernelBinary, KernelIR, Launch, ParamKind, parse, symbol
from ...ir.cxx_printer import to_cxx
from ...ir.launch_io import LaunchIO, launch_io

HERE = Path(__file__).parent


def templates(*folders: Path) -> jinja2.Environment:
    """A Jinja environment over the given template folders (target's first, then common)."""
    loader = jinja2.FileSystemLoader([str(f) for f in (*folders, HERE)])
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined,
                              keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)


def common_headers() -> dict[str, str]:
    """The shared C++ headers every target's library is built with, by file name."""
    return {name: (HERE / name).read_text() for name in ("kl_runtime.h", "kl_symbolic.h", "kl_model.h")}


def cxx_name(symbol_name: str) -> str:
    """C++ local holding a dimension symbol (prefixed: a Dim may be named like a keyword)."""
    return f"sym_{symbol_name}"


class _Printer:
    """IR expression strings to C++, with the graph's symbols renamed to their C++ locals."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.rename = {symbol(n): cxx_name(n) for n in names}

    def int(self, text: str) -> str:
        return to_cxx(parse(text, self.names), self.rename)

    def bool(self, text: str) -> str:
        return self._bool(parse(text, self.names))

    def _bool(self, expr: sympy.Basic) -> str:
        if expr is sympy.true or expr is sympy.false:
            return "true" if expr is sympy.true else "false"
        if isinstance(expr, sympy.core.relational.Relational):
            lhs, rhs = to_cxx(expr.lhs, self.rename), to_cxx(expr.rhs, self.rename)
            return f"({lhs} {expr.rel_op} {rhs})"
        if isinstance(expr, (sympy.And, sympy.Or)):
            op = " && " if isinstance(expr, sympy.And) else " || "
            return "(" + op.join(self._bool(a) for a in expr.args) + ")"
        if isinstance(expr, sympy.Not):
            return f"(!{self._bool(expr.args[0])})"
        raise SymbolicError(f"guard {expr} is not a boolean over integer expressions")


def c_bytes(data: bytes) -> str:
    lines = []
    for i in range(0, len(data), 24):
        lines.append(", ".join(f"0x{b:02x}" for b in data[i:i + 24]))
    return ",\n  ".join(lines)


def c_quote(text: str) -> str:
    """``text`` as a C++ string literal: printable ASCII kept, everything else escaped in octal
    (so no quote, backslash, newline or trigraph-like sequence can end the literal early)."""
    out = []
    for ch in str(text).encode("utf-8"):
        c = chr(ch)
        if c in '"\\?':
            out.append("\\" + c)
        elif 0x20 <= ch < 0x7F:
            out.append(c)
        else:
            out.append(f"\\{ch:03o}")
    return '"' + "".join(out) + '"'


def c_string(text: str, delim: str = "KLPTX") -> str:
    if f"){delim}\"" in text:
        raise UnsupportedKernelError("PTX contains the raw-string delimiter")
    return f'R"{delim}({text}){delim}"'


def c_scalar(value: object) -> str:
    """A bool, int or float as a C++ literal of its exact value: ints in int32 range plain, else
    ``INT64_C(...)`` (int64 min as ``(-INT64_C(9223372036854775807) - 1)``, which no literal
    spells) or ``UINT64_C(...)`` for values in [2**63, 2**64); floats round-trip exactly
    (``repr``), nan and infinities as ``NAN``/``INFINITY`` (a double expression)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else \
            ("NAN" if value != value else ("INFINITY" if value > 0 else "-INFINITY"))
    if isinstance(value, int):
        if -2**31 <= value < 2**31:
            return str(value)
        if value == -2**63:
            return "(-INT64_C(9223372036854775807) - 1)"
        if -2**63 < value < 0:
            return f"(-INT64_C({-value}))"
        if value < 2**63:
            return f"INT64_C({value})"
        if value < 2**64:
            return f"UINT64_C({value})"
        raise UnsupportedKernelError(f"integer {value} is outside [-2**63, 2**64): no C++ integer "
                                     f"type holds it")
    return str(value)


def c_int_type(value: int) -> str:
    """The C++ type of the local holding integer scalar ``value``: int64_t, or uint64_t past
    INT64_MAX (Triton types ints in [2**63, 2**64) as u64)."""
    return "uint64_t" if value >= 2**63 else "int64_t"


@dataclass
class BinaryView:
    symbol: str           # C++ name of the kl::Binary
    binary: KernelBinary
    predicates: list[str] = field(default_factory=list)
    args: list[str] = field(default_factory=list)       # C++ statements declaring ABI locals
    arg_names: list[str] = field(default_factory=list)  # their names, in ABI order


@dataclass
class KernelView:
    kernel: KernelIR
    binaries: list[BinaryView]


@dataclass
class LaunchView:
    index: int
    launch: Launch
    io: LaunchIO
    op_type: str
    symbols: list[tuple[str, str, str, str, str]]  # (name, C++ value, min, max-or-"", divisibility check)
    dim_checks: list[tuple[int, int, str, str]]  # (input, dim, C++ expected value, IR text)
    outputs: list[tuple[int, list[str], int | None, str]]  # (index, dims, copy_from, bytes expr)
    pointers: list[tuple[str, str]]             # (param, C++ pointer expression)
    scalars: list[tuple[str, str, str]]         # (param, C++ type, C++ value)
    guards: list[tuple[str, str]]               # (name, C++ bool expr)
    dispatch: list[tuple[str, str]]             # (C++ condition, kernel id)
    grid: list[str]


def _numel_bytes(ir: GraphIR, value: str, cxx: _Printer) -> str:
    v = ir.values[value]
    numel = "*".join(f"({s})" for s in v.shape) or "1"
    return f"static_cast<size_t>({cxx.int(numel)}) * {v.dtype.itemsize}"


def _binary_views(kernel: KernelIR, prefix: str) -> list[BinaryView]:
    views = []
    for bi, binary in enumerate(kernel.binaries):
        if binary.num_ctas != 1:
            raise UnsupportedKernelError(f"kernel {kernel.name}: num_ctas={binary.num_ctas} (thread-block "
                                         f"clusters) is not supported by the kernel_lens launcher yet")
        for flag in ("launch_cooperative_grid", "launch_pdl"):
            if kernel.options.extra.get(flag):
                raise UnsupportedKernelError(f"kernel {kernel.name}: {flag}=True is not supported by the "
                                             f"kernel_lens launcher yet (it launches with cuLaunchKernel)")
        view = BinaryView(symbol=f"{prefix}_bin{bi}", binary=binary)
        for pname, spec in binary.assumptions.items():
            param = kernel.param(pname)
            local = f"p_{pname}" if param.kind == ParamKind.tensor else f"v_{pname}"
            if spec.aligned16:
                view.predicates.append(f"kl::aligned16({local})")
            if spec.divisible16:
                view.predicates.append(f"{local} % 16 == 0")
            if spec.equal_to_1:
                view.predicates.append(f"{local} == 1")
            if spec.int32:
                view.predicates.append(f"kl::fits_i32({local})")
        for abi in binary.abi:
            if abi.hidden:
                continue
            param = kernel.param(abi.name)
            name = f"a{bi}_{abi.name}"
            if param.kind == ParamKind.tensor:
                view.args.append(f"void* {name} = p_{abi.name};")
            elif param.dtype in (DType.fp16, DType.bf16, DType.fp8e4nv, DType.fp8e5):
                raise UnsupportedKernelError(
                    f"kernel {kernel.name}: scalar {abi.name!r} is annotated {param.dtype.value}; "
                    f"only fp32/fp64 float scalars are supported (pass a Python float)")
            else:
                view.args.append(f"{abi.c_type} {name} = static_cast<{abi.c_type}>(v_{abi.name});")
            view.arg_names.append(name)
        views.append(view)
    return views


def launch_views(ir: GraphIR) -> tuple[list[LaunchView], dict[str, KernelView]]:
    """Everything the launch template needs, computed once for all targets."""
    names = list(ir.symbols)
    cxx = _Printer(names)
    kernels: dict[str, KernelView] = {}
    launches = []
    for index, launch in enumerate(ir.launches):
        io = launch_io(ir, launch, f"__{launch.order}")
        if not io.inputs:
            raise UnsupportedKernelError(
                f"launch {index} of kernel {launch.kernel} reads no tensor and has no dynamic "
                f"dims; kernel_lens nodes need at least one input")
        symbols = []
        for sym, src in io.symbols.items():
            info = ir.symbols[sym]
            value = f"ctx.dim({src.input}, {src.dim})"
            if src.offset:
                value = f"({value} - {src.offset})"
            divisible = f"{value} % {src.scale} == 0" if src.scale != 1 else ""
            if src.scale != 1:
                value = f"{value} / {src.scale}"
            symbols.append((cxx_name(sym), value, str(info.min), "" if info.max is None else str(info.max),
                            divisible))
        sources = {(src.input, src.dim) for src in io.symbols.values() if src.scale == 1 and not src.offset}
        dim_checks = []  # every other input dim must agree with the IR (ORT does not check dim_params)
        for k, value in enumerate(io.inputs):
            for d, text in enumerate(ir.values[value].shape):
                if (k, d) not in sources:
                    dim_checks.append((k, d, cxx.int(text), text))
        outputs = []
        for j, (root, _) in enumerate(io.outputs):
            dims = [cxx.int(s) for s in ir.values[root].shape]
            outputs.append((j, dims, io.copy_from[root], _numel_bytes(ir, root, cxx)))
        kernel = ir.kernels[launch.kernel]
        pointers, scalars = [], []
        for arg in launch.args:
            param = kernel.param(arg.name)
            if param.kind == ParamKind.tensor and arg.value is not None:
                kind, k = io.bindings[arg.name]
                base = f"ctx.input({k})" if kind == "in" else f"out{k}"
                offset = cxx.int(arg.storage_offset)
                item = param.dtype.itemsize
                pointers.append((arg.name, f"{base} + ({offset}) * {item}"))
            elif param.kind == ParamKind.scalar:
                if arg.expr is not None:
                    scalars.append((arg.name, "int64_t", cxx.int(arg.expr)))
                elif param.dtype.is_float:  # passed to the kernel as its ABI type (float/double)
                    scalars.append((arg.name, "double", c_scalar(float(arg.constant))))
                elif param.dtype == DType.i1:
                    scalars.append((arg.name, "bool", c_scalar(bool(arg.constant))))
                else:
                    value = int(arg.constant)
                    scalars.append((arg.name, c_int_type(value), c_scalar(value)))
        guards = [(g, cxx.bool(text)) for g, text in launch.guards.items()]
        dispatch = []
        for d in launch.dispatch:
            cond = " && ".join(f"g_{k} == {c_scalar(v)}" for k, v in d.when.items()) or "true"
            dispatch.append((cond, d.kernel))
        if not dispatch:
            dispatch = [("true", launch.kernel)]
        for _, kid in dispatch:
            if kid not in kernels:
                k = ir.kernels[kid]
                kernels[kid] = KernelView(k, _binary_views(k, f"k_{kid}"))
        grid = [cxx.int(g) for g in launch.grid]
        launches.append(LaunchView(index, launch, io, launch.kernel, symbols, dim_checks, outputs,
                                   pointers, scalars, guards, dispatch, grid))
    return launches, kernels


def render_launches(ir: GraphIR) -> str:
    launches, kernels = launch_views(ir)
    env = templates()
    env.filters["c_bytes"] = c_bytes
    env.filters["c_string"] = c_string
    env.filters["c_quote"] = c_quote
    return env.get_template("launches.cpp.j2").render(ir=ir, launches=launches, kernels=kernels)
