"""kernel_lens's own kernels (issue 41): the skinny GEMM and split-KV decode attention against
torch references, run by Triton's interpreter on the CPU; both compile through the pipeline a
user's kernels take (capture, trace, AOT for sm_90) and the compiled model equals eager; and
``optimize=2``, which puts the skinny GEMM in place of ``F.linear`` with <= 16 rows (the pieces
it makes, what it leaves alone, bit-equality with the own kernels launched eagerly). Their speed
is measured on the GPU host (benchmarks/bench_own_kernels.py, bench_decode.py)."""

import logging
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl

import kernel_lens as kl
from kernel_lens.codegen.launch_io import root_of
from kernel_lens.frontends.own_kernels import OwnKernels
from kernel_lens.kernels import decode_attention, skinny_matmul
from kernel_lens.kernels.decode_attention import split_count
from kernel_lens.kernels.skinny_gemm import MEASURED_SM90, GemmConfig, candidates, table_config
from kernel_lens.kernels.skinny_gemm import linear as own_linear
from kernel_lens.onnx.graph_passes import GraphPassManager, resolve

from conftest import EXAMPLES, eager_on_cpu, load_module


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


@pytest.mark.parametrize("splits,lengths,hq,hkv", [(1, [37, 64], 8, 2), (4, [1, 64], 8, 2), (8, [50, 3], 8, 2),
                                                   (3, [64, 20], 4, 4), (2, [64, 9], 20, 1)])
def test_decode_attention_equals_torch_with_grouped_heads(splits, lengths, hq, hkv):
    """Groups of 4, 1 (one program a head) and 20 (more heads than the 16-row tile)."""
    B, Hq, Hkv, S, D = 2, hq, hkv, 64, 48  # D not a power of two
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
    split = next(l for l in c.ir.launches if l.kernel == "_decode_split")
    assert tuple(split.captured_grid) == (2, 2, 2)  # a program per key head: each key read once for its group
    lens2 = torch.tensor([17, 1], dtype=torch.int32)
    assert torch.equal(c.run(x, k, v, lens2), eager_on_cpu(model, (x, k, v, lens2)))


def test_skinny_matmul_on_the_tensor_cores_pads_rows_to_16_and_equals_torch():
    x, w = torch.randn(3, 96, generator=_g(14)), torch.randn(40, 96, generator=_g(15)).t()
    b, r = torch.randn(40, generator=_g(16)), torch.randn(3, 40, generator=_g(17))
    cfg = GemmConfig(block_n=32, block_k=32, split_k=2, dot=True)
    got = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b, r))
    want = x.double() @ w.double() + b.double() + r.double()
    assert got.shape == (3, 40) and torch.allclose(got.double(), want, rtol=1e-4, atol=1e-3)
    from kernel_lens.frontends.capture.recorder import capture  # the rows the binary is built for:
    launch = capture(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b, r), 90).launches[0]
    assert launch.params["BLOCK_M"] == 16  # tl.dot takes no fewer on a GPU


# ----------------------------------------------------------------------------- optimize=2


@triton.jit
def _double_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=keep) * 2, mask=keep)


class _TwoLinears(torch.nn.Module):
    """Two nn.Linear (one with a bias) around a user's Triton launch; fp16 unless told."""

    def __init__(self, dtype=torch.float16):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(64, 96).to(dtype)
        self.b = torch.nn.Linear(96, 48, bias=False).to(dtype)

    def forward(self, x):
        h = self.a(x)
        out = torch.empty_like(h)
        _double_kernel[(triton.cdiv(h.numel(), 256),)](h, out, h.numel(), BLOCK=256)
        return self.b(out)


def _own(graph):
    return sorted(l for l in (k.name for k in graph.kernels.values()) if l.startswith("_skinny_gemm"))


def _with_residual(graph):
    return [l for l in graph.launches if l.kernel.startswith("_skinny_gemm")
            and any(a.name == "HAS_RES" and a.constant is True for a in l.args)]


def _with_own_kernels(model, inputs):
    """The reference for optimize=2: the forward with kernel_lens's own GEMM where it takes
    F.linear (the same code the capture runs), its launches in Triton's interpreter."""
    own = OwnKernels(90, attention=True)
    with own.active(model, tracing=False):  # the first capture
        eager_on_cpu(model, [t.clone() for t in inputs])
    own.plan()  # siblings fused, as the capture after it runs them
    with own.active(model, tracing=False):
        return eager_on_cpu(model, inputs)


@pytest.fixture(scope="module")
def o2_rows():
    """x [b, 3, 64] with b in 1..12: rows = 3b, so b <= 5 is the own GEMM's piece."""
    model = _TwoLinears()
    b = torch.export.Dim("b", min=1, max=12)
    return model, kl.compile(model, (torch.randn(2, 3, 64).half(),), optimize=2, arch=90,
                             dynamic_shapes=({0: b},))


