"""The part of code generation every target shares: from the launch plan to the launch functions.

Each launch becomes one C++ function ``kl_launch_<i>(const kl::Driver&, kl::LaunchContext&)``
that reads its symbols from node input dims, shapes and fills its outputs, evaluates grid and
scalars with exact int64 semantics, picks the kernel variant (heuristic guards) and the first
binary whose specialization assumptions hold, and launches it. Targets only wrap these
functions in their host API (an OrtCustomOp, a TensorRT plugin, ...).
"""

from __future__ import annotations

from pathlib import Path

import jinja2
import sympy

from ...archs import names as arch_names
from ...codegen.cxx import to_cxx
from ...codegen.plan import ModelPlan, build_plan
from ...errors import SymbolicError, UnsupportedKernelError
from ...ir import GraphIR, parse, symbol

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
        if isinstance(expr, sympy.Expr) and expr.is_integer:  # a truth value torch gave as 1/0
            return f"({to_cxx(expr, self.rename)} != 0)"
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


def render_launches(ir: GraphIR, plan: ModelPlan | None = None) -> str:
    """The shared launch code (``kl_launches.cpp``) of ``ir``, printed from its launch plan."""
    plan = plan or build_plan(ir)
    cxx = _Printer(plan.symbols)
    env = templates()
    env.filters.update(c_bytes=c_bytes, c_string=c_string, c_quote=c_quote, c_scalar=c_scalar,
                       cxx_int=cxx.int, cxx_bool=cxx.bool, cxx_name=cxx_name)
    kernels = ir.all_kernels()
    binaries = {kid: [(b, kernels[kid].binaries[b.index]) for b in plans]
                for kid, plans in plan.kernels.items()}
    archs = arch_names(a for a, _ in ir.built_archs())
    return env.get_template("launches.cpp.j2").render(plan=plan, binaries=binaries, archs=archs)
