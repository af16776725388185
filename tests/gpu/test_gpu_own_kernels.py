"""GPU host only (issue 41): kernel_lens's own decode kernels compiled for the device, against
float64 torch references on the decode model's shapes, bit-stable run to run (split-K partials
and split-KV slices are added in a fixed order: no atomics), and through the ORT target bit for
bit against the same kernels launched eagerly."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

import kernel_lens as kl
from kernel_lens.kernels import decode_attention, skinny_matmul
from kernel_lens.kernels.skinny_gemm import GemmConfig

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _g(seed):
    return torch.Generator(device="cuda").manual_seed(seed)


@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("cfg", [GemmConfig(64, 128, 1), GemmConfig(32, 256, 4), GemmConfig(64, 128, 2, dot=True)],
                         ids=["plain", "split4", "dot_split2"])
def test_skinny_matmul_on_the_gpu_equals_float64_and_repeats_its_bits(m, cfg):
    n, k = 1024, 4096
    w = (torch.randn(n, k, device="cuda", generator=_g(1)) / math.sqrt(k)).half()
    x = torch.randn(m, k, device="cuda", generator=_g(2)).half()
    bias = torch.randn(n, device="cuda", generator=_g(3)).half()
    res = torch.randn(m, n, device="cuda", generator=_g(4)).half()
    y = skinny_matmul(x, w.t(), bias, config=cfg)
    want = x.double() @ w.double().t() + bias.double()
    cublas = torch.nn.functional.linear(x, w, bias).double()
    # an fp16 result: within an fp16 ulp (plus fp32 accumulation noise) of the float64 value,
    # and no further from it than cuBLAS's result plus one ulp
    ulp = want.abs().clamp(min=2 ** -14) * 2 ** -10
    assert ((y.double() - want).abs() <= ulp + 1e-4).all()
    assert (y.double() - want).abs().max() <= (cublas - want).abs().max() + ulp.max()
    # the residual in the epilogue: the bits of y + res (torch's fp16 add)
    got = skinny_matmul(x, w.t(), bias, res, config=cfg)
    assert torch.equal(got, y + res)
    for _ in range(3):
        assert torch.equal(skinny_matmul(x, w.t(), bias, res, config=cfg), got)


@pytest.mark.parametrize("b,s,splits,hq,hkv", [(1, 256, 4, 32, 8), (8, 4096, 16, 32, 8), (3, 1000, 8, 32, 8),
                                               (2, 700, 5, 16, 16), (2, 513, 3, 32, 1)])
def test_decode_attention_on_the_gpu_equals_float64_and_repeats_its_bits(b, s, splits, hq, hkv):
    """Groups of 4 (the bench model), 1 (MHA: one program a head) and 32 (MQA: past the 16-row
    tile); the tensor cores' products with p in fp16 stay within 2e-3 of float64."""
    d = 128
    q = torch.randn(b, hq, d, device="cuda", generator=_g(5)).half()
    k = torch.randn(b, hkv, s, d, device="cuda", generator=_g(6)).half()
    v = torch.randn(b, hkv, s, d, device="cuda", generator=_g(7)).half()
    lengths = torch.randint(1, s + 1, (b,), device="cuda", generator=_g(8), dtype=torch.int32)
    got = decode_attention(q, k, v, lengths, splits=splits)
    kk, vv = k.double().repeat_interleave(hq // hkv, 1), v.double().repeat_interleave(hq // hkv, 1)
    scores = torch.einsum("bhd,bhsd->bhs", q.double(), kk) / math.sqrt(d)
    scores = scores.masked_fill(torch.arange(s, device="cuda")[None, None] >= lengths[:, None, None].long(),
                                float("-inf"))
    want = torch.einsum("bhs,bhsd->bhd", scores.softmax(-1), vv)
    assert (got.double() - want).abs().max() <= 2e-3
    for _ in range(3):
        assert torch.equal(decode_attention(q, k, v, lengths, splits=splits), got)


@pytest.mark.parametrize("n,k", [(6144, 4096), (22016, 4096), (4096, 11008)])
def test_tuned_configs_with_segments_equal_float64_and_repeat_their_bits(n, k):
    """The config :func:`tune` picks on this GPU for the decode model's fused q/k/v, gate/up and
    down weights, with the segments a fused call writes: each within an fp16 ulp of float64."""
    from kernel_lens.kernels.skinny_gemm import candidates, deeper, table_config, tune

    w = (torch.randn(n, k, device="cuda", generator=_g(13)) / math.sqrt(k)).half()
    x = torch.randn(8, k, device="cuda", generator=_g(14)).half()
    cfg = tune(8, w)
    first = candidates(table_config(n, k), k)
    assert cfg in first or any(cfg in deeper(c) for c in first)
    plain = skinny_matmul(x, w.t(), config=replace(cfg, num_stages=3, num_warps=4))
    assert torch.equal(skinny_matmul(x, w.t(), config=cfg), plain)  # pipelining depth: same sums
    segments = (n // 2, n // 4, n - n // 2 - n // 4)
    parts = skinny_matmul(x, w.t(), config=cfg, segments=segments)
    want = x.double() @ w.double().t()
    got = torch.cat(parts, dim=1).double()
    ulp = want.abs().clamp(min=2 ** -14) * 2 ** -10
    assert ((got - want).abs() <= ulp + 1e-4).all()
    assert all(torch.equal(a, b) for a, b in zip(skinny_matmul(x, w.t(), config=cfg, segments=segments), parts))
    print(f"own_kernels tuned n={n} k={k}: {cfg}")


class _Step(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4096, 1024, generator=torch.Generator().manual_seed(9)).half()
                                    / 32, requires_grad=False)

    def forward(self, x, k, v, lengths):
        h = skinny_matmul(x, self.w.t(), config=GemmConfig(block_n=64, block_k=256, split_k=2))
        return decode_attention(h.view(x.shape[0], 32, 128), k, v, lengths, splits=8)


def test_the_own_kernels_through_the_ort_target_equal_their_eager_launches_bit_for_bit():
    model = _Step().cuda()
    x = torch.randn(2, 1024, device="cuda", generator=_g(10)).half()
    k = torch.randn(2, 8, 512, 128, device="cuda", generator=_g(11)).half()
    v = torch.randn(2, 8, 512, 128, device="cuda", generator=_g(12)).half()
    with torch.compiler.set_stance("force_eager"):
        c = kl.compile(model, (x, k, v, torch.tensor([17, 512], dtype=torch.int32, device="cuda")),
                       targets=["ort"])
        for lens in ([17, 512], [1, 300], [512, 512]):
            lengths = torch.tensor(lens, dtype=torch.int32, device="cuda")
            got, want = c.run(x, k, v, lengths), model(x, k, v, lengths)
            torch.cuda.synchronize()
            assert torch.equal(got.view(torch.int16), want.view(torch.int16)), lens
    print("own_kernels ort: bit-exact (max_abs_diff=0.0) over 3 calls")


@pytest.mark.parametrize("mode", [False, "torch"])
def test_optimize_2_decode_step_through_ort_matches_eager_greedy_and_repeats_its_bits(mode):
    """The tiny LLaMA step in fp16 at optimize=2 (own GEMM for batch <= 16, autotuned here):
    greedy tokens equal eager's at batch 3 (own GEMM piece) and 20 (ONNX MatMul piece), logits
    near eager's, the same bits on a second decode."""
    from conftest import EXAMPLES, load_module

    D = load_module(EXAMPLES / "llama_decode.py")
    model = D.LlamaDecodeStep("tiny").half().cuda()
    example = [t.cuda() for t in D.make_inputs(model, 2, device="cpu")]
    c = kl.compile(model, example, dynamic_shapes=D.dynamic_shapes_for(2, model.n_layers),
                   roles=D.roles, targets=["ort"], optimize=2)
    small = c.ir.pieces[0].graph
    # q/k/v and gate/up fused (4 a layer), the lm head, and o/down again with the residual add
    # in the epilogue; configs timed on this GPU
    assert sum(l.kernel.startswith("_skinny_gemm") for l in small.launches) == 6 * model.n_layers + 1
    for batch in (3, 20):
        prompt = torch.randint(0, model.config.vocab_size, (batch, 4),
                               generator=torch.Generator().manual_seed(batch)).cuda()
        theirs, ours, again = [], [], []
        with torch.no_grad():
            want = D.greedy_decode(model, prompt, 12, model.new_caches(batch, device="cuda"),
                                   on_step=lambda s, l: theirs.append(l.clone()))
        got = D.greedy_decode(lambda *a: c.run(*a, cuda_graph=mode), prompt, 12,
                              model.new_caches(batch, device="cuda"), on_step=lambda s, l: ours.append(l.clone()))
        D.greedy_decode(lambda *a: c.run(*a, cuda_graph=mode), prompt, 12,
                        model.new_caches(batch, device="cuda"), on_step=lambda s, l: again.append(l.clone()))
        same = [torch.equal(a.argmax(-1), b.argmax(-1)) for a, b in zip(ours, theirs)]
        upto = same.index(False) + 1 if False in same else len(same)  # logits agree up to there
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours[:upto], theirs[:upto]))
        print(f"own_kernels optimize=2 llama tiny fp16 batch={batch} cuda_graph={mode} "
              f"tokens_match={torch.equal(got, want)} max_abs_diff={diff!r}")
        assert diff < 2e-2
        if not torch.equal(got, want):  # only a near tie in eager's logits may pick another token
            top2 = theirs[upto - 1].float().topk(2, dim=-1).values
            assert (top2[:, 0] - top2[:, 1]).min().item() <= diff, upto
        assert all(torch.equal(a, b) for a, b in zip(ours, again))