def test_optimize_2_gives_the_small_rows_piece_the_own_gemm_and_the_rest_onnx_matmul(o2_rows):
    model, c = o2_rows
    assert "own_skinny_gemm" in c.ir.graph_passes
    by_piece = {p.when[0].ranges["b"]: p.graph for p in c.ir.pieces}
    assert sorted(by_piece) == [(1, 1), (2, 5), (6, 12)]  # 3 * 5 = 15 <= 16 < 18
    assert all(len(_own(by_piece[r])) == 2 for r in [(1, 1), (2, 5)])
    assert _own(by_piece[(6, 12)]) == []
    for b in (1, 2, 5):  # bit for bit the own kernels launched eagerly, and near F.linear
        x = torch.randn(b, 3, 64).half()
        got = c.run(x.clone())
        assert torch.equal(got, _with_own_kernels(model, (x,)))
        ref = (2 * (x.double() @ model.a.weight.double().t() + model.a.bias.double())).half().double() \
            @ model.b.weight.double().t()
        assert (got.double() - ref).abs().max() <= 0.02
    for b in (6, 12):
        x = torch.randn(b, 3, 64).half()
        torch.testing.assert_close(c.run(x.clone()), eager_on_cpu(model, (x,)), rtol=1e-3, atol=2e-3)


def test_optimize_2_rows_within_16_over_the_whole_range_need_no_piece():
    model = _TwoLinears()
    b = torch.export.Dim("b", min=2, max=5)  # rows 6..15
    c = kl.compile(model, (torch.randn(3, 3, 64).half(),), optimize=2, arch=90, dynamic_shapes=({0: b},))
    assert not c.ir.pieces and len(_own(c.ir)) == 2
    x = torch.randn(4, 3, 64).half()
    assert torch.equal(c.run(x.clone()), _with_own_kernels(model, (x,)))


def test_optimize_2_leaves_rows_from_two_sizes_over_a_wide_range_to_onnx_matmul():
    """rows = b * s, both dynamic, up to 64: no one-size branch splits that; the capture took the
    calls (4 rows at the example), the trace could not, so the forward is captured again with
    F.linear left alone, and the compiled model is still right."""
    model = _TwoLinears()
    b, s = torch.export.Dim("b", min=2, max=8), torch.export.Dim("s", min=2, max=8)
    c = kl.compile(model, (torch.randn(2, 2, 64).half(),), optimize=2, arch=90,
                   dynamic_shapes=({0: b, 1: s},))
    assert all(_own(g) == [] for g in c.ir.graphs())
    x = torch.randn(3, 7, 64).half()
    torch.testing.assert_close(c.run(x.clone()), eager_on_cpu(model, (x,)), rtol=1e-3, atol=2e-3)


class _BroadcastBias(torch.nn.Module):
    """F.linear by keyword, with a bias of one element (broadcast over N: not the own GEMM's)
    or, ``full``, one per column (the own GEMM's)."""

    def __init__(self, full=False):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(48, 64, generator=_g(30)).half(), requires_grad=False)
        self.b = torch.nn.Parameter(torch.randn(48 if full else 1, generator=_g(31)).half(), requires_grad=False)

    def forward(self, x):
        out = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), BLOCK=256)
        return torch.nn.functional.linear(input=out, weight=self.w, bias=self.b)


@pytest.mark.parametrize("how", ["float32", "function", "optimize_1", "broadcast_bias"])
def test_optimize_2_changes_nothing_it_does_not_take(how):
    model = _BroadcastBias() if how == "broadcast_bias" else \
        _TwoLinears(torch.float32 if how == "float32" else torch.float16)
    x = torch.randn(2, 3, 64, dtype=torch.float32 if how == "float32" else torch.float16)
    forward = (lambda t: model(t)) if how == "function" else model
    c = kl.compile(forward, (x,), optimize=1 if how == "optimize_1" else 2, arch=90)
    assert _own(c.ir) == [] and [l.kernel for l in c.ir.launches] == ["_double_kernel"]
    if how == "broadcast_bias":
        torch.testing.assert_close(c.run(x.clone()), eager_on_cpu(model, (x,)), rtol=1e-3, atol=2e-3)


def test_optimize_2_takes_f_linear_called_by_keyword():
    model, x = _BroadcastBias(full=True), torch.randn(2, 3, 64).half()
    c = kl.compile(model, (x,), optimize=2, arch=90)
    assert len(_own(c.ir)) == 1
    assert torch.equal(c.run(x.clone()), _with_own_kernels(model, (x,)))


