"""The TensorRT targets: IPluginV3 (trt-v3, and trt on TensorRT >= 10) and IPluginV2DynamicExt
(trt-v2), from the same launch plan."""

from .target import TrtTarget, TrtV2Target, TrtV3Target

__all__ = ["TrtTarget", "TrtV2Target", "TrtV3Target"]