class _Residuals(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = torch.nn.Linear(4096, 4096).half(), torch.nn.Linear(4096, 4096, bias=False).half()

    def forward(self, x):
        h = x + self.a(x)
        return torch.add(self.b(h), h)


def test_a_residual_in_the_gemm_epilogue_through_ort_has_the_bits_of_the_gemm_and_torchs_add():
    """optimize=2 on the GPU: both adds become epilogues (the first launches dropped from the
    ONNX graph), and the result equals, bit for bit, the own GEMM launched alone with the same
    timed configs followed by torch's add."""
    import onnx

    from kernel_lens.frontends.own_kernels import OwnKernels

    model, x = _Residuals().cuda(), torch.randn(2, 4096, device="cuda", generator=_g(20)).half()
    with torch.compiler.set_stance("force_eager"):
        c = kl.compile(model, (x,), targets=["ort"], optimize=2)
    ops = [n.op_type for n in onnx.load(str(c.artifacts["ort.onnx"]), load_external_data=False).graph.node]
    assert sum(o.startswith("_skinny_gemm") for o in ops) == 2 and "Add" not in ops
    unfused = OwnKernels(90)
    unfused.excluded = {("residual", 0), ("residual", 1)}
    with unfused.active(model, tracing=False), torch.no_grad():
        model(x)
    unfused.plan()  # the configs tune() gave the compile (kept per process)
    for seed in (21, 22):
        x = torch.randn(2, 4096, device="cuda", generator=_g(seed)).half()
        got = c.run(x)
        with unfused.active(model, tracing=False), torch.no_grad():
            want = model(x)
        torch.cuda.synchronize()
        assert not any(unfused.residual_taken.values())
        assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    print("own_kernels residual epilogue ort: bit-exact with the unfused GEMM + torch add (max_abs_diff=0.0)")
