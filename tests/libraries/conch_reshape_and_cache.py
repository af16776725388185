"""conch-triton-kernels: `conch.ops.vllm.reshape_and_cache.reshape_and_cache` (vLLM's KV-cache
write: each new token's key/value goes to slot_mapping[token] of a paged cache, in place; the
model writes into clones of the caches and returns them)."""

import torch
from conch.ops.vllm.reshape_and_cache import reshape_and_cache

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

PAGES, PAGE, KV_HEADS, HEAD = 8, 16, 2, 32


class Model(torch.nn.Module):
    def forward(self, key, value, key_cache, value_cache, slot_mapping):
        key_cache, value_cache = key_cache.clone(), value_cache.clone()
        reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
        return key_cache, value_cache


def _make_inputs(tokens=16):
    g = torch.Generator().manual_seed(0)
    key = torch.randn(tokens, KV_HEADS, HEAD, generator=g)
    value = torch.randn(tokens, KV_HEADS, HEAD, generator=g)
    key_cache = torch.randn(PAGES, PAGE, KV_HEADS, HEAD, generator=g)
    value_cache = torch.randn(PAGES, PAGE, KV_HEADS, HEAD, generator=g)
    slot_mapping = torch.randperm(PAGES * PAGE, generator=g)[:tokens]
    return (key, value, key_cache, value_cache, slot_mapping)


def reference(key, value, key_cache, value_cache, slot_mapping):
    kc = key_cache.clone().view(-1, KV_HEADS, HEAD)
    vc = value_cache.clone().view(-1, KV_HEADS, HEAD)
    kc[slot_mapping] = key
    vc[slot_mapping] = value
    return kc.view(key_cache.shape), vc.view(value_cache.shape)


model = Model()
example_inputs = _make_inputs()
_t = torch.export.Dim("tokens", min=2, max=PAGES * PAGE)
dynamic_shapes = {"key": {0: _t}, "value": {0: _t}, "key_cache": None, "value_cache": None,
                  "slot_mapping": {0: _t}}
tolerance = (0, 0)
