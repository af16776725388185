"""IR invariants, checked by the pass manager before the first pass and after every pass."""

from __future__ import annotations

from ..errors import IRError
from ..ir import GraphIR, ParamKind


def verify(ir: GraphIR) -> None:
    """Raise IRError naming the first broken invariant (in every piece of a model split by size,
    every branch of a model traced from several examples)."""
    if ir.parts():
        what = "piece" if ir.pieces else "branch"
        for k, part in enumerate(ir.parts()):
            try:
                verify(part.graph)
            except IRError as exc:
                raise IRError(f"{what} {k}: {exc}") from None
        return
    for kid, kernel in ir.kernels.items():
        if kid != kernel.id:
            raise IRError(f"kernel stored under {kid!r} has id {kernel.id!r}")
        names = [p.name for p in kernel.leaves()]
        for pname in kernel.specialization:
            if pname not in names:
                raise IRError(f"kernel {kid}: specialization of unknown parameter {pname!r}")
        if not kernel.binaries:
            raise IRError(f"kernel {kid}: no compiled binary")
        for b in kernel.binaries:
            visible = [a.name for a in b.abi if not a.hidden and a.part in ("value", "tma")]
            folded = {n for n, s in b.assumptions.items() if s.equal_to_1}
            runtime = [p.name for p in kernel.leaves()
                       if p.kind != ParamKind.constexpr and p.name not in folded]
            if visible != runtime:
                raise IRError(f"kernel {kid} sm_{b.arch}: ABI {visible} does not match the "
                              f"runtime parameters {runtime}")
            if [a.name for a in b.abi if a.hidden] != ["global_scratch", "profile_scratch"]:
                raise IRError(f"kernel {kid}: ABI lacks Triton's two hidden scratch pointers")
        flags = [b.specialized for b in kernel.binaries]
        if flags != sorted(flags, reverse=True):
            raise IRError(f"kernel {kid}: the specialized binary must come before the generic one")
    used = {k for l in ir.launches for k in [l.kernel, *(d.kernel for d in l.dispatch)]}
    for kid in ir.kernels:
        if kid not in used:
            raise IRError(f"kernel {kid} is not launched by any launch")
    for launch in ir.launches:
        kernel = ir.kernels[launch.kernel]
        if [a.name for a in launch.args] != [p.name for p in kernel.leaves()]:
            raise IRError(f"launch {launch.order}: arguments do not match kernel {kernel.id}'s "
                          f"parameters")
        for arg, p in zip(launch.args, kernel.leaves()):
            if p.binds_tensor:
                if arg.value not in ir.values:
                    raise IRError(f"launch {launch.order}: argument {arg.name} refers to unknown "
                                  f"tensor {arg.value!r}")
                if ir.values[arg.value].dtype != p.dtype:
                    raise IRError(f"launch {launch.order}: argument {arg.name} is "
                                  f"{ir.values[arg.value].dtype.value}, kernel expects {p.dtype.value}")
                if arg.role is not None and p.role is not None and arg.role != p.role.value:
                    raise IRError(f"launch {launch.order}: argument {arg.name} role {arg.role} "
                                  f"differs from kernel parameter role {p.role.value}")
            elif p.kind == ParamKind.scalar and arg.expr is None and arg.constant is None:
                raise IRError(f"launch {launch.order}: scalar {arg.name} has no value")
            if p.kind == ParamKind.tensordesc and not (
                    arg.desc_shape is not None and arg.desc_strides is not None
                    and len(arg.desc_shape) == len(arg.desc_strides) == len(p.block_shape)):
                raise IRError(f"launch {launch.order}: tensor descriptor {arg.name} needs a shape "
                              f"and strides of rank {len(p.block_shape)}")
    orders = [n.order for n in ir.nodes()]
    if len(set(orders)) != len(orders):
        raise IRError("two nodes share one program-order position")
    for op in ir.ops:
        for out in op.outputs:
            if out not in ir.values:
                raise IRError(f"op {op.op} at {op.order} produces unknown value {out!r}")
