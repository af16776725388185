"""A human-readable rendering of GraphIR, in the spirit of torch.fx's print_readable."""

from __future__ import annotations

from typing import Iterable

import sympy
from sympy.printing.str import StrPrinter

from .archs import names as arch_names
from .errors import printable
from .ir.kernel import LAUNCH_FLAGS
from .ir import (ConstArg, DTypeValue, GraphIR, JitValue, Launch, ListArg, SymArg, TorchOp,
                 TupleValue, ValueArg, parse)


class _PythonIntPrinter(StrPrinter):
    """Prints floor(p/q) as (p)//q and ceiling(p/q) as -(-(p)//q)-style cdiv, like user code."""

    def _print_floor(self, expr):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return f"floor({self._print(num)})"
        return f"({self._print(num)})//{self.parenthesize(den, 100)}"

    def _print_ceiling(self, expr):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        return f"cdiv({self._print(num)}, {self._print(den)})"

    def _print_Mod(self, expr):
        return f"({self._print(expr.args[0])}) % {self.parenthesize(expr.args[1], 100)}"

    def _print_Relational(self, expr):
        op = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}[expr.rel_op]
        return f"{self._print(expr.lhs)} {op} {self._print(expr.rhs)}"


def pretty(text: str, names: Iterable[str] = ()) -> str:
    return _PythonIntPrinter().doprint(parse(text, names))


def _arg(a, names) -> str:
    if isinstance(a, ValueArg):
        return f"%{a.ref}"
    if isinstance(a, SymArg):
        return pretty(a.sym, names)
    if isinstance(a, ListArg):
        return "[" + ", ".join(_arg(x, names) for x in a.items) + "]"
    assert isinstance(a, ConstArg)
    return repr(a.const)


def _type(ir: GraphIR, name: str) -> str:
    v = ir.values[name]
    return f"{v.dtype.value}[{', '.join(pretty(s, ir.symbols) for s in v.shape)}]"


def _graph_lines(ir: GraphIR) -> list[str]:
    """The body (ops and launches in program order) and the kernels of one graph."""
    names = list(ir.symbols)
    out: list[str] = []
    traced = ", ".join(f"{n}={s.example}" for n, s in ir.symbols.items())
    if ir.proven_at:
        again = "; ".join(", ".join(f"{n}={v}" for n, v in p.items()) for p in ir.proven_at)
        out.append(f"traced at {traced or 'static sizes'}; proven at {again} (traced again there: "
                   f"the same graph)")
    elif ir.symbols:
        out.append(f"traced at {traced}")
    for n, s in ir.runtime_symbols.items():
        what = f"{s.value}.shape[{s.dim}]" if s.dim is not None else f"{s.value}.item()"
        out.append(f"run-time size {n} = {what} (example {s.example}; from {s.where or 'unknown'})")
    for c in ir.checks:
        out.append(f"run-time check {c.cond} (else UntracedBranchError: {c.where or 'unknown'})")
    out.append("body:")
    for node in ir.nodes():
        if isinstance(node, TorchOp):
            lhs = ", ".join(f"%{o}: {_type(ir, o)}" for o in node.outputs) or "_"
            args = [_arg(a, names) for a in node.args]
            args += [f"{k}={_arg(v, names)}" for k, v in node.kwargs.items()]
            out.append(f"  {lhs} = {node.op}({', '.join(args)})")
        else:
            out.append(_launch(ir, node, names))
    out.append(f"  return ({', '.join('%' + o for o in ir.outputs)},)")
    out.append("kernels:")
    for k in ir.kernels.values():
        opts = k.options
        tune = f"  autotune={opts.autotune_config} ({opts.autotune_choice})" if opts.autotune_config else ""
        out.append(f"  {k.id}: {k.source.qualname}  ({k.source.file}:{k.source.line})")
        launch = "".join(f" {f}=True" for f in LAUNCH_FLAGS if opts.extra.get(f))
        out.append(f"    num_warps={opts.num_warps} num_stages={opts.num_stages} "
                   f"num_ctas={opts.num_ctas}{launch}{tune}")
        for p in k.leaves():
            spec = k.specialization.get(p.name)
            facts = [f for f in ("aligned16", "divisible16", "equal_to_1", "int32")
                     if spec is not None and getattr(spec, f)]
            if p.kind.value == "tensor":
                desc = f"*{p.dtype.value} {p.role.value if p.role else '?'}"
                if p.role_source == "override":
                    desc += " (override)"
            elif p.kind.value == "tensordesc":
                desc = (f"descriptor *{p.dtype.value} block {p.block_shape} "
                        f"{p.role.value if p.role else '?'}")
            elif p.kind.value == "scalar":
                desc = f"{p.dtype.value}"
            else:
                desc = f"constexpr = {_constexpr_text(p.constexpr_value)}"
            out.append(f"    {p.name}: {desc}" + (f"  [{', '.join(facts)}]" if facts else ""))
        for b in k.binaries:
            kind = "specialized" if b.specialized else "generic"
            abi = ", ".join(f"{a.c_type} {a.name}" + ("" if a.part == "value" else
                                                       f".{a.part}{'' if a.dim is None else a.dim}")
                            for a in b.abi)
            out.append(f"    binary sm_{b.arch} {kind}: entry {b.entry_name}, PTX {b.ptx_version}, "
                       f"cubin {len(b.cubin)} B, shared {b.shared_mem} B, "
                       f"scratch {b.global_scratch_size} B, warps {b.num_warps}")
            out.append(f"      abi({abi})")
            assumed = [f"{n}:{f}" for n, spec in b.assumptions.items()
                       for f in ("aligned16", "divisible16", "equal_to_1", "int32") if getattr(spec, f)]
            out.append(f"      assumes: {', '.join(assumed) or 'nothing'}")
    return out


