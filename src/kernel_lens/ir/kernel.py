"""KernelIR: one compiled Triton kernel specialization, everything a target needs to launch it."""

from __future__ import annotations

import base64
import hashlib
from enum import Enum
from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, BeforeValidator, model_validator

from ..archs import SUPPORTED_ARCHS
from .names import C_TYPES, Identifier
from .types import DType


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")


def _known_arch(value: int) -> int:
    if value not in SUPPORTED_ARCHS:
        raise ValueError(f"arch {value} is not a GPU architecture kernel_lens builds for "
                         f"({', '.join(f'sm_{a}' for a in SUPPORTED_ARCHS)})")
    return value


Arch = Annotated[int, AfterValidator(_known_arch)]
MAX_RANK = 5  # a tensor descriptor's rank at most (TMA's limit; the launch code's arrays)


def _b64decode(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return base64.b64decode(str(value).encode("ascii"), validate=True)


#: ``model_dump_json(context=DIGEST)``: bytes as their sha256 (a key of the document's content
#: that does not base64-encode gigabytes of weights; see GraphIR.fingerprint).
DIGEST = {"bytes_as_sha256": True}


def _b64encode(value: bytes, info: object) -> str:
    if getattr(info, "context", None) == DIGEST:
        return "sha256:" + hashlib.sha256(value).hexdigest()
    return base64.b64encode(value).decode("ascii")


Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_b64decode),
    PlainSerializer(_b64encode, return_type=str, when_used="json"),
]


class ParamKind(str, Enum):
    """What one parameter of the kernel's Python signature (or one element of a tuple argument)
    is, as Triton's JIT binder types it."""

    tensor = "tensor"  # a pointer: a torch tensor (or an object with data_ptr())
    scalar = "scalar"  # an int, float or bool passed at run time
    constexpr = "constexpr"  # baked into the binary: tl.constexpr, None, a tl.dtype, a @jit fn
    tuple = "tuple"  # a tuple (or named tuple) argument: its elements are ``items``
    tensordesc = "tensordesc"  # a host tensor descriptor (triton.tools.tensor_descriptor), TMA


class DTypeValue(_Model):
    """A ``triton.language`` dtype passed as a constexpr (``tl.float32``, ``tl.float8e4nv``, ...)."""

    dtype: str = Field(pattern=r"^[a-z0-9]+$", max_length=16,
                       description="Triton's name of the dtype, as tl.dtype(name) takes it "
                       "('fp32', 'bf16', 'fp8e4nv', 'i1', ...)")


class JitValue(_Model):
    """A ``@triton.jit`` function passed as a constexpr (an activation the caller chooses)."""

    jit: str = Field(max_length=1024,
                     description="its module-qualified name; its source is in KernelIR.helpers")


class TupleValue(_Model):
    """A tuple (or named tuple) constexpr value."""

    items: list["ConstexprValue"]
    fields: list[Identifier] | None = Field(default=None, description="a named tuple's fields")
    type_name: Identifier | None = Field(default=None, description="a named tuple's class name")


ConstexprValue = Union[bool, int, float, str, None, DTypeValue, JitValue, TupleValue]
TupleValue.model_rebuild()


class Role(str, Enum):
    """What a kernel does with a tensor parameter's memory."""

    input = "input"  # only read
    output = "output"  # only written
    inplace = "inplace"  # read and written (includes atomics)


class SourceInfo(_Model):
    """Identity and text of a @triton.jit function (kernel or helper)."""

    qualname: str = Field(description="module-qualified name, e.g. 'pkg.mod.add_kernel'")
    file: str = Field(description="file the function was defined in")
    line: int = Field(description="first line of the definition in that file")
    source_hash: str = Field(description="sha256 of the function's source text")
    text: str = Field(description="the function's source text, dedented")
    callees: dict[str, str] = Field(
        default_factory=dict,
        description="names used in the source -> what they resolve to: 'triton.language' "
        "(the module), 'triton.language.<fn>' (a function of it), or 'jit:<qualname>' "
        "(another @triton.jit function, listed in KernelIR.helpers)",
    )


class Specialization(_Model):
    """The assumptions Triton's JIT bakes into a binary about one parameter's runtime value."""

    aligned16: bool = Field(default=False, description="pointer is 16-byte aligned")
    divisible16: bool = Field(default=False, description="integer is divisible by 16")
    equal_to_1: bool = Field(default=False, description="integer equals 1 (folded to a constant)")
    int32: bool = Field(default=False, description="integer fits in int32 (passed as i32)")

    @property
    def any(self) -> bool:
        return self.aligned16 or self.divisible16 or self.equal_to_1 or self.int32


