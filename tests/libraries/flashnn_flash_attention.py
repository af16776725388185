"""flashnn: `flashnn.FlashAttention` (FlashAttention-2 forward with block pointers, causal, GQA
4 query heads on 2 KV heads, fp16 [batch, seq, heads, head_dim]; the sequence length's next power
of two is a constexpr)."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}

HEADS, KV_HEADS, HEAD = 4, 2, 32


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = flashnn.FlashAttention()

    def forward(self, q, k, v):
        return self.attn(q, k, v, True)


def _make_inputs(batch=2, seq=16):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(batch, seq, HEADS, HEAD, generator=g).half(),
            torch.randn(batch, seq, KV_HEADS, HEAD, generator=g).half(),
            torch.randn(batch, seq, KV_HEADS, HEAD, generator=g).half())


def reference(q, k, v):
    g = HEADS // KV_HEADS
    q, k, v = (t.float().transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).half()


model = Model()
example_inputs = _make_inputs()
_b, _s = torch.export.Dim("batch", min=2, max=8), torch.export.Dim("seq", min=2, max=2048)
dynamic_shapes = {"q": {0: _b, 1: _s}, "k": {0: _b, 1: _s}, "v": {0: _b, 1: _s}}
tolerance = (2e-3, 2e-3)
