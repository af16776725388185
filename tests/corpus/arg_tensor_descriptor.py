"""Host tensor descriptors (``triton.tools.tensor_descriptor.TensorDescriptor``, TMA on sm_90):
``y = 2 * x + b`` over row blocks, the input read and the output written through descriptors,
``b`` through a plain pointer. The rows are dynamic; on sm_90 Triton lowers both descriptors to
TMA, so the launcher encodes a CUtensorMap per call (the descriptor's shape and strides follow
the dynamic size). One descriptor pads with NaN (``padding="nan"``), one with zeros."""

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def desc_axpb_kernel(x_desc, y_desc, b_ptr, cols, BM: tl.constexpr, BN: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    x = x_desc.load([pid_m * BM, pid_n * BN])
    offs = pid_n * BN + tl.arange(0, BN)
    b = tl.load(b_ptr + offs, mask=offs < cols, other=0.0)
    y_desc.store([pid_m * BM, pid_n * BN], 2.0 * x + b[None, :])


class Model(torch.nn.Module):
    def forward(self, x, b):
        rows, cols = x.shape
        y = torch.empty_like(x)
        bm, bn = 16, 32
        x_desc = TensorDescriptor.from_tensor(x, [bm, bn])
        y_desc = TensorDescriptor(y, y.shape, y.stride(), [bm, bn], padding="nan")
        desc_axpb_kernel[(triton.cdiv(rows, bm), triton.cdiv(cols, bn))](x_desc, y_desc, b, cols,
                                                                         BM=bm, BN=bn)
        return y


def _make_inputs(rows=40, cols=64):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)


def reference(x, b):
    return 2.0 * x + b


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"x": {0: torch.export.Dim("rows", min=2, max=4096)}, "b": None}
expected_roles = {"desc_axpb_kernel": {"x_desc": "input", "y_desc": "output", "b_ptr": "input"}}
tolerance = (1e-6, 1e-6)