class KernelParam(_Model):
    """One parameter of the kernel's Python signature, in signature order; a tuple argument
    holds its elements as ``items`` (recursively). Every name is unique within the kernel: an
    element of a tuple is named after its path (``strides_1_0`` for ``strides[1][0]``)."""

    name: Identifier
    index: int = Field(description="position in the Python signature, or in the enclosing tuple")
    kind: ParamKind
    dtype: DType | None = Field(
        default=None,
        description="tensor and tensordesc: element type; scalar: exact scalar type (i32, i64, "
        "fp32, i1, ...)",
    )
    role: Role | None = Field(default=None, description="tensors only; set by role inference")
    role_source: Literal["inferred", "override"] | None = None
    const: bool = Field(default=False, description="tensors: annotated tl.const (Triton types the "
                        "pointer '*k<dtype>': the kernel may only read through it)")
    constexpr_value: ConstexprValue = Field(
        default=None, description="value of a constexpr parameter (None also means None)"
    )
    items: list["KernelParam"] = Field(default_factory=list, description="tuple: its elements")
    fields: list[Identifier] | None = Field(default=None, description="named tuple: its fields")
    type_name: Identifier | None = Field(default=None, description="named tuple: its class name")
    block_shape: list[int] | None = Field(
        default=None, description="tensordesc: the block shape (part of the descriptor's type)")

    @model_validator(mode="after")
    def _shape(self) -> "KernelParam":
        if self.items and self.kind != ParamKind.tuple:
            raise ValueError(f"parameter {self.name}: only tuples have items")
        if [p.index for p in self.items] != list(range(len(self.items))):
            raise ValueError(f"tuple parameter {self.name}: items must be listed in order")
        if self.fields is not None and len(self.fields) != len(self.items):
            raise ValueError(f"named tuple parameter {self.name}: {len(self.fields)} fields for "
                             f"{len(self.items)} items")
        if (self.kind == ParamKind.tensordesc) != (self.block_shape is not None):
            raise ValueError(f"parameter {self.name}: a block shape belongs to tensor descriptors")
        if self.block_shape is not None and not (1 <= len(self.block_shape) <= MAX_RANK
                                                 and all(1 <= b <= 1 << 16 for b in self.block_shape)):
            raise ValueError(f"tensor descriptor {self.name}: block shape {self.block_shape} must have "
                             f"1 to {MAX_RANK} dims of 1 to 65536")
        return self

    @property
    def rank(self) -> int:
        """A tensor descriptor's rank (its block shape's length); 0 for other parameters."""
        return len(self.block_shape or ())

    @property
    def binds_tensor(self) -> bool:
        """A tensor or a tensor descriptor: bound to a tensor value of the graph at a launch."""
        return self.kind in (ParamKind.tensor, ParamKind.tensordesc)

    def walk(self) -> "list[KernelParam]":
        """This parameter and, for a tuple, every element beneath it, depth first."""
        out = [self]
        for item in self.items:
            out += item.walk()
        return out


KernelParam.model_rebuild()


class CompileOptions(_Model):
    num_warps: int = Field(default=4, ge=1, le=32)
    num_stages: int = Field(default=3, ge=0, le=64)
    num_ctas: int = Field(default=1, ge=1, le=16)
    autotune_config: dict[str, Union[bool, int, float, str]] | None = Field(
        default=None, description="kwargs of the @triton.autotune config chosen, if autotuned"
    )
    autotune_choice: Literal["benchmarked", "first-config", "user"] | None = Field(
        default=None, description="how that config was chosen"
    )
    extra: dict[str, Union[bool, int, float, str, None]] = Field(
        default_factory=dict, description="other Triton compile options passed at launch"
    )


class AbiParam(_Model):
    """One parameter of the compiled entry point, in ABI order."""

    name: Identifier = Field(description="kernel parameter name, or 'global_scratch'/'profile_scratch'")
    c_type: Literal[C_TYPES] = Field(description="'void*' for pointers, 'CUtensorMap' for a TMA "
                                     "descriptor, else the exact C scalar type")
    hidden: bool = Field(default=False, description="Triton's hidden trailing scratch pointers")
    part: Literal["value", "tma", "shape", "stride", "nan"] = Field(
        default="value", description="a tensor descriptor expands into several entry parameters "
        "(Triton's driver: a TMA descriptor or the base pointer, then shapes and strides): which "
        "part of parameter `name` this one is; 'value' for every other parameter")
    dim: int | None = Field(default=None, description="shape/stride parts: the dimension")


