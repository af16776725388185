"""Triton Inference Server python-backend model for a kernel_lens compiled model.

`kernel_lens export-triton --backend python` copies this file, unchanged, to
``REPO/NAME/1/model.py``, beside the model's ONNX graph and custom-op library; config.pbtxt's
parameters name those two files. Nothing here imports kernel_lens: the serving host needs
torch and onnxruntime-gpu only (plus the stub's own numpy).

Each Triton instance (one stub process) opens the ONNX graph with ONNX Runtime's CUDA execution
provider and the kernel_lens custom-op library, on the GPU Triton assigned to it
(``model_instance_device_id``), and serves its requests:
- inputs come from Triton through DLPack as torch tensors: on the GPU when Triton has them there
  (FORCE_CPU_ONLY_INPUT_TENSORS is "no"), else on the CPU (HTTP/gRPC requests), and then copied
  to the instance's GPU on the model's own stream;
- they are bound with IOBinding, zero-copy; ONNX Runtime allocates the outputs on the GPU;
- the session runs on the model's own CUDA stream (CUDA EP option ``user_compute_stream``), which
  is synchronized before the responses leave;
- outputs go back to Triton through DLPack, zero-copy (torch tensors over ONNX Runtime's memory).

Tensors never pass through NumPy: with NumPy 2 in the stub's environment, the stub of
nvidia-pytriton 0.7.0 (Triton 2.51) reads wrong values from ``as_numpy()`` and sends empty
outputs for ``pb_utils.Tensor(name, ndarray)`` (docs/serving.md, "The tensor path").
"""

import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

NEEDS = "needs a CUDA GPU and onnxruntime-gpu (with its CUDAExecutionProvider)"

# ONNX Runtime's type strings -> ONNX element types, which IOBinding takes for any dtype
# (NumPy has no bfloat16).
ONNX_TYPES = {
    "tensor(bool)": 9, "tensor(uint8)": 2, "tensor(uint16)": 4, "tensor(uint32)": 12,
    "tensor(uint64)": 13, "tensor(int8)": 3, "tensor(int16)": 5, "tensor(int32)": 6,
    "tensor(int64)": 7, "tensor(float16)": 10, "tensor(float)": 1, "tensor(double)": 11,
    "tensor(bfloat16)": 16,
}


