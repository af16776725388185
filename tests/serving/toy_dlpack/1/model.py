"""y = x + 1, g = 2 * h, m = n * 3 - 1, c = not b: tensors in and out through DLPack (torch),
never through NumPy (see docs/serving.md, "The tensor path")."""

import triton_python_backend_utils as pb_utils
from torch.utils.dlpack import from_dlpack, to_dlpack


def _input(request, name):
    return from_dlpack(pb_utils.get_input_tensor_by_name(request, name).to_dlpack())


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x, h, n, b = (_input(request, name) for name in ("x", "h", "n", "b"))
            outputs = {"y": x + 1, "g": h * 2, "m": n * 3 - 1, "c": ~b}
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor.from_dlpack(name, to_dlpack(t.contiguous())) for name, t in outputs.items()]))
        return responses