def test_optimize_2_on_the_decode_step_splits_the_batch_at_16():
    """examples/llama_decode.py's step in fp16 with its dynamic batch 2..256: every Linear (q, k,
    v, o, gate, up, down, lm head) runs the own GEMM for batch <= 16 (q/k/v as one, gate/up as
    one), ONNX MatMul above; the attention over repeat_kv'd caches is the own decode attention
    reading the caches themselves, in both pieces (no Expand left). (torch made the guard on the hidden state's batch before it learned that the caches' batch is the
    same size: the size branch is found in the declared symbol all the same.)"""
    D = load_module(EXAMPLES / "llama_decode.py")
    model = D.LlamaDecodeStep("tiny").half()
    example = D.make_inputs(model, 2)
    c = kl.compile(model, example, optimize=2, arch=90, dynamic_shapes=D.dynamic_shapes_for(2, model.n_layers),
                   roles=D.roles)
    small, large = (p.graph for p in c.ir.pieces)
    assert [p.when[0].ranges["batch"] for p in c.ir.pieces] == [(2, 16), (17, 256)]
    # q/k/v and gate/up fused: 4 GEMMs a layer, and the lm head; o and down again with the
    # residual in their epilogue (the first launches are dropped by the lowering)
    assert sum(l.kernel.startswith("_skinny_gemm") for l in small.launches) == 6 * model.n_layers + 1
    assert len(_with_residual(small)) == 2 * model.n_layers
    assert _own(large) == []
    for piece in (small, large):
        assert sum(l.kernel.startswith("_decode_split") for l in piece.launches) == model.n_layers
        split = next(l for l in piece.launches if l.kernel.startswith("_decode_split"))
        k_arg = next(a.value for a in split.args if a.name == "k_ptr")
        assert root_of(piece, k_arg) == "caches_0"  # the cache where it lies, not an expanded copy
    inputs = D.make_inputs(model, 3)
    got = c.run(*[t.clone() for t in inputs])  # its other ops by ONNX's reference evaluator:
    torch.testing.assert_close(got, _with_own_kernels(model, inputs), rtol=1e-2, atol=2e-3)  # fp16
    plain = eager_on_cpu(model, inputs)  # F.linear and SDPA themselves
    torch.testing.assert_close(got, plain, rtol=2e-2, atol=2e-2)
    for batch in (2, 16, 17):  # the ends of the pieces (256 is past the CPU budget), against F.linear and SDPA
        inputs = D.make_inputs(model, batch)
        torch.testing.assert_close(c.run(*[t.clone() for t in inputs]), eager_on_cpu(model, inputs),
                                   rtol=2e-2, atol=2e-2, msg=lambda m: f"batch {batch}: {m}")


def test_optimize_2_is_a_level_and_a_name_that_no_onnx_graph_pass_runs():
    assert resolve(2) == ["fuse_sibling_matmuls", "gqa_without_expand", "own_skinny_gemm", "own_decode_attention"]
    assert "own_skinny_gemm" not in resolve(1) and resolve(["own_skinny_gemm"]) == ["own_skinny_gemm"]
    assert GraphPassManager(["own_skinny_gemm"]).order() == []
    with pytest.raises(kl.errors.InputError, match="own_skinny_gemm"):
        resolve(["own_skinny_gem"])


def test_the_config_table_and_its_rule():
    assert table_config(4096, 11008) == MEASURED_SM90[(4096, 11008)]
    assert table_config(64, 1024) == GemmConfig(block_n=32, block_k=256, split_k=4, dot=True)
    assert table_config(9000, 4096).split_k == 1  # 282 programs of 32 columns: no split
    assert table_config(8000, 4096).split_k == 4  # 250
    assert table_config(64, 48) == GemmConfig(block_n=32, block_k=64, split_k=1, dot=True)
    first = table_config(1024, 4096)
    tried = candidates(first, 4096)
    assert tried[0] == first and len(set(tried)) == len(tried) > 1
    assert {c.split_k for c in tried} == {1, 2, 4} and all(c.dot for c in tried)
    assert {c.block_n for c in tried} == {32, 64, 128} and {c.block_k for c in tried} >= {128, 256}
    # a split only where each part keeps a whole block of K
    assert {(c.split_k, c.block_k) for c in candidates(table_config(64, 384), 384)} <= {(1, 128), (1, 256), (2, 128)}
    assert GemmConfig(32, 128, 2, dot=True) in candidates(table_config(64, 384), 384)


def test_gemm_configs_fit_the_shared_memory_of_every_arch_built():
    """The sm_90 table's 128 x 256 tiles (147 KB) would not launch on sm_86/sm_89 (99 KB)."""
    from kernel_lens.kernels.skinny_gemm import SHARED_BYTES, shared_bytes, shared_room
    big = MEASURED_SM90[(4096, 4096)]
    assert shared_bytes(big) == 147456  # what Triton allocated for it on sm_80 (the compiled cubin)
    assert shared_room([90]) == SHARED_BYTES[90] and shared_room([86, 90]) == 99 * 1024
    assert shared_room([120]) == 99 * 1024  # an arch not in the table: the smallest
    assert table_config(4096, 4096) == big and table_config(4096, 4096, shared_room([80])) == big
    small = table_config(4096, 4096, shared_room([89]))
    assert small != big and shared_bytes(small) <= 99 * 1024
    w = torch.nn.Parameter(torch.empty(4096, 4096, dtype=torch.float16), requires_grad=False)
    assert OwnKernels(90)._config(w, None) == big
    assert OwnKernels(90, archs=[86, 90])._config(w, None) == small
    cfg = GemmConfig(block_n=64, block_k=256, dot=True)  # the estimate is what the compiler allocates
    x, w = torch.randn(1, 1024).half(), torch.randn(1024, 512).half()
    c = kl.compile(lambda x, w: skinny_matmul(x, w, config=cfg), (x, w), arch=86)
    assert max(b.shared_mem for kern in c.ir.kernels.values() for b in kern.binaries) == shared_bytes(cfg)


@pytest.mark.parametrize("shape,n,k,bias", [((3, 1024), 64, 1024, True), ((2, 5, 96), 40, 96, False),
                                            ((1, 1, 32), 33, 32, True)])
