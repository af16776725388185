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
@pytest.mark.parametrize("batch", [1, 3])
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
