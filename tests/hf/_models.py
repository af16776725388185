"""Tiny Hugging Face ``transformers`` models with Triton kernels patched into their norms, MLP
activations and rotary embeddings.

``build(arch)`` returns ``(model, example_inputs, dynamic_shapes, expected)``:

- ``model``: a :class:`HFWithTriton` wrapping ``XxxModel(config)`` (random weights from a seeded
  init, nothing downloaded; hidden 64, 2 layers, 4 heads, vocab 128, ``sdpa`` attention) whose
  norm / MLP / activation *module instances* are replaced by ``examples/_hf_kernels`` modules sharing the same
  parameters. RoPE is a module-level function in transformers, so ``forward`` swaps the modeling
  module's ``apply_rotary_pos_emb`` for the Triton one for the duration of the call only (always
  restored). ``forward(input_ids)`` returns ``last_hidden_state`` (one tensor).
- ``example_inputs``: ``(input_ids,)``, int64 (batch 2, seq 24), seeded.
- ``dynamic_shapes``: batch and seq dims of ``input_ids`` (``Dim("batch")``, ``Dim("seq")``).
- ``expected``: an :class:`Expected` with launch counts per kernel name, the pointer roles per
  kernel, the IR symbols, and the tolerance of the patched model against the unpatched one.

``reference(arch)`` is the same model without any patch (same weights), for eager comparison.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import transformers
from torch.export import Dim

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))  # the kernels live there
import _hf_kernels as K  # noqa: E402

ARCHS = ("llama", "mistral", "qwen2", "gemma", "phi", "gpt2", "opt", "bert")

HIDDEN, LAYERS, HEADS, VOCAB, INTERMEDIATE = 64, 2, 4, 128, 128
MAX_POSITIONS = 512
SEQ_MAX = 256
BATCH, SEQ = 2, 24
SEED = 0

NORM_ROLES = {"x_ptr": "input", "w_ptr": "input", "out_ptr": "output"}
ROLES = {
    "rmsnorm_kernel": NORM_ROLES,
    "gemma_rmsnorm_kernel": NORM_ROLES,
    "layernorm_kernel": {"x_ptr": "input", "w_ptr": "input", "b_ptr": "input", "out_ptr": "output"},
    "silu_mul_kernel": {"gate_ptr": "input", "up_ptr": "input", "out_ptr": "output"},
    "gelu_tanh_mul_kernel": {"gate_ptr": "input", "up_ptr": "input", "out_ptr": "output"},
    "gelu_tanh_kernel": {"x_ptr": "input", "out_ptr": "output"},
    "gelu_erf_kernel": {"x_ptr": "input", "out_ptr": "output"},
    "relu_kernel": {"x_ptr": "input", "out_ptr": "output"},
    "rope_kernel": {"q_ptr": "input", "k_ptr": "input", "cos_ptr": "input", "sin_ptr": "input",
                    "q_out_ptr": "output", "k_out_ptr": "output"},
}


@dataclass
class Expected:
    launches: dict[str, int]  # kernel name -> launches per forward
    symbols: tuple[str, ...] = ("batch", "seq")
    # patched (Triton, fp32 math) vs unpatched HF model, fp32 on CPU: only rounding differs
    tolerance: tuple[float, float] = (1e-4, 1e-5)
    roles: dict[str, dict[str, str]] = field(init=False)  # kernel -> pointer param -> role

    def __post_init__(self):
        self.roles = {k: ROLES[k] for k in self.launches}


# --------------------------------------------------------------------------- configs


def _common(**extra):
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                num_attention_heads=HEADS, intermediate_size=INTERMEDIATE,
                max_position_embeddings=MAX_POSITIONS, attn_implementation="sdpa", **extra)


def _config(arch: str):
    t = transformers
    if arch == "llama":
        return t.LlamaConfig(**_common(num_key_value_heads=HEADS, rms_norm_eps=1e-6))
    if arch == "mistral":  # GQA, and a sliding window shorter than the longer test sequences
        return t.MistralConfig(**_common(num_key_value_heads=2, head_dim=HIDDEN // HEADS,
                                         sliding_window=32, rms_norm_eps=1e-5))
    if arch == "qwen2":  # GQA, q/k/v biases
        return t.Qwen2Config(**_common(num_key_value_heads=2, rms_norm_eps=1e-6))
    if arch == "gemma":  # MQA, GeGLU, (1 + w) RMSNorm, scaled embeddings
        return t.GemmaConfig(**_common(num_key_value_heads=1, head_dim=HIDDEN // HEADS,
                                       hidden_act="gelu_pytorch_tanh", rms_norm_eps=1e-6))
    if arch == "phi":  # partial rotary (half of head_dim), parallel attention + MLP, LayerNorm
        return t.PhiConfig(**_common(num_key_value_heads=HEADS, hidden_act="gelu_new"))
    if arch == "gpt2":
        return t.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                            n_inner=INTERMEDIATE, n_positions=MAX_POSITIONS,
                            activation_function="gelu_new", bos_token_id=VOCAB - 1,
                            eos_token_id=VOCAB - 1, attn_implementation="sdpa")
    if arch == "opt":
        return t.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                           num_attention_heads=HEADS, ffn_dim=INTERMEDIATE, word_embed_proj_dim=HIDDEN,
                           max_position_embeddings=MAX_POSITIONS, activation_function="relu",
                           do_layer_norm_before=True, attn_implementation="sdpa")
    if arch == "bert":
        return t.BertConfig(**_common(hidden_act="gelu"))
    raise ValueError(f"unknown arch {arch!r}; known: {ARCHS}")


_MODEL_CLASS = {"llama": "LlamaModel", "mistral": "MistralModel", "qwen2": "Qwen2Model",
                "gemma": "GemmaModel", "phi": "PhiModel", "gpt2": "GPT2Model", "opt": "OPTModel",
                "bert": "BertModel"}


def _hf_model(arch: str) -> torch.nn.Module:
    config = _config(arch)
    torch.manual_seed(SEED)
    kwargs = {"add_pooling_layer": False} if arch == "bert" else {}
    model = getattr(transformers, _MODEL_CLASS[arch])(config, **kwargs).eval()
    # HF initialises norms to exactly 1 / 0 (Gemma: 0): perturb them so a kernel that ignores
    # (or misreads) its weight or bias cannot pass.
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.split(".")[-2:-1] in (["ln_1"], ["ln_2"], ["ln_f"]):
                p.add_(0.1 * torch.randn(p.shape, generator=g))
    return model


# --------------------------------------------------------------------------- patching


def _replace(model: torch.nn.Module, match: Callable[[str, torch.nn.Module], bool],
             make: Callable[[torch.nn.Module], torch.nn.Module]) -> int:
    """Replace every submodule ``match`` accepts by ``make(old)`` on its parent; the count."""
    hits = [(name, m) for name, m in model.named_modules() if name and match(name, m)]
    for name, old in hits:
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, make(old))
    return len(hits)


def _is_rmsnorm(_, m):
    return type(m).__name__.endswith("RMSNorm")


def _is_layernorm(_, m):
    return isinstance(m, torch.nn.LayerNorm)


def _is_gated_mlp(_, m):
    return all(hasattr(m, a) for a in ("gate_proj", "up_proj", "down_proj"))


def _named(*attrs):
    return lambda name, m: name.rpartition(".")[2] in attrs


def _patch(arch: str, model: torch.nn.Module) -> dict[str, int]:
    """Replace norms / MLP activations in place; returns the number of modules replaced by kind."""
    done = {}
    if arch in ("llama", "mistral", "qwen2", "gemma"):
        gemma = arch == "gemma"
        done["rmsnorm"] = _replace(model, _is_rmsnorm, lambda m: K.TritonRMSNorm.from_hf(m, gemma=gemma))
        act = "gelu_tanh" if gemma else "silu"
        done["mlp"] = _replace(model, _is_gated_mlp, lambda m: K.TritonGatedMLP(m, act))
    else:
        done["layernorm"] = _replace(model, _is_layernorm, K.TritonLayerNorm.from_torch)
        attr, act = {"phi": ("activation_fn", "gelu_tanh"), "gpt2": ("act", "gelu_tanh"),
                     "opt": ("activation_fn", "relu"), "bert": ("intermediate_act_fn", "gelu")}[arch]
        done["act"] = _replace(model, _named(attr), lambda m: K.TritonActivation(act))
    return done


_ROPE_MODULES = {a: f"transformers.models.{a}.modeling_{a}"
                 for a in ("llama", "mistral", "qwen2", "gemma", "phi")}


class HFWithTriton(torch.nn.Module):
    """A transformers base model run with ``use_cache=False``; returns ``last_hidden_state``."""

    def __init__(self, model: torch.nn.Module, rope_module: str | None = None, decoder: bool = True,
                 name: str = "hf_model"):
        super().__init__()
        self.__name__ = name  # kernel_lens names the IR (and the ORT library) after it
        self.model = model
        self.rope_module = rope_module  # a module *name*: the wrapper stays deep-copyable
        self.decoder = decoder

    def forward(self, input_ids):
        kwargs = {"use_cache": False} if self.decoder else {}
        with K.triton_rope(self.rope_module):
            return self.model(input_ids=input_ids, **kwargs).last_hidden_state


def _expected(arch: str) -> Expected:
    n_norms = 2 * LAYERS + 1  # two per layer and a final one (BERT: embedding norm, no final)
    if arch in ("llama", "mistral", "qwen2"):
        return Expected({"rmsnorm_kernel": n_norms, "rope_kernel": LAYERS, "silu_mul_kernel": LAYERS})
    if arch == "gemma":
        return Expected({"gemma_rmsnorm_kernel": n_norms, "rope_kernel": LAYERS,
                         "gelu_tanh_mul_kernel": LAYERS})
    if arch == "phi":  # one (shared) norm per layer, and a final one
        return Expected({"layernorm_kernel": LAYERS + 1, "rope_kernel": LAYERS,
                         "gelu_tanh_kernel": LAYERS})
    if arch == "gpt2":
        return Expected({"layernorm_kernel": n_norms, "gelu_tanh_kernel": LAYERS})
    if arch == "opt":
        return Expected({"layernorm_kernel": n_norms, "relu_kernel": LAYERS})
    if arch == "bert":
        return Expected({"layernorm_kernel": n_norms, "gelu_erf_kernel": LAYERS})
    raise ValueError(f"unknown arch {arch!r}; known: {ARCHS}")


def make_inputs(batch: int = BATCH, seq: int = SEQ, seed: int = SEED, device: str = "cpu"):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (batch, seq), generator=g).to(device),)


def dynamic_shapes():
    return {"input_ids": {0: Dim("batch", min=2, max=16), 1: Dim("seq", min=2, max=SEQ_MAX)}}


def reference(arch: str) -> HFWithTriton:
    """The unpatched model (same weights as ``build(arch)``'s), as plain transformers runs it."""
    return HFWithTriton(_hf_model(arch), None, decoder=arch != "bert", name=f"hf_{arch}_reference")


def build(arch: str):
    """``(model, example_inputs, dynamic_shapes, expected)`` for one architecture."""
    hf = _hf_model(arch)
    replaced = _patch(arch, hf)
    if not all(replaced.values()):
        raise AssertionError(f"{arch}: nothing replaced for {[k for k, v in replaced.items() if not v]}")
    model = HFWithTriton(hf, _ROPE_MODULES.get(arch), decoder=arch != "bert", name=f"hf_{arch}")
    return model, make_inputs(), dynamic_shapes(), _expected(arch)


def launch_counts(ir) -> dict[str, int]:
    """Launches per kernel name in an IR."""
    counts: dict[str, int] = {}
    for launch in ir.launches:
        name = ir.kernels[launch.kernel].name
        counts[name] = counts.get(name, 0) + 1
    return counts


def to_device(model: torch.nn.Module, device: str, dtype: torch.dtype | None = None):
    """A copy of ``model`` on ``device`` (and ``dtype``), e.g. for an eager GPU run."""
    model = copy.deepcopy(model).to(device)
    return model.to(dtype) if dtype is not None else model
