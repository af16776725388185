"""The ONNX Runtime target (CUDA execution provider)."""

from .target import OrtTarget

__all__ = ["OrtTarget"]
