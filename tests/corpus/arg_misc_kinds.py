"""The remaining argument kinds Triton's JIT accepts: a string constexpr choosing a code path,
``None`` for an optional pointer (annotated and not), a ``tl.constexpr(...)`` value passed to an
unannotated parameter, module-level ``tl.constexpr`` globals read by the kernel, and
``do_not_specialize`` / ``do_not_specialize_on_alignment`` (no divisibility, equal-to-1 or
alignment assumptions for those arguments, whatever their values)."""

import torch
import triton
import triton.language as tl

GLOBAL_SCALE = tl.constexpr(0.5)
GLOBAL_BLOCK = tl.constexpr(64)


@triton.jit(do_not_specialize=["n", "one"], do_not_specialize_on_alignment=["x_ptr"])
def misc_kernel(x_ptr, bias_ptr, out_ptr, n, one, MODE: tl.constexpr, residual_ptr, shift):
    offs = tl.program_id(0) * GLOBAL_BLOCK + tl.arange(0, GLOBAL_BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask) * GLOBAL_SCALE * one
    if bias_ptr is not None:
        x += tl.load(bias_ptr + offs, mask=mask)
    if residual_ptr is not None:
        x += tl.load(residual_ptr + offs, mask=mask)
    if MODE == "relu":
        x = tl.maximum(x, 0.0)
    elif MODE == "square":
        x = x * x
    tl.store(out_ptr + offs, x + shift, mask=mask)


class Model(torch.nn.Module):
    def forward(self, x, bias):
        n = x.numel()
        a, b = torch.empty_like(x), torch.empty_like(x)
        grid = (triton.cdiv(n, 64),)
        misc_kernel[grid](x, bias, a, n, 1, "relu", None, tl.constexpr(3))
        misc_kernel[grid](x[1:], None, b[1:], n - 1, 1, MODE="square", residual_ptr=a[1:], shift=0.25)
        b[:1] = 0.0
        return a, b


def _make_inputs(n=300):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, bias):
    a = torch.relu(x * 0.5 + bias) + 3
    b = torch.empty_like(x)
    b[1:] = (x[1:] * 0.5 + a[1:]) ** 2 + 0.25
    b[:1] = 0.0
    return a, b


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=3, max=1 << 20)  # n - 1 >= 2: Triton folds an int equal to 1
dynamic_shapes = {"x": {0: _n}, "bias": {0: _n}}
expected_roles = {"misc_kernel": {"x_ptr": "input", "bias_ptr": "input", "out_ptr": "output",
                                  "residual_ptr": "input"}}
tolerance = (1e-6, 1e-6)
