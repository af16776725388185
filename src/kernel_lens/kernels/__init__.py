"""kernel_lens's own Triton kernels for the hot ops of decode (issue 41): a skinny GEMM for
M <= 16 (:mod:`.skinny_gemm`) and split-KV decode attention (:mod:`.decode_attention`).

They are plain ``@triton.jit`` kernels with torch launchers, so they go through the same
capture, trace and AOT pipeline as a user's kernels. Work in progress: the graph pass that
puts them in place of ONNX Runtime's MatMul and Attention is not written yet, and nothing here
has been measured on a GPU.
"""

from .decode_attention import decode_attention
from .skinny_gemm import skinny_matmul

__all__ = ["decode_attention", "skinny_matmul"]
