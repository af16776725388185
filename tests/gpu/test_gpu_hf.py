"""GPU host only: the tiny transformers models of tests/hf/ (Triton kernels patched into norms,
MLP activations and RoPE) through ONNX Runtime (CUDA EP + the kernel_lens custom-op library),
compared with the same patched model run eagerly on the GPU (Triton kernels launched natively),
at three sequence lengths (37: not a multiple of 16) and two batch sizes.

Every model here has GEMMs (``nn.Linear`` / GPT-2's ``Conv1D`` -> addmm) and SDPA attention,
which ORT computes with its own MatMul / Softmax kernels where torch uses cuBLAS and its fused
attention: those outputs are compared within the tolerance stated per model below. A model
without such ops would have to be bit-exact (only Triton kernels and elementwise torch ops).
Each case prints ``max_abs_diff`` so the numbers can be recorded.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

import kernel_lens as kl

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "hf"))
import _models as M  # noqa: E402

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# (batch, seq): 8 and 128 are multiples of RoPE's 16-position block, 37 is not (masked tail).
CASES = ((2, 8), (3, 37), (2, 128))

# Ops ORT runs with other algorithms than torch: their presence allows a tolerance.
INEXACT_OPS = ("aten.linear", "aten.matmul", "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm",
               "aten.scaled_dot_product_attention")

# (rtol, atol) per model, fp32 (TF32 off in both: the runner passes torch's allow_tf32 to ORT).
# Outputs are final-norm activations of size ~1; the differences come from accumulation order.
TOLERANCE = {
    "llama": (1e-4, 1e-4),    # fp32 GEMMs (ORT MatMul vs cuBLAS linear) + MatMul/Softmax vs SDPA
    "mistral": (1e-4, 1e-4),  # same, sliding-window mask (window 32 < seq 37, 128)
    "qwen2": (1e-4, 1e-4),    # same, q/k/v biases and GQA
    "gemma": (1e-4, 1e-4),    # same, embeddings scaled by sqrt(hidden) before the first norm
    "phi": (1e-4, 1e-4),      # same, partial rotary + cat, parallel attention/MLP
    "gpt2": (1e-4, 1e-4),     # Conv1D addmm GEMMs + attention
    "opt": (1e-4, 1e-4),      # GEMMs + attention, learned positions from a cumsum
    "bert": (1e-4, 1e-4),     # GEMMs + bidirectional attention
}
# fp16 Llama: one fp16 ulp near 1 is ~1e-3; GEMM/attention accumulation order moves a few ulps.
FP16_TOLERANCE = (1e-2, 1e-2)


def _inputs(batch, seq, seed):
    (ids,) = M.make_inputs(batch=batch, seq=seq, seed=seed, device="cuda")
    return ids


def _compare(label, ours, native, tolerance):
    assert isinstance(ours, torch.Tensor) and ours.dtype == native.dtype and ours.shape == native.shape
    diff = (ours.float() - native.float()).abs().max().item()
    print(f"{label} {tuple(ours.shape)} {ours.dtype} max_abs_diff={diff!r} tolerance={tolerance}")
    assert torch.isfinite(ours).all()
    if tolerance is None:  # bit for bit
        assert torch.equal(ours.contiguous().view(torch.uint8), native.contiguous().view(torch.uint8)), diff
    else:
        rtol, atol = tolerance
        torch.testing.assert_close(ours, native, rtol=rtol, atol=atol)
    return diff


def _run_all(arch, compiled, model, tolerance, tmp_path):
    inexact = any(op.op.startswith(INEXACT_OPS) for op in compiled.ir.ops)
    tol = tolerance if inexact else None
    outputs = []
    with torch.no_grad():
        for i, (batch, seq) in enumerate(CASES):
            ids = _inputs(batch, seq, seed=100 + i)
            native = model(ids.clone())
            ours = compiled.run(ids)
            _compare(f"{arch} batch={batch} seq={seq}", ours, native, tol)
            outputs.append((ours, ours.clone()))
        reopened = kl.load(tmp_path)  # from disk, no recompilation
        ids = _inputs(*CASES[1], seed=101)
        again = reopened.run(ids)
        _compare(f"{arch} reopened batch={ids.shape[0]} seq={ids.shape[1]}", again, model(ids.clone()), tol)
    for ours, kept in outputs:  # later calls did not overwrite earlier results
        assert torch.equal(ours, kept)


@pytest.mark.parametrize("arch", M.ARCHS)
def test_hf_model_through_ort_matches_native_triton(arch, tmp_path):
    model, inputs, dynamic_shapes, expected = M.build(arch)
    model = M.to_device(model, "cuda")
    compiled = kl.compile(model, [t.cuda() for t in inputs], dynamic_shapes=dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path)
    assert M.launch_counts(compiled.ir) == expected.launches
    _run_all(arch, compiled, model, TOLERANCE[arch], tmp_path)


def test_llama_fp16_through_ort_matches_native_triton(tmp_path):
    model, inputs, dynamic_shapes, expected = M.build("llama")
    model = M.to_device(model, "cuda", torch.float16)
    compiled = kl.compile(model, [t.cuda() for t in inputs], dynamic_shapes=dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path)
    assert M.launch_counts(compiled.ir) == expected.launches
    assert compiled.ir.values[compiled.ir.outputs[0]].dtype.value == "fp16"
    _run_all("llama-fp16", compiled, model, FP16_TOLERANCE, tmp_path)