def test_own_linear_equals_f_linear_in_float64(shape, n, k, bias):
    x = torch.randn(*shape, generator=_g(20)).half()
    w = (torch.randn(n, k, generator=_g(21)) / math.sqrt(k)).half()
    b = torch.randn(n, generator=_g(22)).half() if bias else None
    got = eager_on_cpu(lambda *a: own_linear(*a), (x, w, b))
    want = x.double() @ w.double().t() + (b.double() if bias else 0)
    assert got.shape == (*shape[:-1], n) and got.dtype == torch.float16
    assert (got.double() - want).abs().max() <= want.abs().max() * 2 ** -10 + 1e-3


# ----------------------------------------------------------------------------- siblings, segments


@pytest.mark.parametrize("split", [1, 2])
def test_skinny_matmul_writes_each_segment_as_its_own_contiguous_tensor(split):
    """q/k/v in one GEMM: each segment is a contiguous [M, width] tensor (one buffer, the
    segments one after another), bit-equal to the same columns of the unsegmented result."""
    x = torch.randn(3, 256, generator=_g(40)).half()
    w = (torch.randn(256, 37, generator=_g(41)) / 16).half()
    b = torch.randn(37, generator=_g(42)).half()
    cfg = GemmConfig(block_n=16, block_k=64, split_k=split, dot=True)
    parts = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg, segments=(10, 20, 7)), (x, w, b))
    whole = eager_on_cpu(lambda *a: skinny_matmul(*a, config=cfg), (x, w, b))
    assert [tuple(p.shape) for p in parts] == [(3, 10), (3, 20), (3, 7)]
    assert all(p.is_contiguous() for p in parts)
    assert [p.storage_offset() for p in parts] == [0, 30, 90]
    for p, cols in zip(parts, ((0, 10), (10, 30), (30, 37))):
        assert torch.equal(p, whole[:, cols[0]:cols[1]])


def test_skinny_matmul_refuses_segments_that_do_not_add_up():
    x, w = torch.randn(2, 8), torch.randn(8, 12)
    for bad in [(5, 5), (4, 4, 2, 2), (12, 0)]:
        with pytest.raises(ValueError, match="segments"):
            skinny_matmul(x, w, segments=bad)


class _Siblings(torch.nn.Module):
    """q/k/v (with biases) and gate/up (without) on one input; two calls on an input written in
    place between them; a weight computed in the forward, twice."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        lin = lambda n, bias=True: torch.nn.Linear(64, n, bias=bias).half()  # noqa: E731
        self.q, self.k, self.v, self.g, self.u = lin(32), lin(16), lin(16), lin(40, False), lin(40, False)
        self.a, self.b = lin(24, False), lin(24, False)
        self.w = torch.nn.Parameter(torch.randn(8, 64).half(), requires_grad=False)

    def forward(self, x):
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        q, k, v = self.q(h), self.k(h), self.v(h)
        g, u = self.g(h), self.u(h)
        e = h.clone()
        a = self.a(e)
        e.mul_(2)  # b must see the written e: not a's sibling
        b = self.b(e)
        w = self.w * 2  # not the model's weight: no sibling of anything
        c, d = F.linear(h, w), F.linear(h, w)
        return q, k, v, g * u, a, b, c + d


def test_optimize_2_runs_sibling_calls_on_one_input_as_one_gemm():
    model, x = _Siblings(), torch.randn(2, 3, 64).half()
    c = kl.compile(model, (x,), optimize=2, arch=90)
    gemms = [l for l in c.ir.launches if l.kernel.startswith("_skinny_gemm")]
    assert len(gemms) == 7  # q/k/v, g/u, a, b, each F.linear(h, w), and c's again with d as residual
    assert len(_with_residual(c.ir)) == 1
    weights = {c.ir.values[a.value].shape[1] for l in gemms for a in l.args if a.name == "w_ptr"}
    assert {64, 80} <= {int(n) for n in weights}  # the concatenated [64, 32+16+16] and [64, 40+40]
    got = c.run(x.clone())
    assert all(torch.equal(a, b) for a, b in zip(got, _with_own_kernels(model, (x,))))
    plain = eager_on_cpu(model, (x,))  # F.linear itself: the segments hold the right columns
    for a, b in zip(got, plain):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


class _SiblingOnlyEager(torch.nn.Module):
    """k's input is q's in the eager run, a copy of it under torch.export: the group the capture
    planned is found broken in the trace, and the calls run unfused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.q, self.k = torch.nn.Linear(64, 32).half(), torch.nn.Linear(64, 16).half()

    def forward(self, x):
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        return self.q(h), self.k(h.clone() if torch.compiler.is_exporting() else h)


def test_optimize_2_a_group_the_trace_does_not_see_runs_unfused(caplog):
    model, x = _SiblingOnlyEager(), torch.randn(2, 3, 64).half()
    with caplog.at_level(logging.INFO, logger="kernel_lens.frontends.lift"):
        c = kl.compile(model, (x,), optimize=2, arch=90)
    assert "the sibling calls grouped at [0] run unfused; capturing again" in caplog.text
    gemms = [l for l in c.ir.launches if l.kernel.startswith("_skinny_gemm")]
    assert len(gemms) == 2
    for a, b in zip(c.run(x.clone()), eager_on_cpu(model, (x,))):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


