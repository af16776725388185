"""Run a kernel_lens TensorRT build (the ONNX graph + the plugin library) with TensorRT, on torch
CUDA tensors, zero-copy.

The engine is built once and cached as a file in ``<kernel_lens cache>/tensorrt-engines``, keyed
by the ONNX graph, the plugin library, the TensorRT package and version, and the GPU (name and
compute capability). A cached engine is used only if it passes the cache's one trust check
(:mod:`kernel_lens.toolchain.cache`: a regular file, not a link, of the current user that no one
else can write, whose sha256 matches the one recorded when it was built, in a folder of the same
kind), else it is rebuilt: TensorRT deserializes an engine into code it runs. Its optimization
profile comes from the IR's symbol ranges, with the captured sizes
as ``opt`` (:func:`~kernel_lens.codegen.profile.optimization_profile`). Works with the
``tensorrt`` Python package (TensorRT 10+) and with TensorRT-RTX's (``tensorrt_rtx``): the same
builder API. Inputs and outputs are bound by address to torch's memory and the engine runs on
torch's current stream (``execute_async_v3``), with no synchronization added.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import threading
from pathlib import Path
from typing import Any, Sequence

import torch

from ..codegen.profile import optimization_profile
from ..errors import KernelLensError
from ..fileio import inside
from ..ir import GraphIR
from ..toolchain import cache
from .signature import CallSignature, check_device

# The Python packages that provide TensorRT's builder API, in the order they are tried:
# TensorRT itself, then TensorRT-RTX (``tensorrt_rtx``; its PyPI bindings wheel imports as
# ``tensorrt_rtx_bindings``).
PACKAGES = ("tensorrt", "tensorrt_rtx", "tensorrt_rtx_bindings")
_loaded_libraries: set[tuple[str, str]] = set()  # (package, library): the registry is process-global
_load_lock = threading.Lock()


def import_tensorrt(package: str | None = None) -> Any:
    """TensorRT's Python module (``package``, or the first of :data:`PACKAGES` that imports)."""
    errors = []
    for name in (package,) if package else PACKAGES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            errors.append(f"{name}: {exc}")
    raise KernelLensError(
        "running a TensorRT build needs TensorRT's Python package: pip install tensorrt (TensorRT "
        "10 or newer, any NVIDIA GPU) or tensorrt-rtx (TensorRT-RTX, RTX GPUs); " + "; ".join(errors))


def gpu_identity() -> str:
    """The GPU an engine is built for (engines are specific to it): name and compute capability
    of torch's current CUDA device, or ``no-gpu`` (TensorRT-RTX builds engines without one)."""
    if not torch.cuda.is_available():
        return "no-gpu"
    index = torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    return f"{torch.cuda.get_device_name(index)} sm_{major}{minor}"


def trusted_engine_folder(folder: str | Path) -> Path:
    """A TensorRT engine folder given by the caller, made if missing and checked like every
    cache folder (real, the user's own, writable by no one else; else CacheError)."""
    return cache.trusted_folder(folder, "TensorRT engine cache folder", create=True)


def cached_engine(path: str | Path) -> bytes | None:
    """The serialized engine cached at ``path`` if it can be trusted, else None (a warning says
    why when it exists): the cache's one trust check, engines included."""
    return cache.read_entry(path, "TensorRT engine")