def summarize(ir: GraphIR, timings: Iterable = ()) -> str:
    names = list(ir.symbols)
    out = [f"graph {ir.name}  ({arch_names(a for a, _ in ir.built_archs())}, IR schema {ir.schema_version})",
           f"  passes run: {', '.join(ir.passes_run) or '(none)'}",
           f"  graph passes (at lowering): {', '.join(ir.graph_passes) or '(none: optimize=0)'}"]
    out.append("symbols:")
    for n, s in ir.symbols.items():
        hi = "inf" if s.max is None else s.max
        out.append(f"  {n} = {ir.inputs[s.input]}.shape[{s.dim}]   range [{s.min}, {hi}]   "
                   f"(captured: {s.example})")
    out.append("inputs:")
    out += [f"  %{n}: {_type(ir, n)}" for n in ir.inputs]
    if ir.constants:
        out.append("constants:")
        out += [f"  %{n}: {_type(ir, n)}" for n in ir.constants]
    out += _parts_lines(ir)
    timings = list(timings)
    if timings:
        out.append("pass timings:")
        out += [f"  {t.name:24s} {t.seconds * 1e3:9.1f} ms{'' if t.modified else '  (no change)'}"
                for t in timings]
    return "\n".join(printable(line) for line in out) + "\n"  # a loaded IR's text drives no terminal


def _parts_lines(ir: GraphIR) -> list[str]:
    """The graph's lines, or each size piece's and value branch's (a piece may have branches)."""
    out = []
    if ir.pieces:
        out.append(f"pieces: the model's Python code branches on sizes; the first piece whose "
                   f"sizes match runs")
        for k, piece in enumerate(ir.pieces):
            when = " or ".join(", ".join(f"{s} in [{lo}, {hi}]" for s, (lo, hi) in box.ranges.items())
                               or "any size" for box in piece.when)
            out.append(f"piece {k}: {when}")
            out += ["  " + line for line in _parts_lines(piece.graph)]
    elif ir.branches:
        out.append(f"branches: the model's Python code branches on tensor values; traced from "
                   f"{len(ir.branches)} examples, the first branch whose checks hold runs")
        for k, branch in enumerate(ir.branches):
            which = "example_inputs" if branch.example == 0 else f"extra_examples[{branch.example - 1}]"
            out.append(f"branch {k} (taken by {which}):")
            out += ["  " + line for line in _graph_lines(branch.graph)]
    else:
        out += _graph_lines(ir)
    return out


def _launch(ir: GraphIR, launch: Launch, names) -> str:
    grid = ", ".join(pretty(g, names) for g in launch.grid)
    args = []
    for a in launch.args:
        if a.value is not None:
            args.append(f"{a.name}=%{a.value}:{a.role or '?'}")
        elif a.expr is not None:
            args.append(f"{a.name}={pretty(a.expr, names)}")
        else:
            args.append(f"{a.name}={_constexpr_text(a.constant)}")
    line = f"  launch {launch.kernel}[grid=({grid})]({', '.join(args)})"
    for name, guard in launch.guards.items():
        picks = ", ".join(f"{d.when[name]} -> {d.kernel}" for d in launch.dispatch)
        line += f"\n      guard {name} = {pretty(guard, names)}   dispatch: {picks}"
    return line


def _constexpr_text(value: object) -> str:
    """A constexpr as the user wrote it: ``tl.float32``, a @triton.jit function's name, tuples."""
    if isinstance(value, DTypeValue):
        return f"tl.dtype({value.dtype!r})"
    if isinstance(value, JitValue):
        return f"@jit {value.jit}"
    if isinstance(value, TupleValue):
        items = [_constexpr_text(v) for v in value.items]
        if value.fields is not None:
            return f"{value.type_name}({', '.join(f'{f}={v}' for f, v in zip(value.fields, items))})"
        return f"({', '.join(items)}{',' if len(items) == 1 else ''})"
    return repr(value)
