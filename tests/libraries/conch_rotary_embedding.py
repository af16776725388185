"""conch-triton-kernels: `conch.ops.embedding.rotary_embedding.rotary_embedding` (vLLM-style
NeoX rotary, in place on query/key, positions gathered from a [max_pos, rot_dim] cos|sin cache;
GQA: 4 query heads, 2 kv heads). The model rotates clones of its inputs."""

import torch
from conch.ops.embedding.rotary_embedding import rotary_embedding

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

HEAD = 32
MAX_POS = 4096


def _cos_sin_cache(base=10000.0):
    inv_freq = 1.0 / (base ** (torch.arange(0, HEAD, 2, dtype=torch.float) / HEAD))
    freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("cos_sin_cache", _cos_sin_cache())

    def forward(self, positions, query, key):
        query, key = query.clone(), key.clone()
        return rotary_embedding(positions, query, key, HEAD, self.cos_sin_cache, is_neox=True)


def _make_inputs(tokens=16, heads=4, kv_heads=2):
    g = torch.Generator().manual_seed(0)
    positions = torch.randint(0, MAX_POS, (tokens,), generator=g)
    return (positions, torch.randn(tokens, heads * HEAD, generator=g),
            torch.randn(tokens, kv_heads * HEAD, generator=g))


def _rope(x, cos, sin):
    x = x.view(x.shape[0], -1, HEAD)
    x1, x2 = x.chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(1)


def reference(positions, query, key):
    cos, sin = model.cos_sin_cache[positions].chunk(2, dim=-1)
    return _rope(query, cos, sin), _rope(key, cos, sin)


model = Model()
example_inputs = _make_inputs()
_t = torch.export.Dim("tokens", min=2, max=4096)
dynamic_shapes = {"positions": {0: _t}, "query": {0: _t}, "key": {0: _t}}
tolerance = (1e-5, 1e-5)
