"""Ahead-of-time compilation of a KernelIR for one arch under a chosen set of assumptions.

The signature, constexprs and attributes are rebuilt from the IR and handed to Triton's own
``_pack_args``/``triton.compile``, the path Triton's JIT takes, so the binary is the one the
JIT would have produced for inputs meeting the same assumptions. No GPU is needed.

Compiled binaries are also kept in a content-addressed cache of our own,
``<kernel_lens cache>/aot/<key>.json``, so a recompile with nothing changed skips
``triton.compile`` entirely (whose own cache lookup hashes Triton's whole installation, the
400 MB ``libtriton.so`` included, once per process). The key covers what Triton's key covers:
the kernel's source with its dependencies and the globals it uses (``JITFunction.cache_key``),
where the kernel and its helpers are defined (file and line: the binary's line info names them),
the signature, constexprs and attributes, the parsed options, the backend (arch and ``ptxas``
version), Triton's cache-invalidating environment variables, and Triton's version and
installation (``libtriton`` path, size and mtime). An entry is used only if it passes the
cache's one trust check (:mod:`kernel_lens.toolchain.cache`, through
:mod:`~kernel_lens.toolchain.entry_cache`) and names the key it is looked up under; anything else
is recompiled and replaced (written atomically). Triton's override/dump/always-compile knobs
bypass the cache.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import sysconfig
import tempfile
from pathlib import Path
from types import SimpleNamespace

import triton
from triton._C.libtriton import get_cache_invalidating_env_vars
from triton.compiler import ASTSource

from ..errors import CompilationError
from .. import progress
from pydantic import ValidationError

from ..ir import AbiParam, DType, KernelBinary, KernelIR, KernelParam, ParamKind, Specialization, TmaMeta
from ..ir.kernel import LAUNCH_FLAGS
from ..toolchain import entry_cache
from ..toolchain.ptx_isa import parse_ptx_version
from . import arguments
from . import triton_compat as tc
from .source import resolve_jit

log = logging.getLogger(__name__)


def signature_for(kernel: KernelIR, assumptions: dict[str, Specialization], *,
                  import_modules: bool = False):
    """Triton's (specialization list, bound constexprs, integer types) for a binary of
    ``kernel`` under ``assumptions`` (:func:`.arguments.rebuild`)."""
    return arguments.rebuild(kernel, assumptions, jit_resolver(kernel, import_modules=import_modules))


def jit_resolver(kernel: KernelIR, *, import_modules: bool = False):
    """qualname -> the live @triton.jit function, for functions the kernel takes as constexprs
    (their sources are among the kernel's helpers)."""
    helpers = {h.qualname: h for h in kernel.helpers}

    def resolve(qualname: str):
        if qualname not in helpers:
            raise CompilationError(f"kernel {kernel.name}: the @triton.jit function {qualname} it "
                                   f"takes as a constexpr is not among its helpers in the IR")
        return resolve_jit(helpers[qualname], import_modules=import_modules)
    return resolve


_ABI_TYPES = {"u1": "bool", "i1": "bool"}


def _abi(kernel: KernelIR, specialization: list, tensordesc_meta: list | None) -> list[AbiParam]:
    """The entry point's parameters in Triton's flattened order (tuples flattened, constexprs
    and folded ints left out, each tensor descriptor expanded as Triton's driver expands it)."""
    abi: list[AbiParam] = []
    descriptors = 0

    def add(p: KernelParam, ty) -> None:
        nonlocal descriptors
        if p.kind == ParamKind.tuple:
            for item, t in zip(p.items, ty):
                add(item, t)
            return
        if ty == "constexpr":
            return
        if p.kind == ParamKind.tensordesc:
            rank = len(p.block_shape)
            tma = tensordesc_meta is not None and tensordesc_meta[descriptors] is not None
            descriptors += 1
            if tma:
                abi.append(AbiParam(name=p.name, c_type="CUtensorMap", part="tma"))
            else:
                abi.append(AbiParam(name=p.name, c_type="void*"))
                abi.extend(AbiParam(name=p.name, c_type="int64_t", part="shape", dim=d) for d in range(rank))
                abi.extend(AbiParam(name=p.name, c_type="int64_t", part="stride", dim=d) for d in range(rank))
                abi.append(AbiParam(name=p.name, c_type="bool", part="nan"))
            abi.extend(AbiParam(name=p.name, c_type="int32_t", part="shape", dim=d) for d in range(rank))
            abi.extend(AbiParam(name=p.name, c_type="int64_t", part="stride", dim=d) for d in range(rank))
            return
        c_type = "void*" if ty.startswith("*") else _ABI_TYPES.get(ty) or DType(ty).c_type
        abi.append(AbiParam(name=p.name, c_type=c_type))

    for p, (ty, _) in zip(kernel.params, specialization):
        add(p, ty)
    abi += [AbiParam(name="global_scratch", c_type="void*", hidden=True),
            AbiParam(name="profile_scratch", c_type="void*", hidden=True)]
    return abi


def ptx_entry_param_count(ptx: str, entry: str) -> int:
    match = re.search(r"\.entry\s+" + re.escape(entry) + r"\s*\((.*?)\)", ptx, re.S)
    if match is None:
        raise CompilationError(f"entry {entry} not found in PTX")
    return len(re.findall(r"\.param\s", match.group(1)))


_CACHE_SCHEMA = "kernel_lens.aot/3"
# What a cache entry keeps of Triton's CompiledKernel: the assembly and the metadata we read.
_MD_FIELDS = ("name", "num_warps", "num_ctas", "shared", "global_scratch_size", "global_scratch_align",
              "profile_scratch_size", "profile_scratch_align", *LAUNCH_FLAGS)
_MD_DEFAULTS = {"profile_scratch_size": 0, "profile_scratch_align": 1,  # older Tritons lack them
                **dict.fromkeys(LAUNCH_FLAGS, False)}


def _triton_install() -> list:
    """Triton's version and where/what its compiler library is (cheap: a stat, not a hash)."""
    lib = Path(triton.__file__).parent / "_C" / f"libtriton.{sysconfig.get_config_var('EXT_SUFFIX').split('.')[-1]}"
    try:
        st = os.stat(lib)
        ident = [str(lib), st.st_size, st.st_mtime_ns]
    except OSError:
        ident = [str(lib), None, None]
    return [triton.__version__, *ident]


def _locations(kernel: KernelIR, src: ASTSource) -> list:
    """Where the kernel and its helpers are defined: the binary's line info names them, and
    Triton's source hash does not cover them (the same text elsewhere is another binary)."""
    live = src.fn  # the JITFunction compiled: the IR's source, or its import when re-resolved
    return [live.fn.__code__.co_filename, live.starting_line_number,
            *[(s.file, s.line) for s in (kernel.source, *kernel.helpers)]]


def _cache_key(src: ASTSource, backend, options, env_vars: dict, locations: list) -> str:
    payload = [_CACHE_SCHEMA, _triton_install(), src.hash(), backend.hash(), options.hash(),
               sorted(env_vars.items()), locations]
    return hashlib.sha256(json.dumps(payload, default=str).encode()).hexdigest()


def _cache_usable() -> bool:
    knobs = getattr(triton, "knobs", None)
    comp = getattr(knobs, "compilation", None)
    return not any(getattr(comp, k, False) for k in ("always_compile", "override", "dump_ir"))


def _read_entry(key: str) -> SimpleNamespace | None:
    """The compiled kernel of a trusted cache entry for ``key``, or None."""
    body = entry_cache.read("aot", key, ".json")
    if body is None:
        return None
    try:
        entry = json.loads(body)
        if entry["key"] != key:
            log.warning("kernel binary cache entry %s was written for another key; recompiling it",
                        key[:16])
            return None
        md = {k: entry[k] for k in _MD_FIELDS}
        if entry["schema"] != _CACHE_SCHEMA or not (
                isinstance(md["name"], str) and all(isinstance(md[k], int) for k in _MD_FIELDS[1:])
                and isinstance(entry["ptx"], str)):
            raise ValueError("fields")
        asm = {"ptx": entry["ptx"], "cubin": base64.b64decode(entry["cubin"], validate=True)}
        tma = entry["tensordesc_meta"]
        if tma is not None:
            md["tensordesc_meta"] = [None if m is None else TmaMeta.model_validate(m).model_dump()
                                     for m in tma]
    except (ValueError, KeyError, TypeError, ValidationError) as exc:
        log.warning("kernel binary cache entry for %s is malformed (%s); recompiling it", key[:16],
                    type(exc).__name__)
        return None
    return SimpleNamespace(metadata=SimpleNamespace(**md), asm=asm)


def _write_entry(key: str, compiled) -> None:
    md = compiled.metadata
    entry = {"key": key, "schema": _CACHE_SCHEMA,
             **{k: getattr(md, k, _MD_DEFAULTS.get(k)) for k in _MD_FIELDS},
             "tensordesc_meta": _tma_meta(md),
             "ptx": compiled.asm["ptx"], "cubin": base64.b64encode(compiled.asm["cubin"]).decode("ascii")}
    entry_cache.write("aot", key, json.dumps(entry, sort_keys=True).encode(), ".json")


def _compile(kernel: KernelIR, src: ASTSource, arch: int, options: dict, shown: progress.Stage):
    """Triton's compiled kernel (or our cache's copy of it): ``.metadata`` and ``.asm``."""
    def fresh():
        try:
            return _untrusting_compile(src, arch, options)
        except Exception as exc:  # Triton raises CompilationError and plain errors alike
            raise CompilationError(f"kernel {kernel.name}: Triton failed to compile it for "
                                   f"sm_{arch}: {exc}") from exc

    if not _cache_usable():
        return fresh()
    backend = tc.backend_for(arch)
    parsed = backend.parse_options(dict(options, **src.parse_options()))
    key = _cache_key(src, backend, parsed, get_cache_invalidating_env_vars(),
                     _locations(kernel, src))
    cached = _read_entry(key)
    if cached is not None:
        shown.note = "reused from cache"
        return cached
    compiled = fresh()
    try:
        _write_entry(key, compiled)
    except OSError as exc:
        log.warning("kernel %s: its binary was not cached: %s", kernel.name, exc)
    return compiled


def _untrusting_compile(src: ASTSource, arch: int, options: dict):
    """``triton.compile`` reading nothing from Triton's own cache (``TRITON_CACHE_DIR``, which
    kernel_lens cannot vouch for: an edited PTX or cubin there would go into the IR) and writing
    nothing to it: Triton's cache is a private folder made for this compile and removed after it
    (the compiled kernel is read into memory). Reuse comes from kernel_lens's own cache, whose
    trust rules (:mod:`kernel_lens.toolchain.cache`) hold for everything a compile reads."""
    with tempfile.TemporaryDirectory(prefix="kl_triton_") as private, \
            triton.knobs.cache.scope(), triton.knobs.compilation.scope():
        triton.knobs.cache.dir = private
        triton.knobs.compilation.always_compile = True
        return triton.compile(src, target=tc.target_for(arch), options=options)


def _tma_meta(md) -> list | None:
    """Triton's ``tensordesc_meta`` (None or [] when no descriptor is lowered to TMA) as plain
    data: one entry per descriptor parameter, None for one passed as pointer, shape, strides."""
    meta = getattr(md, "tensordesc_meta", None)
    if not meta:
        return None
    return [None if m is None else {k: (list(v) if isinstance(v, (list, tuple)) else v)
                                    for k, v in dict(m).items()} for m in meta]


def compile_binary(kernel: KernelIR, arch: int, assumptions: dict[str, Specialization],
                   specialized: bool, *, import_modules: bool = False) -> KernelBinary:
    """A binary of ``kernel`` for ``arch``; its @triton.jit functions are found as
    :func:`.source.resolve_jit` finds them (``import_modules``: import their modules)."""
    jit_fn = resolve_jit(kernel.source, import_modules=import_modules)
    backend = tc.backend_for(arch)
    specialization, bound, int_types = signature_for(kernel, assumptions, import_modules=import_modules)
    opts = {"num_warps": kernel.options.num_warps, "num_stages": kernel.options.num_stages,
            "num_ctas": kernel.options.num_ctas, **kernel.options.extra}
    options, signature, constexprs, attrs = jit_fn._pack_args(backend, dict(opts), bound,
                                                              specialization, opts)
    with progress.stage(f"aot {kernel.name} (sm_{arch}, {'specialized' if specialized else 'generic'})") as shown:
        compiled = _compile(kernel, ASTSource(jit_fn, signature, constexprs, attrs), arch,
                            options.__dict__, shown)
    md = compiled.metadata
    ptx = compiled.asm["ptx"]
    tma = _tma_meta(md)
    abi = _abi(kernel, specialization, tma)
    if ptx_entry_param_count(ptx, md.name) != len(abi):
        raise CompilationError(f"kernel {kernel.name}: PTX entry has "
                               f"{ptx_entry_param_count(ptx, md.name)} params, expected {len(abi)}")
    major, minor = parse_ptx_version(ptx)  # one parser of .version (toolchain.ptx_isa)
    return KernelBinary(
        arch=arch, specialized=specialized,
        assumptions={k: v for k, v in assumptions.items() if v.any}, int_types=int_types,
        entry_name=md.name, ptx=ptx, ptx_version=f"{major}.{minor}",
        cubin=compiled.asm["cubin"], abi=abi, num_warps=md.num_warps, num_ctas=md.num_ctas,
        shared_mem=md.shared, global_scratch_size=md.global_scratch_size,
        global_scratch_align=md.global_scratch_align,
        profile_scratch_size=getattr(md, "profile_scratch_size", 0),
        profile_scratch_align=getattr(md, "profile_scratch_align", 1),
        tensordesc_meta=None if tma is None else [None if m is None else TmaMeta.model_validate(m)
                                                  for m in tma],
        **{flag: bool(getattr(md, flag, False)) for flag in LAUNCH_FLAGS},
        triton_version=triton.__version__,
    )
