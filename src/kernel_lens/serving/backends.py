"""Triton backends a compiled model can be exported for: one class per kind of model.

A backend says what goes into the model's version folder (``NAME/1/``) and what its
``config.pbtxt`` states beyond the interface (platform or backend, instance kind, parameters,
CUDA EP options, custom-op libraries). The export driver (:mod:`.export`) does the rest: the
interface from the ONNX graph, names, the atomic write. A new kind is one more class in
:data:`BACKENDS`.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import ArtifactError, InputError

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the CLI's parser imports this module for BACKENDS: no IR (pydantic, sympy) here
    from ..ir import GraphIR

HERE = Path(__file__).parent
VERSION = "1"           # the version folder every export writes
MODEL_FILE = "model.onnx"

# ONNX Runtime CUDA EP options that match kernel_lens's own runner (runtime/ort.py): TF32 off, as
# torch's default (torch.backends.cuda.matmul.allow_tf32 is False), where ORT's default is on.
CUDA_OPTIONS = {"use_tf32": "0"}


@dataclass(frozen=True)
class CompiledArtifacts:
    """What an export reads from a compile output folder (made by ``--target ort``, or a
    TensorRT target for the tensorrt backend)."""

    name: str                   # the compiled model's name (its IR's)
    onnx: Path                  # the ONNX graph
    onnx_data: dict[str, Path]  # its external-data files, by the location the graph names
    library: Path               # the custom-op / plugin library (libkl_<Name>_ort.so, ..._trt_v3.so)
    ir: GraphIR | None = None   # the compiled IR
    target: str = "ort"         # the kernel_lens target whose artifacts these are

    @functools.cached_property
    def library_name(self) -> str:
        """The library's name in the repository: its compiled name and the first 12 hex digits
        of its content's SHA-256 (``libkl_<Name>_ort_<digits>.so``). A server finds the library by
        this bare name and loads a name once per process, so two models of one class name
        exported into one repository must not share it unless their libraries are the same."""
        digest = hashlib.sha256()
        with open(self.library, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        return f"{self.library.stem}_{digest.hexdigest()[:12]}{self.library.suffix}"


@dataclass(frozen=True)
class BackendConfig:
    """What a backend adds to config.pbtxt (the template's fields)."""

    instance_kind: str
    platform: str | None = None
    backend: str | None = None
    default_model_filename: str | None = None
    parameters: dict[str, str] = field(default_factory=dict)
    cuda_options: dict[str, str] = field(default_factory=dict)
    op_libraries: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # comment lines at the top of config.pbtxt


# Appends the caller's LD_LIBRARY_PATH only when it is set: "dir:$LD_LIBRARY_PATH" with it unset
# leaves a trailing ":", and an empty entry makes the dynamic loader search the current folder.
_REST = '${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}'


class TritonBackend:
    """Base class: a kind of Triton model a kernel_lens model is exported as."""

    name: str = ""
    description: str = ""
    targets: tuple[str, ...] = ("ort",)  # kernel_lens targets whose artifacts it serves, preferred first
    # The export itself opens the op library (to build an engine): it is then built from the
    # folder's IR into kernel_lens's cache, never opened from the folder (a folder is data).
    opens_library: bool = False

    def version_files(self, source: CompiledArtifacts) -> dict[str, Path]:
        """The files of ``NAME/1/``: file name -> the file to copy there."""
        return version_folder(self.version_entries(source))

    def version_entries(self, source: CompiledArtifacts) -> list[tuple[str, str, Path | None]]:
        """``(file name, what it is, the file)`` for each file of ``NAME/1/``: the export's own
        names first, then the compiled folder's artifacts (whose names come from its manifest)."""
        return [(MODEL_FILE, f"the ONNX graph's copy {MODEL_FILE}", source.onnx),
                *((name, f"the external data file {path} of {source.onnx}", path)
                  for name, path in source.onnx_data.items()),
                (source.library_name, f"the op library {source.library}", source.library)]

    def config(self, source: CompiledArtifacts) -> BackendConfig:
        raise NotImplementedError

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        """What the person deploying the exported model must do (printed by the CLI)."""
        return []


class OnnxRuntimeBackend(TritonBackend):
    """Triton's onnxruntime backend (NVIDIA's server containers): the ONNX graph runs on the CUDA
    EP, with the kernel_lens library registered through ``model_operations``."""

    name = "onnxruntime"
    description = "Triton's onnxruntime backend (platform onnxruntime_onnx, CUDA EP)"

    def config(self, source: CompiledArtifacts) -> BackendConfig:
        return BackendConfig(
            platform="onnxruntime_onnx", instance_kind="KIND_GPU", default_model_filename=MODEL_FILE,
            cuda_options=dict(CUDA_OPTIONS), op_libraries=[source.library_name],
            notes=["op_library_filename is a bare file name: ONNX Runtime dlopen()s it as given, so",
                   f"start tritonserver with LD_LIBRARY_PATH=<this folder>/{VERSION}{_REST}",
                   "(or replace it with the library's absolute path); see docs/serving.md."])

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        folder = (model_dir / VERSION).absolute()
        return [f"op_library_filename is the bare name {source.library_name}: start tritonserver "
                f"with LD_LIBRARY_PATH={shlex.quote(str(folder))}{_REST} (ONNX Runtime dlopen()s "
                f"the name as given; a relative path would resolve against the server's working "
                f"folder)"]


class PythonBackend(TritonBackend):
    """Triton's python backend (any tritonserver, e.g. the one in PyPI's nvidia-pytriton):
    ``model.py`` runs the ONNX graph with onnxruntime-gpu on torch tensors, zero-copy."""

    name = "python"
    description = "Triton's python backend: model.py + onnxruntime-gpu, DLPack tensors"

    def version_entries(self, source: CompiledArtifacts) -> list[tuple[str, str, Path | None]]:
        return [("model.py", "the python backend's model.py", HERE / "triton_python_model.py"),
                *super().version_entries(source)]

    def config(self, source: CompiledArtifacts) -> BackendConfig:
        return BackendConfig(
            backend="python", instance_kind="KIND_AUTO",
            parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": "no",  # GPU inputs stay on the GPU
                        "kernel_lens_onnx": MODEL_FILE,
                        "kernel_lens_op_library": source.library_name,
                        "kernel_lens_use_tf32": CUDA_OPTIONS["use_tf32"]},
            notes=["KIND_AUTO: one instance group on every GPU the server sees (as KIND_GPU); on a",
                   "server without a GPU the instance lands on the CPU and model.py refuses it with",
                   "a clear message (the model needs a CUDA GPU and onnxruntime-gpu)."])

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        return ["the python backend's stub imports torch and onnxruntime-gpu from the first python3 "
                "on tritonserver's PATH (python -m kernel_lens.serving.tritonserver REPO sets that up)"]