class TmaMeta(_Model):
    """How a binary takes one tensor descriptor as a TMA descriptor (Triton's
    ``metadata.tensordesc_meta`` entry); the launcher encodes a CUtensorMap with these."""

    swizzle: int = Field(ge=0, le=63, description="the CUtensorMapSwizzle (the driver checks it)")
    elem_size: Literal[1, 2, 4, 8]
    elem_type: int = Field(ge=0, le=63, description="the CUtensorMapDataType the device code expects")
    block_size: list[Annotated[int, Field(ge=1, le=256)]] = Field(
        min_length=1, max_length=MAX_RANK, description="the box: one size per dim of the descriptor")
    fp4_padded: bool = False


class KernelBinary(_Model):
    """One compiled binary of the kernel for one arch under one set of assumptions."""

    arch: Arch = Field(description="compute capability, e.g. 90")
    specialized: bool = Field(
        description="True: compiled under the assumptions in KernelIR.params' specializations; "
        "False: the generic binary, valid for any input"
    )
    assumptions: dict[Identifier, Specialization] = Field(
        default_factory=dict, description="per parameter name: what this binary assumes"
    )
    int_types: dict[Identifier, DType] = Field(
        default_factory=dict, description="scalar parameter name -> the integer type this binary takes"
    )
    entry_name: Identifier
    ptx: str
    ptx_version: str = Field(description="PTX ISA version of the .version directive, 'X.Y'")
    cubin: Base64Bytes = Field(description="cubin for `arch` (base64 in JSON)")
    abi: list[AbiParam]
    # What a launch is configured with: bounded as CUDA bounds it (a document could hold any int)
    num_warps: int = Field(ge=1, le=32, description="warps per CTA (1024 threads at most)")
    num_ctas: int = Field(ge=1, le=16, description="CTAs per cluster")
    shared_mem: int = Field(ge=0, le=1 << 20, description="dynamic shared memory bytes to launch with")
    global_scratch_size: int = Field(default=0, ge=0, le=1 << 30)
    global_scratch_align: int = Field(default=1, ge=1, le=1 << 12)
    profile_scratch_size: int = Field(default=0, ge=0, le=1 << 30)
    profile_scratch_align: int = Field(default=1, ge=1, le=1 << 12)
    tensordesc_meta: list[TmaMeta] | None = Field(
        default=None, description="per tensor-descriptor parameter (in order), how this binary "
        "takes it as a TMA descriptor; None: each is passed as base pointer, shape and strides")
    launch_pdl: bool = Field(default=False, description="Triton's launch_pdl: launched with "
                             "programmatic stream serialization (programmatic dependent launch)")
    launch_cooperative_grid: bool = Field(default=False, description="Triton's "
                                          "launch_cooperative_grid: launched as a cooperative grid")
    triton_version: str

    @property
    def arch_specific(self) -> bool:
        """Its PTX targets an ``a`` variant (``sm_90a``): it runs on exactly ``arch``."""
        return f".target sm_{self.arch}a" in self.ptx


