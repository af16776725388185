"""PTX ISA clamping: lower each binary's PTX ``.version`` to what the deployment driver accepts.

Configured by ``ctx.options["ptx_version"]`` ("8.4") or ``ctx.options["cuda_version"]``
("12.4"); without either it leaves the PTX as Triton emitted it. Lowering is proven sound by
assembling the result with ptxas; otherwise it is refused with an error (never silently kept).
"""

from __future__ import annotations

from ..errors import PtxIsaError
from ..ir import GraphIR
from ..toolchain.ptx_isa import clamp_ptx_version, max_ptx_version_for_cuda, parse_ptx_version
from .base import Pass, PassContext, PassResult


def _version(text: str, what: str) -> tuple[int, int]:
    try:
        major, minor = (int(x) for x in str(text).split("."))
    except ValueError:
        raise PtxIsaError(f"{what} {text!r} is not of the form MAJOR.MINOR") from None
    return major, minor


def target_ptx_version(options: dict) -> tuple[int, int] | None:
    if options.get("ptx_version"):
        return _version(options["ptx_version"], "ptx_version")
    if options.get("cuda_version"):
        return max_ptx_version_for_cuda(_version(options["cuda_version"], "cuda_version"))
    return None


class PtxIsaClamp(Pass):
    name = "ptx-isa-clamp"
    description = "lower PTX .version to the deployment driver's maximum when provably sound"
    requires = frozenset({"guarded-binaries"})
    provides = frozenset({"ptx-clamped"})
    options = {"ptx_version": str, "cuda_version": str}

    def check_options(self, options: dict) -> None:
        target_ptx_version(options)  # a malformed version is refused before any work

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        limit = target_ptx_version(ctx.options)
        if limit is None:
            return PassResult(ir, False)
        modified = False
        for kernel in ir.kernels.values():
            for binary in kernel.binaries:
                try:
                    ptx = clamp_ptx_version(binary.ptx, limit)
                except PtxIsaError as exc:
                    raise PtxIsaError(f"kernel {kernel.name} (sm_{binary.arch}): {exc}") from None
                if ptx != binary.ptx:
                    binary.ptx = ptx
                    major, minor = parse_ptx_version(ptx)
                    binary.ptx_version = f"{major}.{minor}"
                    modified = True
        return PassResult(ir, modified)