class TrtModel:
    """A TensorRT engine over a compiled model, called with torch CUDA tensors."""

    def __init__(self, ir: GraphIR, onnx_path: str | Path, library_path: str | Path, *,
                 package: str | None = None, cache_dir: str | Path | None = None) -> None:
        self.trt = import_tensorrt(package)
        self.ir = ir
        self.onnx_path, self.library_path = Path(onnx_path), Path(library_path)
        self.signature = CallSignature(ir)
        self._cache_dir = Path(cache_dir) if cache_dir is not None else None
        self._logger = self.trt.Logger(self.trt.Logger.WARNING)
        self._builder = self.trt.Builder(self._logger)  # before load_library: its errors are logged
        self._load_library()
        self._lock = threading.Lock()  # one execution context: shapes, addresses and enqueue together
        self._contexts: dict[int, Any] = {}  # device index -> (engine, execution context)
        self._mutated: list[tuple[str, int]] = []
        self._written: tuple[int, ...] = ()  # the indices of the inputs in _mutated
        self.engine_path: Path | None = None

    # --- the engine --------------------------------------------------------------------------
    def _load_library(self) -> None:
        key = (self.trt.__name__, str(self.library_path.resolve()))
        with _load_lock:
            if key in _loaded_libraries:
                return
            if self.trt.get_plugin_registry().load_library(str(self.library_path)) is None:
                raise KernelLensError(f"{self.trt.__name__} could not load the plugin library "
                                      f"{self.library_path} (see TensorRT's log above)")
            _loaded_libraries.add(key)

    def profile(self) -> dict[str, list[tuple[int, int, int]]]:
        return optimization_profile(self.ir)

    def engine_key(self) -> str:
        """The engine's cache key: what the engine depends on."""
        digest = hashlib.sha256()
        for path in (self.onnx_path, self.library_path):
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        digest.update(json.dumps([self.trt.__name__, self.trt.__version__, gpu_identity(),
                                  self.profile()]).encode())
        return digest.hexdigest()

    def _engine_cache(self) -> Path:
        """The engine folder, made if missing and checked like every cache folder (CacheError)."""
        if self._cache_dir is None:
            return cache.cache_folder(cache.TENSORRT_ENGINES)
        return trusted_engine_folder(self._cache_dir)

    def _engine(self) -> tuple[Path, bytes]:
        """The engine's cache path and its bytes: the cached engine if it can be trusted, else
        one built now and cached."""
        path = inside(self._engine_cache(), f"{self.ir.name}-{self.engine_key()[:32]}.engine")
        data = cached_engine(path)
        if data is None:
            data = self._build()
            cache.write_entry(path, data)
        self.engine_path = path
        return path, data

    def build_engine(self) -> Path:
        """The serialized engine for this GPU and TensorRT (built now, or found in the cache)."""
        return self._engine()[0]

    def _build(self) -> bytes:
        trt = self.trt
        flags = 0
        if hasattr(trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED"):  # the ONNX graph's types, as written
            flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
        network = self._builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse(self.onnx_path.read_bytes()):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise KernelLensError(f"{trt.__name__}'s ONNX parser refused {self.onnx_path}: {errors}")
        config = self._builder.create_builder_config()
        profile = self._builder.create_optimization_profile()
        dims = self.profile()
        for i in range(network.num_inputs):
            name = network.get_input(i).name
            profile.set_shape(name, *[tuple(d[k] for d in dims[name]) for k in range(3)])
        config.add_optimization_profile(profile)
        engine = self._builder.build_serialized_network(network, config)
        if engine is None:
            raise KernelLensError(f"{trt.__name__} could not build an engine from {self.onnx_path} "
                                  f"(see TensorRT's log above)")
        return bytes(engine)

    def _context(self, index: int) -> Any:
        """The execution context on device ``index`` (its engine deserialized there once)."""
        if index in self._contexts:
            return self._contexts[index][1]
        check_device(self.ir, index)
        path, data = self._engine()  # the bytes checked, not the file read again
        engine = self.trt.Runtime(self._logger).deserialize_cuda_engine(data)
        if engine is None:
            raise KernelLensError(f"{self.trt.__name__} could not deserialize {path} on this GPU "
                                  f"({gpu_identity()}); delete it to rebuild")
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        self._mutated = [(n, self.ir.inputs.index(n.removeprefix("mutated_"))) for n in names
                         if n.startswith("mutated_")]
        self._written = tuple(i for _, i in self._mutated)
        self._contexts[index] = (engine, engine.create_execution_context())
        return self._contexts[index][1]

    # --- running -----------------------------------------------------------------------------
    def run(self, *tensors: torch.Tensor, out: Sequence[torch.Tensor] | None = None):
        if not torch.cuda.is_available():
            raise KernelLensError(f"{self.ir.name}: running a TensorRT engine needs a CUDA GPU; none "
                                  f"is visible to torch (build_engine() works without one)")
        # inputs and out=, before any engine is built (checked once per layout)
        call = self.signature.checked(tensors, out)
        device, shapes = call.device, call.shapes
        with self._lock, torch.cuda.device(device):
            context = self._context(device.index)  # knows which inputs the engine writes
            if self._written:
                self.signature.checked(tensors, out, self._written)
            outputs = list(out) if out is not None else \
                [torch.empty(s, dtype=o.dtype, device=device) for s, o in zip(shapes, self.signature.outputs)]
            mutated = [torch.empty_like(tensors[i]) for _, i in self._mutated]
            for spec, t in zip(self.signature.inputs, tensors):
                context.set_input_shape(spec.name, tuple(t.shape))
                context.set_tensor_address(spec.name, t.data_ptr())
            bound = [(f"output_{i}", t) for i, t in enumerate(outputs)]
            bound += [(name, t) for (name, _), t in zip(self._mutated, mutated)]
            for name, t in bound:
                if tuple(context.get_tensor_shape(name)) != tuple(t.shape):
                    raise KernelLensError(f"{self.ir.name}: TensorRT computes shape "
                                          f"{tuple(context.get_tensor_shape(name))} for {name}, the "
                                          f"IR {tuple(t.shape)}; recompile")
                context.set_tensor_address(name, t.data_ptr())
            if not context.execute_async_v3(torch.cuda.current_stream(device).cuda_stream):
                raise KernelLensError(f"{self.ir.name}: TensorRT failed to enqueue the engine (see "
                                      f"TensorRT's log above)")
        for (_, i), new in zip(self._mutated, mutated):  # the model mutates these inputs: so does
            tensors[i].copy_(new)                         # the compiled model
        return outputs[0] if len(outputs) == 1 else tuple(outputs)