def test_plan_asks_for_another_capture_only_for_groups_and_only_once():
    model, x = _Siblings(), torch.randn(2, 3, 64).half()
    own = OwnKernels(90, attention=True)
    with own.active(model, tracing=False):
        eager_on_cpu(model, (x,))
    assert own.plan() is True and sorted(g.sites for g in own.groups.values()) == [(0, 1, 2), (3, 4)]
    assert own.plan() is False
    alone = OwnKernels(90, attention=True)
    model2 = _TwoLinears()
    with alone.active(model2, tracing=False):
        eager_on_cpu(model2, (x,))
    assert alone.plan() is False and alone.groups == {}  # on a CPU host the table's configs
    assert not hasattr(model, "_kl_own_linear_0")  # the buffer is the model's only while active



# ----------------------------------------------------------------------------- decode attention


def test_decode_attention_with_a_mask_equals_sdpa_and_gives_0_where_no_key_is_attended():
    q = torch.randn(3, 8, 16, generator=_g(50)).half()
    k = torch.randn(3, 2, 40, 16, generator=_g(51)).half()
    v = torch.randn(3, 2, 40, 16, generator=_g(52)).half()
    mask = torch.rand(3, 40, generator=_g(53)) > 0.5
    mask[1] = False  # no key: torch's SDPA gives 0
    got = eager_on_cpu(lambda *a: decode_attention(*a, splits=3, block_s=8, mask=mask), (q, k, v))
    want = F.scaled_dot_product_attention(q.float()[:, :, None], k.float().repeat_interleave(4, 1),
                                          v.float().repeat_interleave(4, 1), attn_mask=mask[:, None, None])
    torch.testing.assert_close(got.float(), want[:, :, 0], rtol=2e-3, atol=2e-3)
    assert (got[1] == 0).all()
    one = eager_on_cpu(lambda *a: decode_attention(*a, splits=2, block_s=8, mask=mask[:1]), (q, k, v))
    want = F.scaled_dot_product_attention(q.float()[:, :, None], k.float().repeat_interleave(4, 1),
                                          v.float().repeat_interleave(4, 1), attn_mask=mask[:1, None, None])
    torch.testing.assert_close(one.float(), want[:, :, 0], rtol=2e-3, atol=2e-3)  # one row for all
    with pytest.raises(ValueError, match="mask"):
        decode_attention(q, k, v, mask=mask.float())


def _repeat_kv(t, groups):
    b, h, s, d = t.shape
    return t[:, :, None, :, :].expand(b, h, groups, s, d).reshape(b, h * groups, s, d)


class _Attend(torch.nn.Module):
    """A Triton launch, then SDPA of q [B, 8, L, 16] over repeat_kv'd k/v [B, 2, 24, 16]."""

    def __init__(self, how):
        super().__init__()
        self.how = how

    def forward(self, q, k, v, mask):
        q2 = torch.empty_like(q)
        _double_kernel[(triton.cdiv(q.numel(), 256),)](q, q2, q.numel(), BLOCK=256)
        kw = dict(attn_mask=mask)
        if self.how == "causal":
            kw = dict(is_causal=True)
        elif self.how == "float_mask":
            kw = dict(attn_mask=torch.where(mask, 0.0, float("-inf")).to(q.dtype))
        elif self.how == "scale":
            kw["scale"] = 0.3
        keys, values = _repeat_kv(k, 4), _repeat_kv(v, 4)
        if self.how == "written":  # the copies hold the caches before this write
            k.mul_(2)
        return F.scaled_dot_product_attention(q2, keys, values, **kw)


@pytest.mark.parametrize("how,rows,taken", [("mask", 1, True), ("scale", 1, True), ("batch_mask", 1, True),
                                            ("written", 1, True),
                                            ("causal", 1, False), ("float_mask", 1, False),
                                            ("mask", 2, False), ("head_mask", 1, False)])
def test_optimize_2_takes_one_position_attention_and_leaves_the_rest_to_onnx(how, rows, taken, caplog):
    caplog.set_level(logging.INFO, logger="kernel_lens")
    g = _g(60)
    q = torch.randn(2, 8, rows, 16, generator=g).half()
    k, v = torch.randn(2, 2, 24, 16, generator=g).half(), torch.randn(2, 2, 24, 16, generator=g).half()
    shape = {"batch_mask": (2, 1, 1, 24), "head_mask": (1, 8, 1, 24)}.get(how, (1, 1, 1, 24))
    mask = torch.rand(*shape, generator=g) > 0.3
    model = _Attend(how)
    c = kl.compile(model, (q, k, v, mask), optimize=2, arch=90)
    assert any(l.kernel.startswith("_decode_split") for l in c.ir.launches) == taken
    if taken:  # the caches where they lie, unless written after repeat_kv copied them
        split = next(l for l in c.ir.launches if l.kernel.startswith("_decode_split"))
        k_root = root_of(c.ir, next(a.value for a in split.args if a.name == "k_ptr"))
        assert (k_root == "k") == (how != "written"), k_root
        heads = 8 if how == "written" else 2  # the copies have a key head per query head
        assert tuple(split.captured_grid) == (2, heads, split_count(2, heads, 24))  # a program a key head
    else:  # the capture left it to SDPA itself: no capture taken back after the trace
        assert "capturing again" not in caplog.text
    got = c.run(q.clone(), k.clone(), v.clone(), mask.clone())
    torch.testing.assert_close(got, eager_on_cpu(model, (q, k, v, mask)), rtol=2e-3, atol=2e-3)


