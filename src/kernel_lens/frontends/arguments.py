"""Kernel arguments as Triton's JIT binder types them, into IR parameters and back.

Triton 3.6's binder (``triton.runtime.jit.create_function_from_signature`` over the C++
``native_specialize_impl``) gives every argument a type and a specialization key:

=========================================  ==============================  =====================
argument                                   type                            IR parameter kind
=========================================  ==============================  =====================
tensor, or an object with ``data_ptr()``   ``*fp32`` (key ``D``: aligned)  tensor
int (key ``D``: divisible by 16)           ``i32`` / ``i64`` / ``u64``     scalar
int equal to 1 (folded)                    ``constexpr`` (key 1)           scalar, equal_to_1
float, bool, annotated scalars             ``fp32`` / ``u1`` / annotation  scalar
``tl.constexpr`` parameter (any value)     ``constexpr``                   constexpr
``None``, ``tl.dtype``, ``tl.constexpr(v)``,
a ``@triton.jit`` function                 ``constexpr``                   constexpr
tuple / named tuple (nested)               tuple of the elements' types    tuple (``items``)
``TensorDescriptor`` (host, TMA)           ``tensordesc<fp32[16, 32]>``    tensordesc
=========================================  ==============================  =====================

``do_not_specialize`` / ``do_not_specialize_on_alignment`` change only the keys. Anything else
(a ``torch.dtype``, a string to a non-constexpr parameter, an arbitrary object) Triton's binder
refuses, and so does kernel_lens, in one line naming the argument.

Elements of tuples are *leaves* of the IR, named after their path (``strides_1_0`` is
``strides[1][0]``), so every target binds them like top-level parameters, in Triton's flattened
ABI order; :func:`rebuild` turns a kernel's IR parameters back into the nested signature Triton's
compiler takes, which :func:`check_round_trip` compares with what the binder gave at capture.
"""

from __future__ import annotations

import functools
from collections import namedtuple
from typing import Any, Callable, Iterator

import torch
import triton.language as tl
from triton.runtime.jit import JITCallable
from triton.tools.tensor_descriptor import TensorDescriptor

from ..errors import CompilationError, UnsupportedKernelError
from ..ir import (DTypeValue, JitValue, KernelIR, KernelParam, ParamKind, Specialization, TupleValue)
from ..ir.names import is_identifier
from ..ir.types import DType, dtype_from_triton

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


# --- constexpr values ---------------------------------------------------------------------------
def is_jit_function(value: Any) -> bool:
    return isinstance(value, JITCallable)


def is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(type(value), "_fields")


def constexpr_to_ir(value: Any, where: str, jit_functions: list | None = None) -> Any:
    """A constexpr's value as IR data (:data:`~kernel_lens.ir.ConstexprValue`); ``jit_functions``
    collects the @triton.jit functions it names (their sources go into the IR's helpers)."""
    if isinstance(value, tl.constexpr):
        return constexpr_to_ir(value.value, where, jit_functions)
    if value is None or isinstance(value, (bool, int, float, str)):
        if isinstance(value, int) and not isinstance(value, bool) and not -2**63 <= value < 2**64:
            raise UnsupportedKernelError(f"{where}: constexpr {value} is outside [-2**63, 2**64)")
        return value
    if isinstance(value, tl.dtype):
        if isinstance(value, (tl.pointer_type, tl.block_type)) or type(value) is not tl.dtype:
            raise UnsupportedKernelError(
                f"{where}: constexpr {value!r} is a {type(value).__name__}; kernel_lens bakes "
                f"scalar tl.dtype constexprs (tl.float32, tl.float8e4nv, ...): pass the element "
                f"dtype and build the pointer or block type inside the kernel")
        return DTypeValue(dtype=value.name)
    if is_jit_function(value):
        if jit_functions is not None:
            jit_functions.append(value)
        return JitValue(jit=qualname_of(value))
    if isinstance(value, (tuple, list)):
        fields = list(type(value)._fields) if is_namedtuple(value) else None
        if fields is not None and not all(is_identifier(f) for f in fields):
            raise UnsupportedKernelError(f"{where}: named tuple {type(value).__name__} has a field "
                                         f"name that is not an ASCII identifier")
        return TupleValue(items=[constexpr_to_ir(v, f"{where}[{i}]", jit_functions)
                                 for i, v in enumerate(value)],
                          fields=fields, type_name=type(value).__name__ if fields else None)
    if isinstance(value, _SYMBOLIC):
        return value  # a guard: the trace handles it
    raise UnsupportedKernelError(
        f"{where}: constexpr value {_brief(value)} of type {type(value).__name__} cannot be baked "
        f"into a deployable binary; kernel_lens takes ints, floats, bools, strings, None, "
        f"tl.dtype values, @triton.jit functions and tuples of those")


