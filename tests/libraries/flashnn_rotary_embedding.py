"""flashnn: `flashnn.RotaryEmbedding` (GPT-NeoX rotary on [seq, batch, heads, head_dim] q/k; the
module keeps a class-level cos/sin cache that it rebuilds whenever the sequence length changes;
single-config autotuned kernel with a META-dependent grid). flashnn's grid covers
cdiv(seq * batch * heads, BLOCK_SIZE_SEQ * BLOCK_SIZE_BH) programs while the kernel indexes
cdiv(batch * heads, BLOCK_SIZE_BH) blocks per position: positions go unwritten unless batch * heads
is a multiple of BLOCK_SIZE_BH (16), so batch (2) and heads (8) stay static. The module keeps its
cos/sin table in class attributes, rebuilt whenever the sequence length changes (a Python branch on
the exact length, and state the trace would overwrite), and its kernel walks max_seq_len positions
of q and k (so a larger table with a shorter q reads out of bounds): the sequence length is
static here, as it must be for this op."""

import torch
import flashnn

library = "flashnn"  # written against flashnn 0.1.1
library_module = "flashnn"
library_env = {}

HEAD = 32


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rope = flashnn.RotaryEmbedding(HEAD, precision=torch.float32)

    def forward(self, q, k):
        return self.rope(q, k)


def _make_inputs(seq=8, batch=2, heads=8, kv_heads=2):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(seq, batch, heads, HEAD, generator=g),
            torch.randn(seq, batch, kv_heads, HEAD, generator=g))


def _rope(x, cos, sin):
    x1, x2 = x[..., : HEAD // 2], x[..., HEAD // 2:]
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


def reference(q, k):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, HEAD, 2).float() / HEAD))
    freqs = torch.outer(torch.arange(q.shape[0]).float(), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
    return _rope(q, emb.cos(), emb.sin()), _rope(k, emb.cos(), emb.sin())


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = None
tolerance = (1e-5, 1e-5)
