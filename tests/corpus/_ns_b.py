"""Helper module for ``same_name.py``: a ``scale_kernel`` that multiplies by a per-column vector.

Not a corpus model by itself (no ``Model``); ``_ns_a.py`` defines a different kernel under the
same name, with a different signature.
"""

import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, scale_ptr, out_ptr, n_rows, n_cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """out[i, j] = x[i, j] * scale[j] for a contiguous (n_rows, n_cols) tensor."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offsets = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offsets, mask=mask)
    scale = tl.load(scale_ptr + cols, mask=cols < n_cols)
    tl.store(out_ptr + offsets, x * scale[None, :], mask=mask)