class _SiblingsOnlyOnce(torch.nn.Module):
    """k's input is q's in the first call only (later one row of it, 1-D: F.linear's): the second
    capture (with the group planned from the first) finds the group broken, takes each call's
    own result, and the forward is captured again unfused."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.q, self.k = torch.nn.Linear(64, 32).half(), torch.nn.Linear(64, 16).half()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        return self.q(h), self.k(h if self.calls == 1 else h[0, 0])


def test_optimize_2_a_group_a_later_capture_does_not_see_runs_unfused(caplog):
    model, x = _SiblingsOnlyOnce(), torch.randn(2, 3, 64).half()
    with caplog.at_level(logging.INFO, logger="kernel_lens.frontends.lift"):
        c = kl.compile(model, (x,), optimize=2, arch=90)
    assert "the sibling calls grouped at [0] run unfused; capturing again" in caplog.text
    assert sum(l.kernel.startswith("_skinny_gemm") for l in c.ir.launches) == 1  # k's 1-D: MatMul
    for a, b in zip(c.run(x.clone()), eager_on_cpu(model, (x,))):
        torch.testing.assert_close(a, b, rtol=2e-3, atol=2e-3)


def test_a_broken_group_gives_back_its_buffers():
    model, x = _Siblings(), torch.randn(2, 3, 64).half()
    own = OwnKernels(90)
    with own.active(model, tracing=False):
        eager_on_cpu(model, (x,))
    own.plan()
    qkv = next(g for g in own.groups.values() if g.sites == (0, 1, 2))
    assert {qkv.buffer, qkv.buffer + "_bias"} <= set(own._fused)
    own.mismatched = {1}
    assert own.retry() == "the sibling calls grouped at [0] run unfused"
    assert 0 not in own.groups and not any(n.startswith(qkv.buffer) for n in own._fused)
    assert len(own.groups) == 1 and own.excluded == set()  # gate/up stays fused; nothing left to torch
    own.mismatched = {7}  # not in a group: left to F.linear
    assert own.retry().startswith("F.linear calls [7] keep ONNX MatMul") and own.excluded == {7}
    own.mismatched = {("attention", 1)}
    assert own.retry() == "SDPA calls [1] keep ONNX Attention (the trace could not take them as the capture did)"
    assert own.excluded == {7, ("attention", 1)}


class _LeaderOtherLater(torch.nn.Module):
    """The group's first call has another weight after the first call: the second capture finds
    the group broken there."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.q, self.q2, self.k = (torch.nn.Linear(64, 32).half(), torch.nn.Linear(64, 32).half(),
                                   torch.nn.Linear(64, 16).half())
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        first = self.q if self.calls == 1 else self.q2
        return first(h), self.k(h)


def test_optimize_2_a_group_whose_first_weight_differs_later_runs_unfused(caplog):
    model, x = _LeaderOtherLater(), torch.randn(2, 3, 64).half()
    with caplog.at_level(logging.INFO, logger="kernel_lens.frontends.lift"):
        c = kl.compile(model, (x,), optimize=2, arch=90)
    assert "the sibling calls grouped at [0] run unfused; capturing again" in caplog.text
    assert sum(l.kernel.startswith("_skinny_gemm") for l in c.ir.launches) == 2


def test_decode_attention_fits_the_shared_memory_of_every_tensor_core_gpu_at_head_size_256():
    """sm_86/sm_89 give a block 99 KB: 64 keys a step at head size 256 took 141 KB."""
    q, k, v = torch.randn(1, 8, 256).half(), torch.randn(1, 2, 40, 256).half(), torch.randn(1, 2, 40, 256).half()
    c = kl.compile(lambda q, k, v: decode_attention(q, k, v, splits=2), (q, k, v), arch=80)
    shared = [b.shared_mem for kern in c.ir.kernels.values() if kern.name == "_decode_split"
              for b in kern.binaries]
    assert shared and max(shared) <= 99 * 1024
    assert torch.equal(c.run(q, k, v), eager_on_cpu(lambda *a: decode_attention(*a, splits=2), (q, k, v)))
    from kernel_lens.frontends.own_kernels import _attention_fits  # -O2 leaves bigger heads to SDPA
    assert _attention_fits(q[:, :, None], k, v, 0.0, False, None)
    big = torch.randn(1, 2, 40, 1024).half()
    assert not _attention_fits(torch.randn(1, 8, 1, 1024).half(), big, big, 0.0, False, None)


@pytest.mark.parametrize("batch,kv_heads,keys,want", [(1, 8, 256, 4), (1, 8, 4096, 16), (8, 8, 256, 4),
                                                     (8, 8, 4096, 5), (32, 8, 4096, 2), (64, 8, 4096, 1),
                                                     (1, 1, 40, 1), (1, 1, 65, 2)])
def test_split_count_fills_the_gpu_without_slices_shorter_than_a_block(batch, kv_heads, keys, want):
    assert split_count(batch, kv_heads, keys) == want


