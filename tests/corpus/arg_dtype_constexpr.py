"""``tl.dtype`` values passed as constexprs, as libraries choose accumulator and output types on
the host: an annotated ``ACC_DTYPE: tl.constexpr`` and ``OUT_DTYPE: tl.constexpr`` (fp16, bf16 and
fp8 e4m3 outputs, fp32 and fp64 accumulators), and an *unannotated* parameter that receives a
dtype wrapped as ``tl.constexpr(tl.float64)`` (Triton's binder refuses a bare ``tl.dtype`` for an
unannotated parameter, and makes a ``tl.constexpr`` value a constexpr)."""

import torch
import triton
import triton.language as tl


@triton.jit
def scale_cast_kernel(x_ptr, out_ptr, n, scale, ACC_DTYPE: tl.constexpr, OUT_DTYPE: tl.constexpr,
                      BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask).to(ACC_DTYPE)
    y = x * scale.to(ACC_DTYPE) + 0.1
    tl.store(out_ptr + offs, y.to(OUT_DTYPE), mask=mask)


@triton.jit
def sum_rows_kernel(x_ptr, out_ptr, cols, acc_dtype, BLOCK: tl.constexpr):  # acc_dtype: wrapped
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=acc_dtype)
    for start in range(0, cols, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * cols + offs, mask=offs < cols, other=0.0).to(acc_dtype)
    tl.store(out_ptr + row, tl.sum(acc, axis=0).to(out_ptr.dtype.element_ty))


_TL = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float8_e4m3fn: tl.float8e4nv}


class Model(torch.nn.Module):
    def forward(self, x):
        n = x.numel()
        outs = []
        for dtype, acc in ((torch.float16, tl.float64), (torch.bfloat16, tl.float32),
                           (torch.float8_e4m3fn, tl.float32)):
            out = torch.empty(x.shape, dtype=dtype, device=x.device)
            scale_cast_kernel[(triton.cdiv(n, 128),)](x, out, n, 0.75, ACC_DTYPE=acc,
                                                      OUT_DTYPE=_TL[dtype], BLOCK=128)
            outs.append(out)
        sums = torch.empty(x.shape[0], dtype=torch.float32, device=x.device)
        sum_rows_kernel[(x.shape[0],)](x, sums, x.shape[1], tl.constexpr(tl.float64), BLOCK=64)
        return (*outs, sums)


def _make_inputs(rows=6, cols=80):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cols, generator=g),)


def reference(x):
    outs = []
    for dtype, acc in ((torch.float16, torch.float64), (torch.bfloat16, torch.float32),
                       (torch.float8_e4m3fn, torch.float32)):
        scale = torch.tensor(0.75, dtype=torch.float32).to(acc)
        outs.append((x.to(acc) * scale + 0.1).to(dtype))
    return (*outs, x.double().sum(1).float())


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=2, max=1024),
                        1: torch.export.Dim("cols", min=2, max=4096)}}
expected_roles = {"scale_cast_kernel": {"x_ptr": "input", "out_ptr": "output"},
                  "sum_rows_kernel": {"x_ptr": "input", "out_ptr": "output"}}
tolerance = (1e-6, 1e-6)  # capture rounds every float conversion as a GPU does
