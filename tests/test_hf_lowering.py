"""The torch half of real models through torchlib, checked numerically on ONNX Runtime (CPU).

Tiny ``transformers`` architectures (random weights, nothing downloaded) whose hidden state
goes through a Triton copy kernel, so everything else in the graph — embeddings, causal and
padding masks, RoPE tables, attention, MLPs, norms — is torch ops lowered by torchlib. The ONNX
(kernel node replaced by its reference) must match PyTorch at sequence lengths other than the
traced one, with the sequence dim symbolic.
"""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
import torch

import kernel_lens as kl
from kernel_lens.onnx import lower_to_onnx

from conftest import with_reference_kernels
from test_onnx_lowering import _KERNELS, _Kernels, _check_structure, _session

transformers = pytest.importorskip("transformers")

_SMALL = dict(vocab_size=128, num_hidden_layers=2, num_attention_heads=4)


def _config(arch: str):
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2, **_SMALL),
        "mistral": lambda: t.MistralConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2,
                                           **_SMALL),
        "qwen2": lambda: t.Qwen2Config(hidden_size=64, intermediate_size=128, num_key_value_heads=2, **_SMALL),
        "gemma": lambda: t.GemmaConfig(hidden_size=64, intermediate_size=128, num_key_value_heads=2,
                                       head_dim=16, **_SMALL),
        "phi": lambda: t.PhiConfig(hidden_size=64, intermediate_size=128, **_SMALL),
        "gpt2": lambda: t.GPT2Config(vocab_size=128, n_embd=64, n_layer=2, n_head=4,
                                     bos_token_id=0, eos_token_id=0),
        "opt": lambda: t.OPTConfig(hidden_size=64, ffn_dim=128, word_embed_proj_dim=64,
                                   bos_token_id=0, eos_token_id=0, pad_token_id=1, **_SMALL),
        "bert": lambda: t.BertConfig(hidden_size=64, intermediate_size=128, **_SMALL),
    }[arch]()


class _HF(_Kernels):
    """``ids -> copy_kernel(model(ids).last_hidden_state)``."""

    def __init__(self, arch: str, triton_kernels: bool = True):
        super().__init__(triton_kernels)
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.model = transformers.AutoModel.from_config(_config(arch)).eval()

    def forward(self, ids):
        kwargs = {} if "Bert" in type(self.model).__name__ else {"use_cache": False}
        return self.copy(self.model(input_ids=ids, **kwargs).last_hidden_state)


@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "gemma", "phi", "gpt2", "opt", "bert"])
def test_hf_torch_ops_match_pytorch_in_ort(arch):
    dims = ({0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=2, max=128)},)
    ids = torch.randint(2, 128, (2, 24), generator=torch.Generator().manual_seed(0))
    module = _HF(arch)
    ir = kl.compile(module, (ids,), dynamic_shapes=dims, arch=90).ir
    assert {"batch", "seq"} <= set(ir.symbols)
    model = lower_to_onnx(ir)
    _check_structure(ir, model)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    out_dims = inferred.graph.output[0].type.tensor_type.shape.dim
    # batch 1 is a size piece of its own (torch.export reasons as if a dynamic size were >= 2):
    # the output's batch dim is then computed by the pieces' selection, not named
    assert [p.when[0].ranges["batch"] for p in ir.pieces] == [(1, 1), (2, 8)]
    assert [d.dim_param or d.dim_value for d in out_dims][1:] == ["seq", 64]
    assert out_dims[0].dim_param and not out_dims[0].dim_value
    sess = _session(with_reference_kernels(ir, model, _KERNELS))
    reference = _HF(arch, triton_kernels=False)
    reference.model.load_state_dict(module.model.state_dict())
    g = torch.Generator().manual_seed(1)
    for batch, seq in [(1, 7), (3, 37), (2, 100)]:
        x = torch.randint(2, 128, (batch, seq), generator=g)
        (got,) = sess.run(None, {ir.inputs[0]: x.numpy()})
        with torch.no_grad():
            want = reference(x).numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{arch} at {batch}x{seq}")