def test_decode_attention_refuses_what_it_is_not_for_naming_the_shapes():
    q, k = torch.randn(2, 8, 16).half(), torch.randn(2, 2, 24, 16).half()
    with pytest.raises(ValueError, match=r"got \(2, 8, 16\), \(2, 2, 24, 16\), \(2, 2, 20, 16\), None"):
        decode_attention(q, k, torch.randn(2, 2, 20, 16).half())
    with pytest.raises(ValueError, match=r"got \(2, 8, 16\), \(2, 2, 24, 16\), \(2, 2, 24, 16\), \(3,\)"):
        decode_attention(q, k, k, torch.ones(3, dtype=torch.int32))  # a length per sequence: 2
    with pytest.raises(ValueError, match="decode_attention needs the last dim of q, k and v contiguous"):
        decode_attention(q, k.transpose(2, 3).contiguous().transpose(2, 3), k)
    for bad in (torch.ones(2, 23, dtype=torch.bool), torch.ones(2, 24, 2, dtype=torch.bool)[..., 0],
                torch.ones(24, dtype=torch.bool)):
        with pytest.raises(ValueError, match="mask is bool"):  # wrong length, strided, 1-D
            decode_attention(q, k, k, mask=bad)


# ----------------------------------------------------------------------------- residual epilogue


class _Residual(torch.nn.Module):
    """A pre-norm block's two residual adds (``h + a(h)``, ``b(h) + h``), an add whose other side
    is broadcast (not the epilogue's), and a GEMM result read twice (both launches stay)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.a = torch.nn.Linear(64, 64).half()
        self.b = torch.nn.Linear(64, 64, bias=False).half()
        self.c = torch.nn.Linear(64, 64, bias=False).half()
        self.d = torch.nn.Linear(64, 64, bias=False).half()

    def forward(self, x):
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        h = h + self.a(h)
        h = torch.add(self.b(h), h)
        row = self.c(h)
        wide = row + h[:, :1]  # broadcast: ONNX Add
        twice = self.d(row)
        return wide + twice, twice * 2


def test_optimize_2_adds_a_residual_in_the_gemm_epilogue_with_the_bits_of_the_add():
    from kernel_lens.onnx.lower import lower_to_onnx
    model, x = _Residual(), torch.randn(2, 3, 64).half()
    c = kl.compile(model, (x,), optimize=2, arch=90)
    gemms = [l for l in c.ir.launches if l.kernel.startswith("_skinny_gemm")]
    assert len(gemms) == 4 + 3 and len(_with_residual(c.ir)) == 3  # a, b and d's add into wide + twice
    graph = lower_to_onnx(c.ir).graph
    kept = [n for n in graph.node if n.op_type.startswith("_skinny_gemm")]
    assert len(kept) == 5  # a's and b's first launch dropped; d's result is also read by twice * 2
    assert [n.op_type for n in graph.node].count("Add") == 1  # the broadcast one
    got = c.run(x.clone())
    ref = _with_own_kernels(model, (x,))
    assert all(torch.equal(g, r) for g, r in zip(got, ref))
    unfused = OwnKernels(90)  # the GEMM's result rounded, then torch's add: the same bits
    unfused.excluded = {("residual", s) for s in range(4)}
    with unfused.active(model, tracing=False):
        plain = eager_on_cpu(model, (x,))
    assert not any(unfused.residual_taken.values())
    assert all(torch.equal(g, p) for g, p in zip(got, plain))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_skinny_matmul_residual_is_the_rounded_result_plus_the_residual(dtype):
    """Inputs whose sums land between the dtype's numbers: adding before rounding differs."""
    x, w = (torch.randn(3, 128, generator=_g(40)) * 3).to(dtype), torch.randn(128, 96, generator=_g(41)).to(dtype)
    r = (torch.randn(3, 96, generator=_g(42)) * 50).to(dtype)
    for cfg in (GemmConfig(block_n=32, block_k=64, split_k=1, dot=True), GemmConfig(block_n=32, block_k=32, split_k=2)):
        y, fused = eager_on_cpu(lambda a, b, c: (skinny_matmul(a, b, config=cfg), skinny_matmul(a, b, None, c, config=cfg)),
                                (x, w, r))
        assert torch.equal(fused, y + r)
        once = (x.float() @ w.float() + r.float()).to(dtype)  # one rounding: what the epilogue must not do
        assert not torch.equal(once, fused)


def test_skinny_matmul_refuses_a_residual_with_strided_rows():
    with pytest.raises(ValueError, match="residual"):
        skinny_matmul(torch.randn(2, 8), torch.randn(8, 4), None, torch.randn(4, 2).t())


def test_the_second_round_of_tuning_varies_the_pipelining_depth_and_warps():
    from kernel_lens.kernels.skinny_gemm import deeper, shared_bytes
    best = GemmConfig(block_n=64, block_k=256, split_k=1, dot=True)
    assert [(c.num_stages, c.num_warps) for c in deeper(best)] == [(2, 4), (4, 4), (5, 4), (3, 8)]
    assert all(replace(c, num_stages=3, num_warps=4) == best for c in deeper(best))
    assert [(c.num_stages, c.num_warps) for c in deeper(replace(best, num_warps=8, num_stages=4))] == \
        [(2, 8), (3, 8), (5, 8)]
    # one tile of x and w in flight per stage after the first
    assert shared_bytes(best) == 2 * (16 * 256 + 256 * 64) * 2
    assert shared_bytes(replace(best, num_stages=5)) == 4 * (16 * 256 + 256 * 64) * 2
    assert shared_bytes(replace(best, num_stages=1)) == shared_bytes(replace(best, num_stages=2))


