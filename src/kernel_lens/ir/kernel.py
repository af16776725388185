"""KernelIR: one compiled Triton kernel specialization, everything a target needs to launch it."""

from __future__ import annotations

import base64
from enum import Enum
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, BeforeValidator, model_validator

from .names import C_TYPES, Identifier
from .types import DType


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, ser_json_inf_nan="constants")


def _b64decode(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    return base64.b64decode(str(value).encode("ascii"), validate=True)


Base64Bytes = Annotated[
    bytes,
    BeforeValidator(_b64decode),
    PlainSerializer(lambda b: base64.b64encode(b).decode("ascii"), return_type=str, when_used="json"),
]


class ParamKind(str, Enum):
    tensor = "tensor"
    scalar = "scalar"
    constexpr = "constexpr"


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
    """One parameter of the kernel's Python signature, in signature order."""

    name: Identifier
    index: int = Field(description="position in the Python signature")
    kind: ParamKind
    dtype: DType | None = Field(
        default=None,
        description="tensor: element type; scalar: exact scalar type (i32, i64, fp32, i1, ...)",
    )
    role: Role | None = Field(default=None, description="tensors only; set by role inference")
    role_source: Literal["inferred", "override"] | None = None
    constexpr_value: Union[bool, int, float, str, None] = Field(
        default=None, description="value of a constexpr parameter (None also means None)"
    )


class CompileOptions(_Model):
    num_warps: int = 4
    num_stages: int = 3
    num_ctas: int = 1
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
    c_type: Literal[C_TYPES] = Field(description="'void*' for pointers, else the exact C scalar type")
    hidden: bool = Field(default=False, description="Triton's hidden trailing scratch pointers")


class KernelBinary(_Model):
    """One compiled binary of the kernel for one arch under one set of assumptions."""

    arch: int = Field(description="compute capability, e.g. 90")
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
    num_warps: int
    num_ctas: int
    shared_mem: int = Field(description="dynamic shared memory bytes to launch with")
    global_scratch_size: int = 0
    global_scratch_align: int = 1
    profile_scratch_size: int = 0
    profile_scratch_align: int = 1
    triton_version: str


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
        return self

    def param(self, name: str) -> KernelParam:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"kernel {self.name} has no parameter {name!r}")