class TritonPythonModel:
    """One instance of the model: an ONNX Runtime session on one GPU, on its own stream."""

    def initialize(self, args):
        self.name = args["model_name"]
        config = json.loads(args["model_config"])
        parameters = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        folder = Path(args["model_repository"]) / args["model_version"]
        library = self._file(folder, parameters, "kernel_lens_op_library")
        graph = self._file(folder, parameters, "kernel_lens_onnx")
        self.torch, ort = self._imports()
        self.device = self._device(args, ort)
        self.torch.cuda.set_device(self.device)
        self.stream = self.torch.cuda.Stream(self.device)

        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only
        options.register_custom_ops_library(str(library))
        cuda = {"device_id": str(self.device.index),
                "use_tf32": parameters.get("kernel_lens_use_tf32", "0"),
                "has_user_compute_stream": "1", "user_compute_stream": str(self.stream.cuda_stream)}
        self.session = ort.InferenceSession(str(graph), options,
                                            providers=[("CUDAExecutionProvider", cuda)])
        if "CUDAExecutionProvider" not in self.session.get_providers():
            raise RuntimeError(f"kernel_lens model {self.name!r} {NEEDS}: ONNX Runtime opened the "
                               f"session without it ({self.session.get_providers()})")
        self.binding = self.session.io_binding()
        self.inputs = [(i.name, ONNX_TYPES[i.type], len(i.shape)) for i in self.session.get_inputs()]
        self.outputs = [(o.name, o.type == "tensor(bool)") for o in self.session.get_outputs()]
        self.run_options = ort.RunOptions()
        # The stream is synchronized here, after the run: ORT need not synchronize it too.
        self.run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        self.run_options.add_run_config_entry("gpu_graph_id", "-1")  # never capture a CUDA graph

    def _file(self, folder, parameters, key):
        """The file config.pbtxt's parameter ``key`` names in the version folder: a plain file
        name only (no path, not hidden), so a config cannot make this stub dlopen a library
        from elsewhere."""
        name = parameters.get(key, "")
        if not name or name in (".", "..") or name.startswith(".") or Path(name).name != name \
                or "\\" in name or not name.isprintable():
            raise RuntimeError(f"kernel_lens model {self.name!r}: config.pbtxt parameter {key} is "
                               f"{name!r}, not a plain file name in {folder}; re-export the model "
                               f"with kernel_lens export-triton")
        return folder / name

    def _imports(self):
        """torch and onnxruntime, imported here (not at module import) so that a host without
        them gets this model's own message instead of an ImportError."""
        try:
            # lazy: a host without them gets this model's own message, not an ImportError
            import onnxruntime
            import torch
        except ImportError as exc:
            raise RuntimeError(f"kernel_lens model {self.name!r} {NEEDS}, and torch: {exc}; install "
                               f"them into the Python environment the python backend's stub runs "
                               f"(the first python3 on tritonserver's PATH)") from None
        return torch, onnxruntime

    def _device(self, args, ort):
        kind = args.get("model_instance_kind", "")
        if kind != "GPU" or not self.torch.cuda.is_available():
            raise RuntimeError(f"kernel_lens model {self.name!r} {NEEDS}: Triton placed this instance "
                               f"on {kind or 'no device'} and torch sees "
                               f"{self.torch.cuda.device_count()} CUDA device(s)")
        providers = ort.get_available_providers()
        if "CUDAExecutionProvider" not in providers:
            raise RuntimeError(f"kernel_lens model {self.name!r} {NEEDS}: onnxruntime "
                               f"{ort.__version__} offers only {providers}; install onnxruntime-gpu")
        return self.torch.device("cuda", int(args["model_instance_device_id"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            try:
                outputs = self._run(request)
            except Exception as exc:  # this request's error goes to its client; serving goes on
                responses.append(pb_utils.InferenceResponse(
                    output_tensors=[], error=pb_utils.TritonError(f"{self.name}: {exc}")))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses

    def _run(self, request):
        from torch.utils.dlpack import to_dlpack  # lazy: torch comes in through _imports

        torch = self.torch
        index = self.device.index
        with torch.cuda.stream(self.stream):
            inputs = [self._input(request, name, rank) for name, _, rank in self.inputs]
            for (name, code, _), tensor in zip(self.inputs, inputs):
                self.binding.bind_input(name, "cuda", index, code, tuple(tensor.shape), tensor.data_ptr())
            self.binding.clear_binding_outputs()  # fresh outputs: earlier ones may still be in use
            for name, _ in self.outputs:
                self.binding.bind_output(name, "cuda", index)
            self.session.run_with_iobinding(self.binding, self.run_options)
            values = self.binding.get_outputs()
            outputs = [self._output(value, is_bool) for value, (_, is_bool) in zip(values, self.outputs)]
        self.stream.synchronize()  # the outputs are complete, and the inputs no longer read
        return [pb_utils.Tensor.from_dlpack(name, to_dlpack(tensor))
                for (name, _), tensor in zip(self.outputs, outputs)]

    def _input(self, request, name, rank):
        from torch.utils.dlpack import from_dlpack  # lazy: torch comes in through _imports

        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            raise ValueError(f"the request has no input {name!r}")
        value = from_dlpack(tensor.to_dlpack())
        if value.device != self.device:  # a CPU input (HTTP/gRPC), or another GPU's
            value = value.to(self.device)
        if rank == 0:  # Triton serves rank-0 tensors as [1]
            value = value.reshape(())
        return value.contiguous()

    def _output(self, value, is_bool):
        """A torch tensor over the memory of ONNX Runtime's output (it keeps the OrtValue alive)."""
        from torch.utils.dlpack import from_dlpack  # lazy: torch comes in through _imports

        tensor = from_dlpack(value._get_c_value().to_dlpack())
        if is_bool:  # ONNX Runtime exports bool tensors as uint8 through DLPack
            tensor = tensor.view(self.torch.bool)
        if tensor.dim() == 0:  # Triton serves rank-0 tensors as [1]
            tensor = tensor.reshape(1)
        return tensor

    def finalize(self):
        self.binding = self.session = None