def test_the_pipelining_depth_reaches_the_launch():
    from kernel_lens.frontends.capture.recorder import capture
    x, w = torch.randn(2, 64).half(), torch.randn(64, 32).half()
    cfg = GemmConfig(block_n=32, block_k=32, num_stages=5, num_warps=8, dot=True)
    launch = capture(lambda a, b: skinny_matmul(a, b, config=cfg), (x, w), 90).launches[0]
    assert (launch.options["num_stages"], launch.options["num_warps"]) == (5, 8)


@triton.jit
def _double_in_place(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=keep) * 2, mask=keep)


class _WrittenBetween(torch.nn.Module):
    """The user's kernel writes h in place (torch's version counter does not see it) between
    a(h) and the add of its result, and between q(h) and k(h): neither the residual epilogue
    (it would read the new h) nor q/k as one GEMM is right."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(8)
        self.a = torch.nn.Linear(64, 64).half()
        self.q, self.k = torch.nn.Linear(64, 32).half(), torch.nn.Linear(64, 32).half()

    def forward(self, x):
        h = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 256),)](x, h, x.numel(), BLOCK=256)
        y = self.a(h)
        _double_in_place[(triton.cdiv(h.numel(), 256),)](h, h.numel(), BLOCK=256)
        z = y + x
        q = self.q(h)
        _double_in_place[(triton.cdiv(h.numel(), 256),)](h, h.numel(), BLOCK=256)
        return z, q, self.k(h)


def test_optimize_2_reuses_nothing_across_a_launch_of_the_users_kernel(caplog):
    """The capture itself declines (it counts the user's launches), so no second capture."""
    model, x = _WrittenBetween(), torch.randn(2, 3, 64).half()
    with caplog.at_level(logging.INFO, logger="kernel_lens"):
        c = kl.compile(model, (x,), optimize=2, arch=90)
    assert "capturing again" not in caplog.text and "GEMMs on concatenated weights" not in caplog.text
    assert _with_residual(c.ir) == []
    for got, want in zip(c.run(x.clone()), eager_on_cpu(model, (x,))):
        torch.testing.assert_close(got, want, rtol=2e-3, atol=2e-3)
    own = OwnKernels(90)
    launched = type("L", (), {"jit": _double_kernel})()
    own.launched(launched)
    own_launch = type("L", (), {"jit": __import__("kernel_lens.kernels.skinny_gemm", fromlist=["x"])._skinny_gemm})()
    own.launched(own_launch)
    assert own.writes == 1  # the own kernels write only what they allocate


def test_optimize_2_for_several_archs_takes_configs_that_fit_the_smallest():
    """Built for sm_80 and sm_86, a 4096 x 4096 weight gets a config within sm_86's 99 KB of
    shared memory (the sm_90 table's 128 x 256 tiles take 147 KB)."""
    from kernel_lens.kernels.skinny_gemm import shared_bytes
    model = torch.nn.Linear(4096, 4096, bias=False).half()
    x = torch.randn(1, 4096, generator=_g(50)).half()
    c = kl.compile(model, (x,), optimize=2, arch=[80, 86])  # the first arch alone would allow 163 KB
    (gemm,) = [l for l in c.ir.launches if l.kernel.startswith("_skinny_gemm")]
    const = {a.name: a.constant for a in gemm.args}
    cfg = GemmConfig(block_n=const["BLOCK_N"], block_k=const["BLOCK_K"], split_k=const["SPLIT_K"], dot=True)
    assert shared_bytes(cfg) <= 99 * 1024 and cfg != MEASURED_SM90[(4096, 4096)]
    torch.testing.assert_close(c.run(x.clone()), eager_on_cpu(model, (x,)), rtol=2e-2, atol=2e-2)  # fp16 sums


def test_a_sibling_call_that_does_not_find_its_group_and_does_not_fit_goes_to_f_linear():
    from kernel_lens.frontends.own_kernels import _Group
    own = OwnKernels(90)
    first = torch.randn(2, 8).half()
    own._pending[1] = (first, first._version, "share", _Group((0, 1), (4, 4), ("a", "b"), (None, None), "buf"), 0)
    calls = []
    wide, w = torch.randn(20, 8).half(), torch.randn(4, 8).half()  # 20 rows: past the own GEMM's 16
    got = own._sibling(1, wide, w, None, lambda x, weight, bias: calls.append((x, weight, bias)) or "F.linear")
    assert got == "F.linear" and calls == [(wide, w, None)] and own.mismatched == {1}


def test_skinny_matmul_on_the_cuda_cores_takes_the_rows_rounded_up_to_a_power_of_two():
    from kernel_lens.frontends.capture.recorder import capture
    x, w = torch.randn(3, 64), torch.randn(64, 32)
    launch = capture(lambda a, b: skinny_matmul(a, b, config=GemmConfig(block_n=32, block_k=32)), (x, w), 90).launches[0]
    assert launch.params["BLOCK_M"] == 4  # fp32 stays off the tensor cores (tl.dot would take TF32 on a GPU)