class TensorRtBackend(TritonBackend):
    """Triton's tensorrt backend (platform ``tensorrt_plan``): a serialized engine built from the
    TensorRT target's ONNX graph and plugin library, by the TensorRT Python package in the
    exporting process (so on the GPU model and TensorRT version that will serve it). The plugin
    library goes beside the engine with a small registration library that Triton loads through
    its documented ``--backend-config=tensorrt,plugins=...`` option."""

    name = "tensorrt"
    description = "Triton's tensorrt backend (platform tensorrt_plan): engine + plugin library"
    targets = ("trt", "trt-v3", "trt-v2")
    opens_library = True
    ENGINE = "model.plan"

    def version_files(self, source: CompiledArtifacts) -> dict[str, Path]:
        from ..runtime.trt import TrtModel  # lazy: torch and TensorRT, for this backend only

        version_folder(self.version_entries(source))  # names checked before the engine is built
        shim = registration_library(source.library_name)
        why = engine_not_built_here()
        if why is not None:  # what can be built: the graph and the plugins; the engine on the GPU
            log.warning("%s: NAME/%s/%s is not built (%s); build it on the serving GPU with the "
                        "trtexec command printed below", source.name, VERSION, self.ENGINE, why)
            return {**version_folder(super().version_entries(source)), registration_name(source): shim}
        engine = TrtModel(source.ir, source.onnx, source.library).build_engine()
        return {self.ENGINE: engine, source.library_name: source.library, registration_name(source): shim}

    def version_entries(self, source: CompiledArtifacts) -> list[tuple[str, str, Path | None]]:
        return [(self.ENGINE, f"the TensorRT engine {self.ENGINE}", None),
                *super().version_entries(source),
                (registration_name(source), f"the registration library of {source.library}", None)]

    def config(self, source: CompiledArtifacts) -> BackendConfig:
        from ..runtime.trt import gpu_identity, import_tensorrt  # lazy: torch and TensorRT, this backend only

        plugins = ["Load the plugins by starting tritonserver",
                   f"with --backend-config=tensorrt,plugins=<this folder>/{VERSION}/{registration_name(source)}",
                   "(an absolute path; see docs/serving.md)."]
        why = engine_not_built_here()
        if why is not None:
            built = [f"{self.ENGINE} was not built by the export ({why}): build it on the serving",
                     f"GPU with trtexec from {VERSION}/{MODEL_FILE} (the command the export printed)."]
        else:
            trt = import_tensorrt()
            built = [f"engine built by {trt.__name__} {trt.__version__} for {gpu_identity()}: serve it with",
                     "that TensorRT version on that GPU model."]
        return BackendConfig(platform="tensorrt_plan", instance_kind="KIND_GPU",
                             default_model_filename=self.ENGINE, notes=built + plugins)

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        version = (model_dir / VERSION).absolute()
        shim = version / registration_name(source)
        notes = []
        if engine_not_built_here() is not None:
            notes.append("build the engine on the serving GPU (the TensorRT version Triton runs): "
                         + trtexec_command(source.ir, version / MODEL_FILE, version / source.library_name,
                                           version / self.ENGINE))
        return notes + [
            f"start tritonserver with --backend-config=tensorrt,plugins={shim}: it registers the "
            f"plugins of {source.library_name} with Triton's TensorRT (LD_PRELOAD does not: TensorRT "
            f"must be loaded first)",
            "the engine runs only with the TensorRT version and on the GPU model it was built for "
            "(see config.pbtxt's header); re-export on the serving machine otherwise"]


