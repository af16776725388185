"""y = x + 1 through NumPy: as_numpy() in, pb_utils.Tensor(name, ndarray) out."""

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", x + 1)]))
        return responses
