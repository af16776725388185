"""GraphIR → ONNX: Triton launches as ``kernel_lens`` custom-domain nodes, torch ops as ONNX."""

from .aten import TRANSLATIONS, supported_ops
from .lower import DOMAIN, Lowering, lower_to_onnx, onnx_dtype, save_onnx

__all__ = ["DOMAIN", "Lowering", "TRANSLATIONS", "lower_to_onnx", "onnx_dtype", "save_onnx",
           "supported_ops"]
