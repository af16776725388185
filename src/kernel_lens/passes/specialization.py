"""Specialization: make every input in the declared ranges correct, as Triton's JIT would.

Triton compiles a kernel assuming facts about the launch values it saw: 16-byte aligned
pointers, integers divisible by 16, integers equal to 1 (folded), integers fitting int32.
This pass proves, per kernel and over every launch and the declared symbol ranges, which
facts always hold. When some cannot be guaranteed it adds a binary compiled only under the
guaranteed ones; targets pick, at run time, the first binary whose assumptions hold.
"""

from __future__ import annotations

import sympy

from ..aten_facts import may_forward_input
from ..errors import PassError
from ..ir import GraphIR, KernelIR, ParamKind, Specialization, parse
from ..ir.symbolic import bounds
from .base import Pass, PassContext, PassResult

INT32 = (-(2**31), 2**31 - 1)


def _fresh_allocation(ir: GraphIR, value: str) -> bool:
    """True if ``value`` is a fresh allocation made inside the graph (aligned by allocators)."""
    if ir.values[value].kind != "intermediate":
        return False
    producer = next((op for op in ir.ops if value in op.outputs), None)
    return (producer is not None and not producer.aliases
            and not may_forward_input(producer.op))


def _always(expr: sympy.Expr, predicate) -> bool:
    return expr.is_Integer and predicate(int(expr))


def guaranteed(ir: GraphIR, kernel: KernelIR) -> dict[str, Specialization]:
    """The subset of the kernel's assumptions that hold for every launch and every input."""
    names = ir.symbol_names()
    ranges = ir.symbol_ranges()
    launches = [l for l in ir.launches
                if l.kernel == kernel.id or any(d.kernel == kernel.id for d in l.dispatch)]
    out: dict[str, Specialization] = {}
    for pname, spec in kernel.specialization.items():
        param = kernel.param(pname)
        args = [next(a for a in l.args if a.name == pname) for l in launches]
        keep = Specialization()
        if param.kind == ParamKind.tensor and spec.aligned16:
            keep.aligned16 = all(
                a.value is not None and _fresh_allocation(ir, a.value)
                and _always(sympy.Mod(parse(a.storage_offset, names) * param.dtype.itemsize, 16),
                            lambda v: v == 0)
                for a in args)
        if param.kind == ParamKind.scalar:
            exprs = [parse(a.expr, names) if a.expr is not None else None for a in args]
            known = all(e is not None for e in exprs)
            if spec.equal_to_1:
                keep.equal_to_1 = known and all(e == 1 for e in exprs)
            if spec.divisible16:
                keep.divisible16 = known and all(sympy.Mod(e, 16) == 0 for e in exprs)
            if spec.int32:
                keep.int32 = known and all(_within(bounds(e, ranges), INT32) for e in exprs)
        out[pname] = keep
    return out


def _within(interval, limits) -> bool:
    lo, hi = interval
    return bool(lo >= limits[0]) and bool(hi <= limits[1])


class SpecializationGuards(Pass):
    name = "specialization"
    description = "prove Triton's specialization assumptions; add a generic binary where unproven"
    requires = frozenset({"canonical-symbolic"})
    provides = frozenset({"guarded-binaries"})

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        modified = False
        for kernel in ir.kernels.values():
            safe = guaranteed(ir, kernel)
            for pname, spec in kernel.specialization.items():
                if spec != safe[pname]:
                    break
            else:
                continue  # every assumption always holds: the specialized binary serves all inputs
            if any(not b.specialized for b in kernel.binaries):
                continue
            if ctx.compile_binary is None:
                raise PassError(f"pass specialization needs a kernel compiler in its context to "
                                f"build the generic binary of kernel {kernel.name}")
            archs = sorted({b.arch for b in kernel.binaries})
            for arch in archs:
                kernel.binaries.append(ctx.compile_binary(kernel, arch, safe, False))
            modified = True
        return PassResult(ir, modified)