def constexpr_from_ir(value: Any, resolve: Callable[[str], Any]) -> Any:
    """The Python value Triton compiles a constexpr with (``resolve(qualname)`` gives the live
    @triton.jit function of a :class:`JitValue`)."""
    if isinstance(value, DTypeValue):
        return tl.dtype(value.dtype)
    if isinstance(value, JitValue):
        return resolve(value.jit)
    if isinstance(value, TupleValue):
        items = [constexpr_from_ir(v, resolve) for v in value.items]
        return tuple_type(value.type_name, value.fields)(*items) if value.fields is not None \
            else tuple(items)
    return value


@functools.lru_cache(maxsize=None)
def _namedtuple(name: str, fields: tuple[str, ...]) -> type:
    return namedtuple(name, fields)


def tuple_type(name: str | None, fields: list[str] | None) -> Callable[..., tuple]:
    """The tuple class of a tuple parameter: a named tuple with its fields (Triton's compiler
    reads ``_fields`` for attribute access), or a constructor of plain tuples."""
    if fields is None:
        return lambda *items: tuple(items)
    return _namedtuple(name or "NamedTuple", tuple(fields))


def qualname_of(fn: Any) -> str:
    py = getattr(fn, "fn", fn)
    return f"{py.__module__}.{py.__qualname__}"


