"""GPU host only: the tiny LLaMA decode step with a static KV cache (examples/llama_decode.py),
compiled for ORT, in a greedy loop: run(), and both CUDA-graph modes, against eager."""

from __future__ import annotations

import copy

import pytest
import torch

import kernel_lens as kl

from conftest import EXAMPLES, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def decode():
    D = load_module(EXAMPLES / "llama_decode.py")
    model = copy.deepcopy(D.model).cuda()
    example = [t.cuda() for t in D.make_inputs(model, 2, device="cpu")]
    compiled = kl.compile(model, example, dynamic_shapes=D.dynamic_shapes_for(2, model.n_layers),
                          roles=D.roles, targets=["ort"])
    return D, model, compiled


@pytest.mark.parametrize("mode", [False, "torch", "ort"])
@pytest.mark.parametrize("batch", [2, 5])  # the dynamic batch runs from 2 (examples/llama_decode.py)
def test_greedy_decode_matches_eager_and_updates_the_caches_in_place(decode, mode, batch):
    D, model, compiled = decode
    prompt = torch.randint(0, model.config.vocab_size, (batch, 4),
                           generator=torch.Generator().manual_seed(batch)).cuda()
    ours, theirs = [], []
    eager_caches, caches = model.new_caches(batch, device="cuda"), model.new_caches(batch, device="cuda")
    with torch.no_grad():
        want = D.greedy_decode(model, prompt, 12, eager_caches, on_step=lambda s, l: theirs.append(l.clone()))
    got = D.greedy_decode(lambda *a: compiled.run(*a, cuda_graph=mode), prompt, 12, caches,
                          on_step=lambda s, l: ours.append(l.clone()))
    assert torch.equal(got, want)
    diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(ours, theirs))
    print(f"llama_decode tiny batch={batch} cuda_graph={mode} tokens_match=True max_abs_diff={diff!r}")
    assert diff < 1e-3
    for a, b in zip(caches, eager_caches):  # the caller's caches hold what eager's hold
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    runner = compiled.runner(cuda_graph=mode)
    assert sorted(runner.in_place) == sorted(n for n in compiled.ir.inputs if n.startswith("caches"))


@pytest.fixture(scope="module")
def decode_unoptimized(decode):
    D, model, _ = decode
    example = [t.cuda() for t in D.make_inputs(model, 2, device="cpu")]
    return kl.compile(model, example, dynamic_shapes=D.dynamic_shapes_for(2, model.n_layers),
                      roles=D.roles, targets=["ort"], optimize=0)


def test_the_captured_decode_graph_holds_no_memory_nodes(decode):
    # issue 26: cuBLAS takes a workspace of its own through cudaMallocAsync unless its handle has
    # one; kl_ort.cpp gives ORT's handle one before the capture, so no alloc/free node is replayed
    from kernel_lens.runtime.cuda_graph import node_kinds

    D, model, compiled = decode
    batch = 2
    caches = model.new_caches(batch, device="cuda")
    ids = torch.zeros(batch, 1, dtype=torch.int64, device="cuda")
    position = torch.tensor([3], device="cuda")
    runner = compiled.runner(cuda_graph="torch")
    for _ in range(2):
        runner.run(ids, position, *caches)
    torch.cuda.synchronize()
    kinds = node_kinds(runner._last.captured.raw_cuda_graph())
    print(f"llama_decode tiny captured graph nodes: {kinds}")
    assert kinds.get("kernel", 0) > 10
    assert "mem_alloc" not in kinds and "mem_free" not in kinds, kinds


@pytest.mark.parametrize("batch", [2, 5])  # the dynamic batch runs from 2 (examples/llama_decode.py)
def test_graph_optimizations_keep_greedy_tokens_and_logits(decode, decode_unoptimized, batch):
    # optimize=1 (fused q/k/v and gate/up GEMMs, attention over the 4 K/V heads) against
    # optimize=0 (the graph as lowered) and eager: same tokens, logits within fp32 GEMM noise
    import onnx

    D, model, optimized = decode
    graphs = [onnx.load(str(c.artifacts["ort.onnx"]), load_external_data=False).graph
              for c in (optimized, decode_unoptimized)]
    # o1's attention reads the K/V caches as they are (o0's reads repeat_kv's Expand)
    def kv_producers(graph):
        made_by = {o: n.op_type for n in graph.node for o in n.output}
        return {made_by.get(name) for n in graph.node if n.op_type == "Attention" for name in n.input[1:3]}

    kv = [kv_producers(g) for g in graphs]
    assert kv[0] and kv[0] <= {"kv_cache_write_kernel"} and "Reshape" in kv[1], kv  # an Attention node
    assert "Split" in {n.op_type for n in graphs[0].node}
    prompt = torch.randint(0, model.config.vocab_size, (batch, 4),
                           generator=torch.Generator().manual_seed(10 + batch)).cuda()
    logits = {}
    tokens = {}
    for name, fn in (("eager", model), ("o0", lambda *a: decode_unoptimized.run(*a, cuda_graph="torch")),
                     ("o1", lambda *a: optimized.run(*a, cuda_graph="torch"))):
        seen = []
        with torch.no_grad():
            tokens[name] = D.greedy_decode(fn, prompt, 12, model.new_caches(batch, device="cuda"),
                                           on_step=lambda s, l: seen.append(l.float().clone()))
        logits[name] = seen
    assert torch.equal(tokens["o1"], tokens["eager"]) and torch.equal(tokens["o0"], tokens["eager"])
    diff = {k: max((a - b).abs().max().item() for a, b in zip(logits[k], logits["eager"]))
            for k in ("o0", "o1")}
    print(f"llama_decode tiny batch={batch} max abs logit diff vs eager: {diff}")
    assert diff["o1"] < 1e-3
