"""Running compiled artifacts from Python: ONNX Runtime sessions over torch tensors."""
