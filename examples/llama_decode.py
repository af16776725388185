"""One LLaMA decode step over a STATIC KV cache, with Triton RMSNorm, RoPE, SwiGLU and cache write.

The weights are a Hugging Face ``transformers.LlamaForCausalLM`` built from a config (random
weights from a seeded init; nothing is downloaded); its norms and MLPs are replaced by the Triton
drop-ins of ``_hf_kernels.py`` (sharing the original parameters), as in ``hf_llama.py``.
:class:`LlamaDecodeStep` runs the model's own modules for ONE new token per sequence:

    forward(input_ids [B, 1] int64, position [1] int64, *caches) -> logits [B, vocab]

``caches`` is ``(k_cache_0, v_cache_0, k_cache_1, v_cache_1, ...)``: one tensor per layer and
k/v, each ``[B, kv_heads, max_len, head_dim]`` (the layout of transformers' ``StaticCache``); in
the compiled graph they are the inputs ``caches_0``, ``caches_1``, ... (k at even, v at odd
indices; torch.export names a ``*caches`` argument that way) with outputs ``mutated_caches_<i>``.
The step writes the new token's k and v into its layer's two caches IN PLACE at ``position``, one
launch of the Triton ``kv_cache_write_kernel`` (``_kv_cache.py``) per cache tensor, which reads
the position on the device, and then attends over the layer's whole updated cache with the
boolean mask ``arange(max_len) <= position`` (torch SDPA after ``repeat_kv``). Each cache is thus
written by exactly one node that works in place and read only after it, which lets the runtime
bind ``mutated_caches_<i>`` to the input's own buffer (no copy of the cache per step).
``position`` is a tensor input (the index of the new token, the same for every sequence), so one
compiled graph serves every step. RoPE's cos/sin come from the model's rotary embedding at
``position``. ``triton=False`` (the plain reference) writes the caches with ``index_copy_``.

The cache kernel only stores to its cache parameter, so role inference alone calls it ``output``;
the cache is partially written, and :data:`roles` overrides that to ``inplace`` (the CLI reads
it from this file; pass ``roles=`` to ``kernel_lens.compile`` when calling it directly).

    kernel_lens compile examples/llama_decode.py --target ort -o kl_llama_decode

``KL_DECODE_SIZE`` picks the config: ``tiny`` (default: hidden 256, 2 layers, 8/4 heads, FFN 688,
vocab 1024, max_len 64; compiles on a CPU-only host) or ``bench`` (hidden 4096, 4 layers, 32/8
heads, FFN 11008, vocab 32000, max_len 256; what ``benchmarks/bench_decode.py`` measures on the
GPU). ``KL_DECODE_BATCH`` is the example batch (default 1); from 2 up the batch dim is dynamic
(``dynamic_shapes``), at 1 the model is compiled for batch 1.

:func:`greedy_decode` runs the decode loop (prompt fed token by token through the same step, then
greedy tokens) with any callable of the step's signature: the eager module or a compiled model's
``run``.
"""

from __future__ import annotations

import os
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
import transformers
from torch.export import Dim
from transformers.models.llama import modeling_llama

import _hf_kernels as K
from _kv_cache import ROLES, kv_cache_write

SIZES = {
    "tiny": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=4, vocab_size=1024, max_len=64),
    "bench": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=4,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=32000, max_len=256),
}


class LlamaDecodeStep(torch.nn.Module):
    """A decode step of ``LlamaForCausalLM`` with a static KV cache; ``triton=False`` keeps the
    HF norms/MLP/RoPE in torch (the plain reference). ``max_len`` overrides the size's cache
    length (the weights do not depend on it: the same ``seed`` gives the same weights)."""

    def __init__(self, size: str = "tiny", triton: bool = True, seed: int = 0,
                 max_len: int | None = None):
        super().__init__()
        sizes = dict(SIZES[size])
        default_max_len = sizes.pop("max_len")  # not a LlamaConfig field
        self.max_len = default_max_len if max_len is None else max_len
        config = transformers.LlamaConfig(**sizes, max_position_embeddings=max(self.max_len, 2048),
                                          attn_implementation="sdpa")
        torch.manual_seed(seed)
        self.hf = transformers.LlamaForCausalLM(config).eval()
        self.config = config
        self.n_layers = config.num_hidden_layers
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.triton = triton
        if triton:
            K.use_triton_llama(self.hf)

    def cache_shape(self, batch: int) -> tuple[int, ...]:
        """One layer's k (or v) cache: ``[B, kv_heads, max_len, head_dim]``."""
        return (batch, self.n_kv_heads, self.max_len, self.head_dim)

    def cache_names(self) -> list[str]:
        """The cache inputs' names, in order: k_cache_0, v_cache_0, k_cache_1, ..."""
        return [f"{kv}_cache_{i}" for i in range(self.n_layers) for kv in "kv"]

    def new_caches(self, batch: int, device=None, dtype=None) -> tuple[torch.Tensor, ...]:
        """Zeroed per-layer caches ``(k_cache_0, v_cache_0, k_cache_1, ...)`` for ``batch``
        sequences, on the model's device and dtype."""
        weight = self.hf.lm_head.weight
        kw = dict(device=device or weight.device, dtype=dtype or weight.dtype)
        return tuple(torch.zeros(self.cache_shape(batch), **kw) for _ in range(2 * self.n_layers))

    def forward(self, input_ids, position, *caches):
        if len(caches) != 2 * self.n_layers:
            raise TypeError(f"expected {2 * self.n_layers} caches (k and v per layer), "
                            f"got {len(caches)}")
        m = self.hf.model
        batch = input_ids.shape[0]
        x = m.embed_tokens(input_ids)                                   # [B, 1, hidden]
        cos, sin = m.rotary_emb(x, position.view(1, 1))                 # [1, 1, head_dim]
        rope = K.apply_rotary_pos_emb if self.triton else modeling_llama.apply_rotary_pos_emb
        valid = torch.arange(self.max_len, device=input_ids.device) <= position
        mask = valid.view(1, 1, 1, self.max_len)                        # True: attend
        groups = self.n_heads // self.n_kv_heads
        for i, layer in enumerate(m.layers):
            attn = layer.self_attn
            k_cache, v_cache = caches[2 * i], caches[2 * i + 1]
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(batch, 1, self.n_heads, self.head_dim).transpose(1, 2)
            k = attn.k_proj(h).view(batch, 1, self.n_kv_heads, self.head_dim).transpose(1, 2)
            v = attn.v_proj(h).view(batch, 1, self.n_kv_heads, self.head_dim).transpose(1, 2)
            q, k = rope(q, k, cos, sin)
            if self.triton:  # one in-place Triton launch per cache tensor
                kv_cache_write(k_cache, k, position)
                kv_cache_write(v_cache, v, position)
            else:  # the plain reference
                k_cache.index_copy_(2, position, k.to(k_cache.dtype))
                v_cache.index_copy_(2, position, v.to(v_cache.dtype))
            # attention over the whole updated cache of this layer
            keys = modeling_llama.repeat_kv(k_cache, groups)            # [B, heads, max_len, hd]
            values = modeling_llama.repeat_kv(v_cache, groups)
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + attn.o_proj(o.transpose(1, 2).reshape(batch, 1, self.n_heads * self.head_dim))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.hf.lm_head(m.norm(x))[:, -1]