@functools.cache  # asked by the files, the config and the notes of one export: the host's answer
def engine_not_built_here() -> str | None:
    """Why this host cannot build an engine Triton's tensorrt backend loads, or None. An engine is
    specific to the GPU and the TensorRT version it was built with: without a CUDA GPU there is
    none to build for, and TensorRT-RTX's engines (which it builds without a GPU) run only with
    TensorRT-RTX, not with the TensorRT that Triton's tensorrt backend links."""
    import torch  # lazy: the export of the other backends does not need it

    if not torch.cuda.is_available():
        return "no CUDA GPU on this host"
    if importlib.util.find_spec("tensorrt") is None:
        return ("the tensorrt package is not installed here (TensorRT-RTX's engines do not load in "
                "Triton's tensorrt backend)")
    return None


def trtexec_command(ir: GraphIR, onnx_path: Path, library: Path, engine: Path) -> str:
    """The ``trtexec`` command that builds ``engine`` from ``onnx_path`` with the plugins of
    ``library``, over the IR's optimization profile (min/opt/max of every dynamic input), as the
    export would (a strongly typed network: the graph's own types)."""
    from ..codegen.profile import optimization_profile  # lazy: sympy

    profile = optimization_profile(ir)
    shapes = [",".join(f"{name}:{'x'.join(str(d[k]) for d in dims) or '1'}" for name, dims in profile.items()
                       if any(d[0] != d[2] for d in dims)) for k in range(3)]
    command = ["trtexec", f"--onnx={onnx_path}", f"--dynamicPlugins={library}", f"--saveEngine={engine}",
               "--stronglyTyped"]
    if shapes[0]:
        command += [f"--minShapes={shapes[0]}", f"--optShapes={shapes[1]}", f"--maxShapes={shapes[2]}"]
    return shlex.join(command)


def version_folder(entries: list[tuple[str, str, Path | None]]) -> dict[str, Path]:
    """``NAME/1/``'s files by name. Every name is a plain file name (it is written into
    config.pbtxt) and no two are alike: an artifact named ``model.py`` or ``model.onnx`` would
    otherwise replace the export's own file of that name."""
    from .interface import check_file_name  # lazy: onnx and pydantic (~0.7 s) stay out of the CLI's parser

    files: dict[str, Path] = {}
    owners: dict[str, str] = {}
    for name, what, path in entries:
        check_file_name(name, f"{what}: its name", "recompile the model into a fresh folder "
                        "(kernel_lens names its artifacts libkl_<Model>_<target>.so, <Model>.onnx)")
        if name in owners:
            raise ArtifactError(f"{what} is named {name!r}, as is {owners[name]} in the exported "
                                f"NAME/{VERSION}/: one would replace the other; recompile the model "
                                f"into a fresh folder (kernel_lens never names an artifact so)")
        owners[name] = what
        files[name] = path
    return files


def registration_name(source: CompiledArtifacts) -> str:
    return f"{Path(source.library_name).stem}_register.so"


def registration_library(library_name: str) -> Path:
    """The shim that registers ``library_name``'s plugins (the library beside it) when a plain
    dlopen loads it into a process with TensorRT (Triton's tensorrt backend's ``plugins=``)."""
    # lazy: jinja2 and the build toolchain, for the tensorrt backend's shim only
    import jinja2

    from ..toolchain.build import build_shared_library
    from ..toolchain.headers import find_cuda_include, find_tensorrt_include

    template = (HERE / "kl_trt_register.cpp.j2").read_text()
    source = jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(
        library=library_name)
    return build_shared_library(f"kl_trt_register_{library_name.removesuffix('.so')}",
                                {"kl_trt_register.cpp": source},
                                include_dirs=[find_tensorrt_include(), find_cuda_include()])


BACKENDS: dict[str, TritonBackend] = {b.name: b for b in (OnnxRuntimeBackend(), PythonBackend(),
                                                          TensorRtBackend())}


def get_backend(name: str) -> TritonBackend:
    if name not in BACKENDS:
        raise InputError(f"unknown Triton backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]
