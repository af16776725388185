"""Run a kernel_lens ONNX model with ONNX Runtime's CUDA EP on torch tensors, zero-copy.

Inputs and outputs are bound with IOBinding to torch's memory; the session runs on torch's
current CUDA stream (ORT's ``user_compute_stream``), so no synchronization is added and the
custom ops launch on the same stream torch uses.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Sequence

import sympy
import torch

from ..errors import InputError, KernelLensError
from ..ir import DType, GraphIR, parse
from ..ir.types import torch_name
from ..onnx import onnx_dtype

class OrtModel:
    """An ONNX Runtime session over a compiled model, called with torch CUDA tensors."""

    def __init__(self, ir: GraphIR, onnx_path: str | Path, library_path: str | Path) -> None:
        try:
            import onnxruntime as ort
        except ImportError:
            raise KernelLensError("running needs onnxruntime-gpu: pip install 'kernel_lens[ort]'") from None
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise KernelLensError(
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                f"({ort.get_available_providers()}); install onnxruntime-gpu")
        self._ort = ort
        self.ir = ir
        self.onnx_path, self.library_path = str(onnx_path), str(library_path)
        names = list(ir.symbols)
        self._shape_fns = {
            name: [sympy.lambdify(list(map(sympy.Symbol, names)), parse(s, names), "math")
                   for s in ir.values[name].shape] for name in ir.outputs}
        self._sessions: dict[tuple[int, int], object] = {}
        self._side_streams: dict[int, torch.cuda.Stream] = {}
        self._lock = threading.Lock()  # one IOBinding per session: bind + run must not interleave
        # Per input dim: an int, or a function of the symbol values (checked on every call).
        self._dims = [[int(t) if t.lstrip("-").isdigit() else
                       sympy.lambdify(list(map(sympy.Symbol, names)), parse(t, names), "math")
                       for t in ir.values[n].shape] for n in ir.inputs]
        self._run_options = ort.RunOptions()
        # Work stays queued on torch's stream: no device synchronization at the end of Run.
        self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        model_outputs = [f"output_{i}" for i in range(len(ir.outputs))]
        self._mutated = [o.name for o in self._session_meta() if o.name.startswith("mutated_")]
        self._output_names = model_outputs

    def _session_meta(self):
        import onnx

        return onnx.load(self.onnx_path, load_external_data=False).graph.output

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        """The stream ORT runs on: torch's current one, or, when that is the legacy default
        stream (which ORT cannot be given), a side stream ordered against it with events."""
        current = torch.cuda.current_stream(device)
        if current.cuda_stream:
            return current
        if device.index not in self._side_streams:
            self._side_streams[device.index] = torch.cuda.Stream(device)
        return self._side_streams[device.index]

    def session(self, device: torch.device, stream: torch.cuda.Stream):
        key = (device.index, stream.cuda_stream)
        if key not in self._sessions:
            so = self._ort.SessionOptions()
            so.log_severity_level = 3  # errors only
            so.register_custom_ops_library(self.library_path)
            # fp32 matmuls in ORT use TF32 by default; follow torch's setting instead.
            options = {"device_id": str(device.index),
                       "use_tf32": str(int(torch.backends.cuda.matmul.allow_tf32)),
                       "has_user_compute_stream": "1", "user_compute_stream": str(stream.cuda_stream)}
            session = self._ort.InferenceSession(
                self.onnx_path, so, providers=[("CUDAExecutionProvider", options)])
            # One IOBinding per session, rebound on every call (creating one costs ~50 µs).
            self._sessions[key] = (session, session.io_binding())
        return self._sessions[key]

    # --- validation --------------------------------------------------------------------------
    def symbol_values(self, tensors: Sequence[torch.Tensor]) -> dict[str, int]:
        ir = self.ir
        if len(tensors) != len(ir.inputs):
            raise InputError(f"{ir.name} takes {len(ir.inputs)} inputs ({', '.join(ir.inputs)}), "
                             f"got {len(tensors)}")
        device = None
        for name, t in zip(ir.inputs, tensors):
            value = ir.values[name]
            if not isinstance(t, torch.Tensor):
                raise InputError(f"input {name!r} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != "cuda":
                raise InputError(f"input {name!r} is on {t.device}; move it to a CUDA device")
            if device is not None and t.device != device:
                raise InputError(f"input {name!r} is on {t.device}, other inputs on {device}")
            device = t.device
            if torch_name(value.dtype) != str(t.dtype).removeprefix("torch."):
                raise InputError(f"input {name!r} has dtype {t.dtype}; the model was compiled for "
                                 f"torch.{torch_name(value.dtype)}")
            if t.dim() != len(value.shape):
                raise InputError(f"input {name!r} has rank {t.dim()}, expected {len(value.shape)} "
                                 f"(shape {value.shape})")
            if not t.is_contiguous():
                raise InputError(f"input {name!r} is not contiguous; pass x.contiguous()")
        values: dict[str, int] = {}
        for sym, info in ir.symbols.items():
            size = tensors[info.input].shape[info.dim]
            value, rest = divmod(size - info.offset, info.scale)
            if rest or value < info.min or (info.max is not None and value > info.max):
                hi = "inf" if info.max is None else info.max
                raise InputError(
                    f"input {ir.inputs[info.input]!r} dim {info.dim} = {size}: dynamic dim {sym} "
                    f"must be in [{info.min}, {hi}]" + (f" with size {info.scale}*{sym}+{info.offset}"
                                                        if info.scale != 1 or info.offset else ""))
            values[sym] = value
        args = list(values.values())
        for name, t, dims in zip(ir.inputs, tensors, self._dims):  # static and shared dims
            for d, dim in enumerate(dims):
                expected = dim if isinstance(dim, int) else int(dim(*args))
                if t.shape[d] != expected:
                    text = ir.values[name].shape[d]
                    raise InputError(f"input {name!r} dim {d} is {t.shape[d]}, expected {text} = {expected}")
        return values

    # --- running -----------------------------------------------------------------------------
    def run(self, *tensors: torch.Tensor, out: Sequence[torch.Tensor] | None = None):
        ir = self.ir
        values = self.symbol_values(tensors)
        device = tensors[0].device
        args = [values[n] for n in ir.symbols]
        outputs = []
        for i, name in enumerate(ir.outputs):
            value = ir.values[name]
            shape = tuple(int(f(*args)) for f in self._shape_fns[name])
            dtype = getattr(torch, torch_name(value.dtype))
            if out is not None:
                t = out[i]
                if tuple(t.shape) != shape or t.dtype != dtype or t.device != device or not t.is_contiguous():
                    raise InputError(f"out[{i}] must be a contiguous {dtype} tensor of shape {shape} on {device}")
            else:
                t = torch.empty(shape, dtype=dtype, device=device)
            outputs.append(t)
        with self._lock:
            return self._run_locked(tensors, outputs, device)

    def _run_locked(self, tensors, outputs, device):
        ir = self.ir
        current = torch.cuda.current_stream(device)
        stream = self._stream(device)
        session, binding = self.session(device, stream)
        for name, t in zip(ir.inputs, tensors):
            binding.bind_input(name, "cuda", device.index, _element_type(ir.values[name].dtype), tuple(t.shape), t.data_ptr())
        for oname, t, name in zip(self._output_names, outputs, ir.outputs):
            binding.bind_output(oname, "cuda", device.index, _element_type(ir.values[name].dtype), tuple(t.shape), t.data_ptr())
        mutated = []
        for oname in self._mutated:
            src = tensors[ir.inputs.index(oname.removeprefix("mutated_"))]
            new = torch.empty_like(src)
            binding.bind_output(oname, "cuda", device.index, _element_type(ir.values[oname.removeprefix("mutated_")].dtype),
                                tuple(new.shape), new.data_ptr())
            mutated.append((src, new))
        if stream is not current:
            stream.wait_stream(current)  # inputs and outputs are ready on the caller's stream
        session.run_with_iobinding(binding, self._run_options)
        if stream is not current:
            current.wait_stream(stream)  # the caller's later work sees the results
        for src, new in mutated:  # the model mutates these inputs: so does the compiled model
            src.copy_(new)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


def _element_type(dtype: DType) -> int:
    """ORT's IOBinding element type: the ONNX TensorProto code (covers bf16 and fp8 too)."""
    return onnx_dtype(dtype)
