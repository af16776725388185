"""kernel_lens's own Triton kernels for the hot ops of decode (issue 41): a skinny GEMM for
M <= 16 (:mod:`.skinny_gemm`) and split-KV decode attention (:mod:`.decode_attention`).

They are plain ``@triton.jit`` kernels with torch launchers, so they go through the same
capture, trace and AOT pipeline as a user's kernels. ``optimize=2`` puts the skinny GEMM in
place of ``F.linear`` with <= 16 rows (and the add of a residual to its result into its
epilogue) and the decode attention in place of one-position SDPA
(:mod:`kernel_lens.frontends.own_kernels`). Measured alone on the H200:
benchmarks/bench_own_kernels.py.

Each of them writes only the buffers its torch launcher allocates, so a launch whose results
nothing reads can be dropped (:func:`is_own_kernel`; the ONNX lowering does).
"""

from .decode_attention import decode_attention
from .skinny_gemm import skinny_matmul

__all__ = ["decode_attention", "is_own_kernel", "skinny_matmul"]


def is_own_kernel(qualname: str) -> bool:
    """Whether the ``@triton.jit`` function of this module-qualified name is one of these."""
    return qualname.startswith(__name__ + ".")