StepFn = Callable[..., torch.Tensor]  # step_fn(input_ids, position, *caches) -> logits


@torch.no_grad()
def greedy_decode(step_fn: StepFn, prompt_ids: torch.Tensor, n_tokens: int,
                  caches: Sequence[torch.Tensor], *,
                  on_step: Callable[[int, torch.Tensor], None] | None = None) -> torch.Tensor:
    """Greedy decoding through ``step_fn(input_ids, position, *caches) -> logits``.

    The prompt ``[B, P]`` is fed one token per step (positions 0..P-1, filling the caches), then
    ``n_tokens`` tokens are generated, each the argmax of the previous step's logits. Returns the
    generated ids ``[B, n_tokens]``. ``on_step(step, logits)`` sees every step's logits (e.g. to
    compare variants). ``P + n_tokens - 1`` must not exceed the cache length."""
    caches = tuple(caches)
    batch, prompt_len = prompt_ids.shape
    max_len = caches[0].shape[2]
    if prompt_len < 1 or prompt_len + n_tokens - 1 > max_len:
        raise ValueError(f"prompt {prompt_len} + {n_tokens} tokens do not fit a cache of "
                         f"{max_len} positions")
    device = prompt_ids.device
    generated = []
    token = prompt_ids[:, :1].contiguous()
    for step in range(prompt_len + n_tokens - 1):
        position = torch.tensor([step], dtype=torch.int64, device=device)
        logits = step_fn(token, position, *caches)
        if on_step is not None:
            on_step(step, logits)
        if step + 1 < prompt_len:
            token = prompt_ids[:, step + 1:step + 2].contiguous()
        else:
            token = logits.argmax(dim=-1, keepdim=True).to(torch.int64)
            generated.append(token)
    return torch.cat(generated, dim=1) if generated else prompt_ids[:, :0]


def make_inputs(model: LlamaDecodeStep, batch: int = 1, position: int = 3, device: str = "cpu",
                seed: int = 0):
    """(input_ids, position, k_cache_0, v_cache_0, k_cache_1, ...) with random cache contents
    (a mid-sequence step)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, model.config.vocab_size, (batch, 1), generator=g)
    dtype = model.hf.lm_head.weight.dtype
    caches = [torch.randn(model.cache_shape(batch), generator=g).to(dtype)
              for _ in range(2 * model.n_layers)]
    return tuple(t.to(device) for t in (ids, torch.tensor([position]), *caches))


def dynamic_shapes_for(batch: int, n_layers: int | None = None):
    """A dynamic batch dim from 2 to 256 shared by the ids and every cache; ``None`` (all
    static) for batch 1. (A range from 1 also compiles, as two size pieces: batch 1 traced on its
    own, since torch.export reasons as if a dynamic size were at least 2.) ``n_layers`` defaults
    to the module-level model's."""
    if batch < 2:
        return None
    n_layers = model.n_layers if n_layers is None else n_layers
    b = Dim("batch", min=2, max=256)
    return {"input_ids": {0: b}, "position": None, "caches": ({0: b},) * (2 * n_layers)}


SIZE = os.environ.get("KL_DECODE_SIZE", "tiny")
BATCH = int(os.environ.get("KL_DECODE_BATCH", "1"))

model = LlamaDecodeStep(SIZE)
example_inputs = make_inputs(model, BATCH)
dynamic_shapes = dynamic_shapes_for(BATCH)
roles = ROLES  # the cache write's cache_ptr is partially written: inplace (see _kv_cache.py)
