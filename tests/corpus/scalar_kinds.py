"""Every scalar kind Triton takes as a kernel argument, in one kernel.

Typed by Triton's binder as: ``flag`` (Python bool) u1; ``n`` i32 (a dynamic dim); ``big`` and
``neg_big`` i64 (beyond 2**31, positive and negative); ``int_min`` i64 (-2**63); ``huge`` u64
(>= 2**63); ``small_u: tl.uint32`` u32 (>= 2**31); ``off: tl.int1`` u1; ``scale``, ``pos_inf``,
``neg_inf`` and ``nan`` (Python floats) fp32; ``shift: tl.float64`` fp64. The kernel folds each
one into its output so a wrong value or type shows: the integers sum to a small exact offset,
``scale`` is not exactly representable (its fp32 rounding matters), ``shift`` is added in fp64,
values beyond +-3 become +-inf, and nan only passes ``nan != nan``. ``scale.to(tl.float32)`` is
what Liger-Kernel's RMSNorm does with its ``eps``.
"""

import torch
import triton
import triton.language as tl

BIG = 3_000_000_007            # i64: above 2**31
NEG_BIG = -3_000_000_123       # i64: below -2**31
INT_MIN = -(2**63)             # i64: the minimum (no bare C++ literal spells it)
HUGE = 9_223_372_036_854_775_813  # u64: >= 2**63
SMALL_U = 4_000_000_000        # u32 (annotated), above 2**31
SCALE = 0.1                    # fp32 (rounded to 0.100000001490116...)
SHIFT = 0.1                    # fp64 (annotated)


@triton.jit
def scalar_kinds_kernel(x_ptr, out_ptr, n, flag, scale, shift: tl.float64, big, neg_big, int_min, huge,
                        small_u: tl.uint32, off: tl.int1, pos_inf, neg_inf, nan,
                        BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    ints = ((big - 3000000000).to(tl.float32) + (neg_big + 3000000000).to(tl.float32)
            + (int_min + 9223372036854775807).to(tl.float32)
            + (huge - 9223372036854775000).to(tl.float32)
            + (small_u - 3999999990).to(tl.float32))
    y = x * scale.to(tl.float32) + shift.to(tl.float64)
    y = y + ints
    y = tl.where(flag, y, x)
    y = tl.where(off, 0.0, y)
    y = tl.where(x > 3.0, pos_inf, y)
    y = tl.where(x < -3.0, neg_inf, y)
    y = tl.where(nan != nan, y, -1.0)
    tl.store(out_ptr + offs, y, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        n = x.numel()
        block = 128
        scalar_kinds_kernel[(triton.cdiv(n, block),)](
            x, out, n, True, SCALE, SHIFT, BIG, NEG_BIG, INT_MIN, HUGE, SMALL_U, False,
            float("inf"), float("-inf"), float("nan"), BLOCK=block,
        )
        return out


def _make_inputs(n=300):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, generator=g)
    x[:4] = torch.tensor([5.0, -5.0, 3.5, -4.0])  # reach the +-inf branches
    return (x,)


def reference(x):
    ints = (BIG - 3000000000) + (NEG_BIG + 3000000000) + (INT_MIN + 2**63 - 1) \
        + (HUGE - 9223372036854775000) + (SMALL_U - 3999999990)
    y = (x * torch.tensor(SCALE, dtype=torch.float32)).double() + SHIFT + float(ints)
    y = y.float()
    y = torch.where(x > 3.0, float("inf"), y)
    return torch.where(x < -3.0, float("-inf"), y)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=1 << 20)}}
expected_roles = {"scalar_kinds_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (0.0, 0.0)