def _brief(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


# --- leaves: names and values -------------------------------------------------------------------
def leaf_names(jit: Any, params: dict[str, Any]) -> dict[tuple, str]:
    """(top-level index, *path) -> the leaf's unique name, for one launch's tuple structure."""
    taken = {p.name for p in jit.params}
    names: dict[tuple, str] = {}

    def visit(path: tuple, name: str, value: Any, constexpr: bool) -> None:
        if isinstance(value, tuple) and not constexpr:
            for i, item in enumerate(value):
                child = f"{name}_{i}"
                while child in taken:
                    child += "_"
                taken.add(child)
                visit((*path, i), child, item, False)
        names[path] = name

    for i, p in enumerate(jit.params):
        visit((i,), p.name, params[p.name], p.is_constexpr)
    return names


def walk_values(jit: Any, params: dict[str, Any]) -> Iterator[tuple[str, Any, bool]]:
    """(leaf name, value, is an element of a tuple) for every leaf of a launch, in ABI order
    (tuples flattened depth first; a tl.constexpr parameter's value is one leaf)."""
    names = leaf_names(jit, params)

    def visit(path: tuple, value: Any, constexpr: bool) -> Iterator[tuple[str, Any, bool]]:
        if isinstance(value, tuple) and not constexpr:
            for i, item in enumerate(value):
                yield from visit((*path, i), item, False)
        else:
            yield names[path], value, len(path) > 1

    for i, p in enumerate(jit.params):
        yield from visit((i,), params[p.name], p.is_constexpr)


def tensors_of(jit: Any, params: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors a launch passes, in leaf order (a tensor descriptor passes its base)."""
    out = []
    for _, value, _ in walk_values(jit, params):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, TensorDescriptor):
            out.append(value.base)
    return out


def map_tensor_likes(value: Any, convert: Callable[[Any], Any], is_like: Callable[[Any], bool]) -> Any:
    """``value`` with every tensor-like inside (nested tuples included) replaced by ``convert``."""
    if is_like(value):
        return convert(value)
    if isinstance(value, tuple):
        items = [map_tensor_likes(v, convert, is_like) for v in value]
        return type(value)(*items) if is_namedtuple(value) else tuple(items)
    return value


# --- argument checks ----------------------------------------------------------------------------
def check_arguments(jit: Any, kernel: str, params: dict[str, Any]) -> None:
    """Refuse, in one line naming the kernel and the argument, what kernel_lens cannot lift:
    what Triton's binder itself refuses (checked before it runs, for a clearer message), and
    constexpr values no IR can hold. Mixed devices are a CaptureError."""
    for p in jit.params:
        value = params[p.name]
        if p.is_constexpr:
            constexpr_to_ir(value, f"kernel {kernel}: argument {p.name!r}")
        else:
            _check_value(kernel, p.name, value)


def _check_value(kernel: str, name: str, value: Any) -> None:
    if isinstance(value, tuple):
        for i, item in enumerate(value):
            _check_value(kernel, f"{name}[{i}]", item)
        return
    where = f"kernel {kernel}: argument {name!r}"
    if value is None or isinstance(value, (bool, int, float, torch.Tensor, TensorDescriptor,
                                           tl.constexpr, *_SYMBOLIC)):
        if isinstance(value, TensorDescriptor):
            _check_descriptor(where, value)
        if isinstance(value, tl.constexpr):
            constexpr_to_ir(value, where)
        return
    if is_jit_function(value):
        constexpr_to_ir(value, where)
        return
    kind = type(value).__name__
    if isinstance(value, tl.dtype):
        hint = ("Triton's JIT takes a tl.dtype only for a tl.constexpr parameter (or wrapped, "
                "tl.constexpr(dtype)): annotate the parameter")
    elif isinstance(value, torch.dtype):
        hint = (f"Triton's JIT does not take a torch.dtype; pass the triton.language dtype "
                f"(e.g. tl.{_tl_name(value)}) as a tl.constexpr")
    elif isinstance(value, str):
        hint = "Triton's JIT takes strings only for tl.constexpr parameters: annotate it"
    elif isinstance(value, list):
        hint = "Triton's JIT takes tuples, not lists: pass tuple(...)"
    else:
        hint = ("Triton's JIT takes tensors, ints, floats, bools, None, tl.dtype values, "
                "@triton.jit functions, tuples of those and TensorDescriptors")
    raise UnsupportedKernelError(f"{where} of type {kind}: {hint}")


def _tl_name(dtype: torch.dtype) -> str:
    names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
             torch.float64: "float64", torch.int32: "int32", torch.int64: "int64",
             torch.int8: "int8", torch.uint8: "uint8", torch.float8_e4m3fn: "float8e4nv",
             torch.float8_e5m2: "float8e5", torch.bool: "int1", torch.int16: "int16"}
    return names.get(dtype, "float32")


def _check_descriptor(where: str, desc: TensorDescriptor) -> None:
    if not isinstance(desc.base, torch.Tensor):
        raise UnsupportedKernelError(f"{where}: a TensorDescriptor over a "
                                     f"{type(desc.base).__name__}; its base must be a tensor")
    if desc.padding not in ("zero", "nan"):
        raise UnsupportedKernelError(f"{where}: TensorDescriptor padding {desc.padding!r} is "
                                     f"neither 'zero' nor 'nan'")
    if len(desc.shape) != len(desc.strides) or len(desc.shape) != len(desc.block_shape) \
            or not 1 <= len(desc.shape) <= 5:
        raise UnsupportedKernelError(f"{where}: TensorDescriptor of rank {len(desc.shape)} with "
                                     f"{len(desc.strides)} strides and block {desc.block_shape}: "
                                     f"ranks 1 to 5, all three of one length")


# --- IR parameters from a launch ------------------------------------------------------------------
def _descriptor_type(ty: str) -> tuple[DType, list[int]]:
    """``tensordesc<fp32[16, 32]>`` -> (fp32, [16, 32])."""
    inner = ty[len("tensordesc<"):].split(">", 1)[0]
    dtype, _, rest = inner.partition("[")
    block = [int(x) for x in rest.split("]", 1)[0].split(",") if x.strip()]
    return dtype_from_triton(dtype), block


def kernel_params(jit: Any, kernel: str, params: dict[str, Any], specialization: list,
                  jit_functions: list) -> tuple[list[KernelParam], dict[str, Specialization]]:
    """The IR parameters of one launch and the specialization its binary assumes, from Triton's
    binder result (``specialization``: per top-level parameter, its (type, key), nested for
    tuples). ``jit_functions`` collects @triton.jit functions passed as constexprs."""
    names = leaf_names(jit, params)
    specs: dict[str, Specialization] = {}

    def build(path: tuple, index: int, value: Any, ty: Any, key: Any, annotated: bool) -> KernelParam:
        name = names[path]
        where = f"kernel {kernel}: argument {name!r}"
        if annotated:
            return KernelParam(name=name, index=index, kind=ParamKind.constexpr,
                               constexpr_value=constexpr_to_ir(value, where, jit_functions))
        if isinstance(ty, tuple):
            items = [build((*path, i), i, v, t, k, False) for i, (v, t, k) in enumerate(zip(value, ty, key))]
            fields = list(type(value)._fields) if is_namedtuple(value) else None
            return KernelParam(name=name, index=index, kind=ParamKind.tuple, items=items,
                               fields=fields, type_name=type(value).__name__ if fields else None)
        if ty == "constexpr":
            if isinstance(value, int) and not isinstance(value, bool) and value == 1:
                specs[name] = Specialization(equal_to_1=True, int32=True)  # folded by the JIT
                return KernelParam(name=name, index=index, kind=ParamKind.scalar, dtype=DType.i32)
            return KernelParam(name=name, index=index, kind=ParamKind.constexpr,
                               constexpr_value=constexpr_to_ir(value, where, jit_functions))
        if ty.startswith("*"):
            specs[name] = Specialization(aligned16=key == "D")
            return KernelParam(name=name, index=index, kind=ParamKind.tensor,
                               dtype=dtype_from_triton(ty), const=ty.startswith("*k"))
        if ty.startswith("tensordesc"):
            dtype, block = _descriptor_type(ty)
            return KernelParam(name=name, index=index, kind=ParamKind.tensordesc, dtype=dtype,
                               block_shape=block)
        dtype = dtype_from_triton(ty)
        if not (dtype.is_float or dtype == DType.i1):
            specs[name] = Specialization(divisible16=key == "D", int32=dtype == DType.i32)
        return KernelParam(name=name, index=index, kind=ParamKind.scalar, dtype=dtype)

    out = [build((i,), i, params[p.name], ty, key, p.is_constexpr)
           for i, (p, (ty, key)) in enumerate(zip(jit.params, specialization))]
    return out, specs


# --- back to Triton's signature -------------------------------------------------------------------
def _triton_type(dtype: DType) -> str:
    return "u1" if dtype == DType.i1 else dtype.value


def descriptor_type(param: KernelParam) -> str:
    return f"tensordesc<{param.dtype.value}[{', '.join(str(b) for b in param.block_shape)}]>"


def scalar_type(dtype: DType, spec: Specialization) -> DType:
    """Integers Triton passed as i32 widen to i64 unless the binary may assume they fit."""
    if dtype == DType.i32 and not spec.int32:
        return DType.i64
    return dtype


def rebuild(kernel: KernelIR, assumptions: dict[str, Specialization],
            resolve: Callable[[str], Any]) -> tuple[list, dict[str, Any], dict[str, DType]]:
    """Triton's (specialization list, bound values, integer types of scalars) for a binary of
    ``kernel`` under ``assumptions``: nested like the binder's, for ``JITFunction._pack_args``
    (constexprs are read from the bound values by path; other leaves are placeholders)."""
    int_types: dict[str, DType] = {}

    def build(p: KernelParam) -> tuple[Any, Any, Any]:
        spec = assumptions.get(p.name, Specialization())
        if p.kind == ParamKind.tuple:
            parts = [build(item) for item in p.items]
            make = tuple_type(p.type_name, p.fields)
            return (make(*[t for t, _, _ in parts]), make(*[k for _, k, _ in parts]),
                    make(*[b for _, _, b in parts]))
        if p.kind == ParamKind.constexpr:
            value = constexpr_from_ir(p.constexpr_value, resolve)
            return "constexpr", value, value
        if p.kind == ParamKind.tensor:
            return ("*k" if p.const else "*") + _triton_type(p.dtype), "D" if spec.aligned16 else "", None
        if p.kind == ParamKind.tensordesc:
            return descriptor_type(p), None, None
        if spec.equal_to_1:
            return "constexpr", 1, 1
        ty = scalar_type(p.dtype, spec)
        if not ty.is_float and ty != DType.i1:
            int_types[p.name] = ty
        key = ("D" if spec.divisible16 else "") if not (ty.is_float or ty == DType.i1) else None
        return _triton_type(ty), key, None

    parts = [build(p) for p in kernel.params]
    specialization = [(t, k) for t, k, _ in parts]
    bound = {p.name: b for p, (_, _, b) in zip(kernel.params, parts)}
    return specialization, bound, int_types


def _comparable(x: Any) -> Any:
    if isinstance(x, tl.constexpr):
        return _comparable(x.value)
    if isinstance(x, tuple):
        return tuple(_comparable(v) for v in x)
    if is_jit_function(x):
        return ("jit", qualname_of(x))
    if isinstance(x, tl.dtype):
        return ("dtype", x.name)
    return x


def check_round_trip(kernel: KernelIR, captured: list, resolve: Callable[[str], Any]) -> None:
    """The signature :func:`rebuild` gives for the captured binary equals Triton's own: the IR
    describes the launch completely (a mismatch is a kernel_lens bug, named, not a wrong binary)."""
    rebuilt, _, _ = rebuild(kernel, kernel.specialization, resolve)
    for p, mine, theirs in zip(kernel.params, rebuilt, captured):
        if _comparable(mine[0]) != _comparable(theirs[0]):
            raise CompilationError(
                f"kernel {kernel.name}: parameter {p.name!r} rebuilds as type {mine[0]!r} but "
                f"Triton's binder typed it {theirs[0]!r}; please report this kernel_lens bug")
