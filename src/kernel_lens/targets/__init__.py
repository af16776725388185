"""Targets consume GraphIR and emit native plugins (ONNX Runtime, TensorRT, third parties)."""
