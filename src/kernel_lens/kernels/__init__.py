"""kernel_lens's own Triton kernels for the hot ops of decode (issue 41): a skinny GEMM for
M <= 16 (:mod:`.skinny_gemm`) and split-KV decode attention (:mod:`.decode_attention`).

They are plain ``@triton.jit`` kernels with torch launchers, so they go through the same
capture, trace and AOT pipeline as a user's kernels. ``optimize=2`` puts the skinny GEMM in
place of ``F.linear`` with <= 16 rows (:mod:`kernel_lens.frontends.own_kernels`); nothing puts
the decode attention in place of a model's attention yet. Measured alone on the H200:
benchmarks/bench_own_kernels.py.
"""

from .decode_attention import decode_attention
from .skinny_gemm import skinny_matmul

__all__ = ["decode_attention", "skinny_matmul"]
