"""Helper module for ``same_name.py``: a ``scale_kernel`` that multiplies by a scalar.

Not a corpus model by itself (no ``Model``); ``_ns_b.py`` defines a different kernel under the
same name.
"""

import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, alpha, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = x * alpha (flat)."""
    offsets = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * alpha, mask=mask)
