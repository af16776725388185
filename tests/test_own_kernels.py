"""kernel_lens's own kernels (issue 41, started): the skinny GEMM and split-KV decode attention
against torch references, run by Triton's interpreter on the CPU; both compile through the
pipeline a user's kernels take (capture, trace, AOT for sm_90) and the compiled model equals
eager. Their speed is not measured here (GPU host; not yet)."""

import math

import pytest
import torch

import kernel_lens as kl
from kernel_lens.kernels import decode_attention, skinny_matmul
from kernel_lens.kernels.skinny_gemm import GemmConfig

from conftest import eager_on_cpu


def _g(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("m,n,k,split,bias,res", [(1, 96, 200, 1, False, False), (3, 70, 130, 3, True, False),
                                                  (16, 64, 256, 2, True, True), (5, 33, 64, 1, False, True)])
def test_skinny_matmul_equals_torch(m, n, k, split, bias, res):
    x, w = torch.randn(m, k, generator=_g(1)), torch.randn(n, k, generator=_g(2)).t()  # a Linear's weight
    b = torch.randn(n, generator=_g(3)) if bias else None
    r = torch.randn(m, n, generator=_g(4)) if res else None
    cfg = GemmConfig(block_n=32, block_k=64, split_k=split)
    got = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b, r))
    want = x.double() @ w.double() + (b.double() if bias else 0) + (r.double() if res else 0)
    assert got.shape == (m, n) and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-4)
    again = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b, r))
    assert torch.equal(got, again)  # partials added in a fixed order


def test_skinny_matmul_in_half_accumulates_in_fp32():
    x, w = torch.randn(2, 512, generator=_g(5)).half(), torch.randn(512, 48, generator=_g(6)).half()
    got = eager_on_cpu(lambda a, b: skinny_matmul(a, b, config=GemmConfig(block_n=16, block_k=128, split_k=2)), (x, w))
    want = (x.float() @ w.float()).half()
    assert got.dtype == torch.float16 and (got.float() - want.float()).abs().max() <= 0.02


def test_skinny_matmul_refuses_more_rows_than_it_is_for():
    with pytest.raises(ValueError, match="M <= 16"):
        skinny_matmul(torch.randn(17, 8), torch.randn(8, 4))


def _attention(q, k, v, lengths, scale):
    B, Hq, D = q.shape
    group = Hq // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1).double(), v.repeat_interleave(group, 1).double()
    s = torch.einsum("bhd,bhsd->bhs", q.double(), kk) * scale
    s = s.masked_fill(torch.arange(k.shape[2])[None, None, :] >= lengths[:, None, None], float("-inf"))
    return torch.einsum("bhs,bhsd->bhd", s.softmax(-1), vv)


@pytest.mark.parametrize("splits,lengths", [(1, [37, 64]), (4, [1, 64]), (8, [50, 3])])
def test_decode_attention_equals_torch_with_grouped_heads(splits, lengths):
    B, Hq, Hkv, S, D = 2, 8, 2, 64, 48  # D not a power of two
    q = torch.randn(B, Hq, D, generator=_g(7))
    k, v = torch.randn(B, Hkv, S, D, generator=_g(8)), torch.randn(B, Hkv, S, D, generator=_g(9))
    lens = torch.tensor(lengths, dtype=torch.int32)
    got = eager_on_cpu(lambda *a: decode_attention(*a, splits=splits, block_s=16), (q, k, v, lens))
    want = _attention(q, k, v, lens, 1 / math.sqrt(D))
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


class _Decode(torch.nn.Module):
    """A decode step's hot ops through kernel_lens's own kernels."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(64, 32, generator=_g(10)), requires_grad=False)

    def forward(self, x, k, v, lengths):
        h = skinny_matmul(x, self.w.t(), config=GemmConfig(block_n=32, block_k=32, split_k=2))
        q = h.view(x.shape[0], 4, 16)
        return decode_attention(q, k, v, lengths, splits=2, block_s=16)


def test_the_own_kernels_compile_through_the_pipeline_and_equal_eager():
    model = _Decode()
    x = torch.randn(2, 32, generator=_g(11))
    k, v = torch.randn(2, 2, 32, 16, generator=_g(12)), torch.randn(2, 2, 32, 16, generator=_g(13))
    lens = torch.tensor([5, 32], dtype=torch.int32)
    c = kl.compile(model, (x, k, v, lens), arch=90)
    assert sorted({l.kernel for l in c.ir.launches}) == ["_add_partials", "_decode_combine",
                                                         "_decode_split", "_skinny_gemm"]
    assert all(b.arch == 90 for kern in c.ir.kernels.values() for b in kern.binaries)
    lens2 = torch.tensor([17, 1], dtype=torch.int32)
    assert torch.equal(c.run(x, k, v, lens2), eager_on_cpu(model, (x, k, v, lens2)))


def test_skinny_matmul_on_the_tensor_cores_pads_rows_to_16_and_equals_torch():
    x, w = torch.randn(3, 96, generator=_g(14)), torch.randn(40, 96, generator=_g(15)).t()
    b, r = torch.randn(40, generator=_g(16)), torch.randn(3, 40, generator=_g(17))
    cfg = GemmConfig(block_n=32, block_k=32, split_k=2, dot=True)
    got = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b, r))
    want = x.double() @ w.double() + b.double() + r.double()
    assert got.shape == (3, 40) and torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3)
