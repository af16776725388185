"""Triton backends a compiled model can be exported for: one class per kind of model.

A backend says what goes into the model's version folder (``NAME/1/``) and what its
``config.pbtxt`` states beyond the interface (platform or backend, instance kind, parameters,
CUDA EP options, custom-op libraries). The export driver (:mod:`.export`) does the rest: the
interface from the ONNX graph, names, the atomic write. A new kind (e.g. ``tensorrt_plan`` once
the TensorRT targets can run) is one more class in :data:`BACKENDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InputError

HERE = Path(__file__).parent
VERSION = "1"           # the version folder every export writes
MODEL_FILE = "model.onnx"

# ONNX Runtime CUDA EP options that match kernel_lens's own runner (runtime/ort.py): TF32 off, as
# torch's default (torch.backends.cuda.matmul.allow_tf32 is False), where ORT's default is on.
CUDA_OPTIONS = {"use_tf32": "0"}


@dataclass(frozen=True)
class CompiledArtifacts:
    """What an export reads from a compile output folder (made by ``--target ort``)."""

    name: str                   # the compiled model's name (its IR's)
    onnx: Path                  # the ONNX graph
    onnx_data: dict[str, Path]  # its external-data files, by the location the graph names
    library: Path               # the custom-op library (libkl_<Name>_ort.so)


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


class TritonBackend:
    """Base class: a kind of Triton model a kernel_lens model is exported as."""

    name: str = ""
    description: str = ""

    def version_files(self, source: CompiledArtifacts) -> dict[str, Path]:
        """The files of ``NAME/1/``: file name -> the file to copy there."""
        return {MODEL_FILE: source.onnx, **source.onnx_data, source.library.name: source.library}

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
            cuda_options=dict(CUDA_OPTIONS), op_libraries=[source.library.name],
            notes=["op_library_filename is a bare file name: ONNX Runtime dlopen()s it as given, so",
                   f"start tritonserver with LD_LIBRARY_PATH=<this folder>/{VERSION}:$LD_LIBRARY_PATH",
                   "(or replace it with the library's absolute path); see docs/serving.md."])

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        folder = (model_dir / VERSION).absolute()
        return [f"op_library_filename is the bare name {source.library.name}: start tritonserver "
                f"with LD_LIBRARY_PATH={folder}:$LD_LIBRARY_PATH (ONNX Runtime dlopen()s the name as "
                f"given; a relative path would resolve against the server's working folder)"]


class PythonBackend(TritonBackend):
    """Triton's python backend (any tritonserver, e.g. the one in PyPI's nvidia-pytriton):
    ``model.py`` runs the ONNX graph with onnxruntime-gpu on torch tensors, zero-copy."""

    name = "python"
    description = "Triton's python backend: model.py + onnxruntime-gpu, DLPack tensors"

    def version_files(self, source: CompiledArtifacts) -> dict[str, Path]:
        return {"model.py": HERE / "triton_python_model.py", **super().version_files(source)}

    def config(self, source: CompiledArtifacts) -> BackendConfig:
        return BackendConfig(
            backend="python", instance_kind="KIND_AUTO",
            parameters={"FORCE_CPU_ONLY_INPUT_TENSORS": "no",  # GPU inputs stay on the GPU
                        "kernel_lens_onnx": MODEL_FILE,
                        "kernel_lens_op_library": source.library.name,
                        "kernel_lens_use_tf32": CUDA_OPTIONS["use_tf32"]},
            notes=["KIND_AUTO: one instance group on every GPU the server sees (as KIND_GPU); on a",
                   "server without a GPU the instance lands on the CPU and model.py refuses it with",
                   "a clear message (the model needs a CUDA GPU and onnxruntime-gpu)."])

    def deployment_notes(self, model_dir: Path, source: CompiledArtifacts) -> list[str]:
        return ["the python backend's stub imports torch and onnxruntime-gpu from the first python3 "
                "on tritonserver's PATH (python -m kernel_lens.serving.tritonserver REPO sets that up)"]


BACKENDS: dict[str, TritonBackend] = {b.name: b for b in (OnnxRuntimeBackend(), PythonBackend())}


def get_backend(name: str) -> TritonBackend:
    if name not in BACKENDS:
        raise InputError(f"unknown Triton backend {name!r}; choose one of {', '.join(BACKENDS)}")
    return BACKENDS[name]