class KernelIR(_Model):
    """A Triton kernel specialization: signature, roles, options and its compiled binaries."""

    id: Identifier = Field(description="unique id of this kernel specialization within the graph")
    name: Identifier = Field(description="the @triton.jit function's name")
    source: SourceInfo
    helpers: list[SourceInfo] = Field(
        default_factory=list, description="@triton.jit functions the kernel calls, transitively"
    )
    params: list[KernelParam]
    specialization: dict[Identifier, Specialization] = Field(
        default_factory=dict,
        description="what Triton's JIT assumed about each parameter for the captured launches",
    )
    options: CompileOptions = Field(default_factory=CompileOptions)
    binaries: list[KernelBinary] = Field(default_factory=list)

    @model_validator(mode="after")
    def _params_in_order(self) -> "KernelIR":
        if [p.index for p in self.params] != list(range(len(self.params))):
            raise ValueError(f"kernel {self.name}: params must be listed in signature order")
        names = [p.name for top in self.params for p in top.walk()]
        if len(set(names)) != len(names):
            raise ValueError(f"kernel {self.name}: parameter names must be unique")
        return self

    @model_validator(mode="after")
    def _binaries_fit_the_signature(self) -> "KernelIR":
        """Every name a binary uses is a parameter that can carry it, and every index into a
        tensor descriptor lies within its rank: the launch code is generated from these fields
        into fixed-size arrays, so a document must not be able to point past them."""
        leaves = {p.name: p for p in self.leaves()}
        descriptors = [p for p in leaves.values() if p.kind == ParamKind.tensordesc]
        for name in self.specialization:
            _runtime_param(self, leaves, name, "specialization")
        for i, b in enumerate(self.binaries):
            where = f"kernel {self.name} binary {i}"
            for name in b.assumptions:
                _runtime_param(self, leaves, name, f"{where} assumptions")
            for name in b.int_types:
                if _runtime_param(self, leaves, name, f"{where} int_types").kind != ParamKind.scalar:
                    raise ValueError(f"{where}: int_types names {name!r}, which is not a scalar")
            metas = b.tensordesc_meta
            if metas is not None and len(metas) != len(descriptors):
                raise ValueError(f"{where}: tensordesc_meta has {len(metas)} entries for "
                                 f"{len(descriptors)} tensor descriptors")
            tma = {p.name: m for p, m in zip(descriptors, metas or []) if m is not None}
            for p, meta in ((p, tma[p.name]) for p in descriptors if p.name in tma):
                if len(meta.block_size) != p.rank:
                    raise ValueError(f"{where}: TMA block size {meta.block_size} for tensor "
                                     f"descriptor {p.name!r} of rank {p.rank}")
            for abi in b.abi:
                _check_abi(where, leaves, tma, abi)
            for flag in LAUNCH_FLAGS:  # a launch without them would not be the kernel's launch
                if getattr(b, flag) != bool(self.options.extra.get(flag, False)):
                    raise ValueError(f"{where}: {flag}={getattr(b, flag)} but the kernel was compiled "
                                     f"with {flag}={self.options.extra.get(flag, False)}")
        return self

    def leaves(self) -> list[KernelParam]:
        """The parameters a launch binds, in signature order with tuples flattened: every
        tensor, scalar, constexpr and tensor descriptor (tuples themselves are not listed)."""
        return [p for top in self.params for p in top.walk() if p.kind != ParamKind.tuple]

    def param(self, name: str) -> KernelParam:
        for top in self.params:
            for p in top.walk():
                if p.name == name:
                    return p
        raise KeyError(f"kernel {self.name} has no parameter {name!r}")


def _runtime_param(kernel: KernelIR, leaves: dict, name: str, field: str) -> KernelParam:
    """The parameter ``name`` that ``field`` names: one the kernel takes at run time."""
    param = leaves.get(name)
    if param is None or param.kind == ParamKind.constexpr:
        raise ValueError(f"kernel {kernel.name}: {field} names {name!r}, which is not a "
                         f"{'run-time ' if param is not None else ''}parameter of the kernel")
    return param


_SCRATCH = ("global_scratch", "profile_scratch")
#: Triton's compile options that change how a binary is launched (cuLaunchKernelEx attributes)
LAUNCH_FLAGS = ("launch_pdl", "launch_cooperative_grid")


def _check_abi(where: str, leaves: dict, tma: dict, abi: AbiParam) -> None:
    """One entry-point parameter against the kernel's signature (see AbiParam)."""
    what = f"{where}: ABI parameter {abi.name!r} ({abi.part})"
    if abi.hidden:
        if abi.name not in _SCRATCH or abi.c_type != "void*" or abi.part != "value" or abi.dim is not None:
            raise ValueError(f"{what}: hidden parameters are Triton's {' and '.join(_SCRATCH)} pointers")
        return
    param = leaves.get(abi.name)
    if param is None or param.kind == ParamKind.constexpr:
        raise ValueError(f"{what} is not a run-time parameter of the kernel")
    descriptor = param.kind == ParamKind.tensordesc
    if abi.part != "value" and not descriptor:
        raise ValueError(f"{what}: only tensor descriptors have parts")
    if abi.part in ("shape", "stride"):
        if abi.dim is None or not 0 <= abi.dim < param.rank:
            raise ValueError(f"{what}: dim {abi.dim} outside the descriptor's rank {param.rank}")
    elif abi.dim is not None:
        raise ValueError(f"{what}: only shape and stride parts have a dim")
    if abi.part == "tma" and (abi.c_type != "CUtensorMap" or abi.name not in tma):
        raise ValueError(f"{what}: a TMA descriptor is a CUtensorMap with TMA metadata")
    if abi.part != "tma" and abi.c_type == "CUtensorMap":
        raise ValueError(f"{what}: only a descriptor's tma part is a CUtensorMap")
    if param.binds_tensor and abi.part == "value" and abi.c_type != "void*":
        raise ValueError(f"{what}: a pointer's C type is void*, not {abi.c_type}")
    if param.kind == ParamKind.scalar and abi.c_type == "void*":
        raise ValueError(f"{what}: a scalar is not passed as a pointer")
