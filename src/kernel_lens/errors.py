"""Typed errors. Every error names the culprit (kernel, argument, pass) and says what to do."""

from __future__ import annotations


class KernelLensError(Exception):
    """Base class of every error kernel_lens raises on purpose."""


class UnsupportedKernelError(KernelLensError):
    """A kernel or one of its arguments is outside what kernel_lens can lift."""


class KernelSourceError(KernelLensError):
    """A kernel's source cannot be retrieved or parsed."""


class CaptureError(KernelLensError):
    """Launch capture during the eager forward failed."""


class TraceError(KernelLensError):
    """The symbolic trace (torch.export) could not express the model."""


class SizeBranchError(TraceError):
    """The forward's Python code branches on sizes inside the declared ranges: ``branches``
    lists each condition on one size (where it holds), so the range can be split into pieces
    (:mod:`kernel_lens.frontends.trace.size_pieces`); uncaught, its message is torch's refusal."""

    def __init__(self, message: str, branches: list):
        super().__init__(message)
        self.branches = branches


class DynamicConstexprError(TraceError):
    """A constexpr depends on a dynamic dim; ``dims`` lists the (input name, dim) pairs it
    depends on, so ``dynamic=True`` can make exactly those static and trace again."""

    def __init__(self, message: str, dims: list[tuple[str, int]]):
        super().__init__(message)
        self.dims = dims


class RoleInferenceError(KernelLensError):
    """A tensor parameter's role (input/output/inplace) cannot be proven from the kernel's AST."""


class SymbolicError(KernelLensError):
    """A symbolic expression cannot be represented or printed exactly."""


class CompilationError(KernelLensError):
    """Ahead-of-time compilation of a kernel failed."""


class PtxIsaError(KernelLensError):
    """A PTX module cannot be lowered to the requested PTX ISA version."""


class IRError(KernelLensError):
    """An IR document is malformed, of an incompatible schema version, or breaks an invariant."""


class PassError(KernelLensError):
    """The pass pipeline is ill-formed (unknown pass, missing requirement, cycle)."""


class PreconditionError(PassError):
    """A pass was run on IR that lacks what the pass requires."""


class PostconditionError(PassError):
    """A pass did not provide what it declared."""


class ToolchainError(KernelLensError):
    """A compiler or third-party header folder needed to build a plugin cannot be found."""


class BuildError(KernelLensError):
    """Compiling or linking a generated plugin library failed."""


class OutputPathError(KernelLensError):
    """An output folder or file cannot be written safely (not a folder, or outside the folder)."""


class ArtifactError(KernelLensError):
    """A compiled artifact folder (manifest, IR, libraries) is missing, malformed or unsafe."""


class CacheError(KernelLensError):
    """A build-cache entry is not trustworthy (not a regular file, another owner, wrong hash)."""


class ServerError(KernelLensError):
    """A model server kernel_lens started (tritonserver) exited, did not come up, or its port is
    held by another process."""


class ModelFileError(KernelLensError):
    """A model file does not define what kernel_lens needs, or defining it failed."""


class InputError(KernelLensError):
    """An input (example tensors, run-time tensors, options) does not match what is expected."""


class UntracedBranchError(KernelLensError):
    """A call stopped by a run-time check on its values: inputs that take a branch of the
    model's code (on tensor values) that no example took (the message names the model's line),
    an ``.item()`` size below 0, a NaN in ``torch.sort``'s input (ONNX orders NaN otherwise)."""


class ArchError(KernelLensError):
    """An unknown or unsupported GPU architecture was asked for."""


class FetchError(KernelLensError):
    """Downloading or unpacking a pinned third-party package failed (a tool or the registry is
    unavailable, an archive differs from its pin or lacks a member)."""


def printable(text: str) -> str:
    """``text`` with every character that is not printable (ESC, other control characters, line
    and paragraph separators) escaped as Python's ``repr`` escapes it: text that came from a
    document or a file name cannot drive the terminal it is printed on."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))
