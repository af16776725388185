"""Lowering of GraphIR to ONNX: launches as custom nodes, ATen ops through onnxscript's torchlib."""

from .lower import DOMAIN, Lowering, lower_to_onnx, onnx_dtype, save_onnx, supported

__all__ = ["DOMAIN", "Lowering", "lower_to_onnx", "onnx_dtype", "save_onnx", "supported"]
