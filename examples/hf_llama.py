"""A Hugging Face ``transformers`` Llama whose RMSNorm, SwiGLU and RoPE are Triton kernels.

The model is ``LlamaModel`` built from a config (random weights from a seeded init; nothing is
downloaded). Its norm modules and MLPs are replaced by the Triton drop-ins of
``_hf_kernels.py`` (sharing the original parameters), and ``apply_rotary_pos_emb`` of the Llama
modeling module is swapped for the Triton one while ``forward`` runs. Everything else (embedding,
masks, RoPE tables, projections, attention) stays torch, and kernel_lens lowers it to ONNX
through onnxscript's torchlib. ``forward(input_ids)`` returns the last hidden state.

    kernel_lens compile examples/hf_llama.py --target ort -o kl_hf_llama

``KL_HF_LLAMA_SIZE`` picks the config: ``tiny`` (default: hidden 256, 2 layers; quick on a
CPU-only host) or ``bench`` (hidden 1024, 4 layers, GQA 16/4 heads, FFN 2816, vocab 8192; the
size ``benchmarks/bench_hf_llama.py`` measures on the GPU). Needs ``transformers`` (pip install
'kernel_lens[test]').
"""

from __future__ import annotations

import os

import torch
import transformers
from torch.export import Dim
from transformers.models.llama import modeling_llama

import _hf_kernels as K

SIZES = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4, vocab_size=1024),
    "bench": dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
                  num_attention_heads=16, num_key_value_heads=4, vocab_size=8192),
}


class HFLlama(torch.nn.Module):
    """``LlamaModel`` with Triton RMSNorm, SwiGLU and RoPE; ``triton=False`` keeps it stock."""

    def __init__(self, size: str = "tiny", triton: bool = True, seed: int = 0):
        super().__init__()
        config = transformers.LlamaConfig(**SIZES[size], max_position_embeddings=8192,
                                          attn_implementation="sdpa")
        torch.manual_seed(seed)
        self.model = transformers.LlamaModel(config).eval()
        self.triton = triton
        if triton:
            K.use_triton_llama(self.model)

    def forward(self, input_ids):
        with K.triton_rope(modeling_llama.__name__ if self.triton else None):
            return self.model(input_ids=input_ids, use_cache=False).last_hidden_state


def make_inputs(batch: int = 1, seq: int = 16, device: str = "cpu", seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    vocab = SIZES[os.environ.get("KL_HF_LLAMA_SIZE", "tiny")]["vocab_size"]
    return (torch.randint(0, vocab, (batch, seq), generator=g).to(device),)


model = HFLlama(os.environ.get("KL_HF_LLAMA_SIZE", "tiny"))
example_inputs = make_inputs()
dynamic_shapes = {"input_ids": {1: Dim("seq", min=2, max=4096)}}
