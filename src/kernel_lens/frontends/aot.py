"""Ahead-of-time compilation of a KernelIR for one arch under a chosen set of assumptions.

The signature, constexprs and attributes are rebuilt from the IR and handed to Triton's own
``_pack_args``/``triton.compile``, the path Triton's JIT takes, so the binary is the one the
JIT would have produced for inputs meeting the same assumptions. No GPU is needed.
"""

from __future__ import annotations

import logging
import re
import time

import triton
from triton.compiler import ASTSource

from ..errors import CompilationError
from ..ir import AbiParam, DType, KernelBinary, KernelIR, ParamKind, Specialization
from . import triton_compat as tc
from .source import resolve_jit

log = logging.getLogger(__name__)


def _scalar_type(dtype: DType, spec: Specialization) -> DType:
    """Integers Triton passed as i32 widen to i64 unless the binary may assume they fit."""
    if dtype == DType.i32 and not spec.int32:
        return DType.i64
    return dtype


def _triton_type(dtype: DType) -> str:
    return "u1" if dtype == DType.i1 else dtype.value


def signature_for(kernel: KernelIR, assumptions: dict[str, Specialization]):
    """Triton's (specialization list, bound constexprs) for a binary under ``assumptions``."""
    specialization: list[tuple[str, object]] = []
    bound: dict[str, object] = {}
    int_types: dict[str, DType] = {}
    for p in kernel.params:
        spec = assumptions.get(p.name, Specialization())
        bound[p.name] = p.constexpr_value
        if p.kind == ParamKind.constexpr:
            specialization.append(("constexpr", p.constexpr_value))
        elif p.kind == ParamKind.tensor:
            specialization.append(("*" + _triton_type(p.dtype), "D" if spec.aligned16 else ""))
        elif spec.equal_to_1:
            specialization.append(("constexpr", 1))
            bound[p.name] = 1
        else:
            ty = _scalar_type(p.dtype, spec)
            if not ty.is_float and ty != DType.i1:
                int_types[p.name] = ty
            key = ("D" if spec.divisible16 else "") if not (ty.is_float or ty == DType.i1) else None
            specialization.append((_triton_type(ty), key))
    return specialization, bound, int_types


def _abi(kernel: KernelIR, specialization: list[tuple[str, object]]) -> list[AbiParam]:
    abi = []
    for p, (ty, _) in zip(kernel.params, specialization):
        if ty == "constexpr":
            continue
        c_type = "void*" if ty.startswith("*") else DType.i1.c_type if ty == "u1" else DType(ty).c_type
        abi.append(AbiParam(name=p.name, c_type=c_type))
    abi += [AbiParam(name="global_scratch", c_type="void*", hidden=True),
            AbiParam(name="profile_scratch", c_type="void*", hidden=True)]
    return abi


def ptx_entry_param_count(ptx: str, entry: str) -> int:
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if match is None:
        raise CompilationError(f"entry {entry} not found in PTX")
    return len(re.findall(r"\.param\s", match.group(1)))


def compile_binary(kernel: KernelIR, arch: int, assumptions: dict[str, Specialization],
                   specialized: bool) -> KernelBinary:
    jit_fn = resolve_jit(kernel.source)
    backend = tc.backend_for(arch)
    specialization, bound, int_types = signature_for(kernel, assumptions)
    opts = {"num_warps": kernel.options.num_warps, "num_stages": kernel.options.num_stages,
            "num_ctas": kernel.options.num_ctas, **kernel.options.extra}
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, dict(opts), bound,
                                                              specialization, opts)
    start = time.perf_counter()
    try:
        compiled = triton.compile(ASTSource(jit_fn, signature, constexprs, attrs),
                                  target=tc.target_for(arch), options=options.__dict__)
    except Exception as exc:  # Triton raises CompilationError and plain errors alike
        raise CompilationError(f"kernel {kernel.name}: Triton failed to compile it for sm_{arch}: "
                               f"{exc}") from exc
    log.info("compiled %s for sm_%d (%s) in %.2fs", kernel.name, arch,
             "specialized" if specialized else "generic", time.perf_counter() - start)
    md = compiled.metadata
    ptx = compiled.asm["ptx"]
    abi = _abi(kernel, specialization)
    if ptx_entry_param_count(ptx, md.name) != len(abi):
        raise CompilationError(f"kernel {kernel.name}: PTX entry has "
                               f"{ptx_entry_param_count(ptx, md.name)} params, expected {len(abi)}")
    version = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx, re.M)
    return KernelBinary(
        arch=arch, specialized=specialized,
        assumptions={k: v for k, v in assumptions.items() if v.any}, int_types=int_types,
        entry_name=md.name, ptx=ptx, ptx_version=version.group(1) if version else "",
        cubin=compiled.asm["cubin"], abi=abi, num_warps=md.num_warps, num_ctas=md.num_ctas,
        shared_mem=md.shared, global_scratch_size=md.global_scratch_size,
        global_scratch_align=md.global_scratch_align,
        profile_scratch_size=getattr(md, "profile_scratch_size", 0),
        profile_scratch_align=getattr(md, "profile_scratch_align", 1),
        triton_version=triton.__version__,
    )
