"""Liger-Kernel: `liger_kernel.ops.LigerFusedMoEFunction` (the fused MoE expert block behind
`LigerExperts`: routing metadata by three Triton kernels, gather + grouped GEMM + SwiGLU, down
projection, weighted gather-sum; 4 experts, top-2). The host code reads a VALUE that a Triton
kernel computed: `num_m_tiles = int(expert_tile_offset[-1].item())` (the total of each expert's
cdiv(tokens routed to it, 64)) sizes two buffers and the grids of both GEMM kernels, and
`if num_m_tiles > 0:` branches on it. The routing top_k_index is an input, so the value varies."""

import torch
from liger_kernel.ops import LigerFusedMoEFunction

library = "liger-kernel"  # written against liger_kernel 0.8.5
library_module = "liger_kernel"
library_env = {"LIGER_FUSED_MOE_AUTOTUNE": "0"}  # one config per kernel (Liger's own switch)

EXPERTS, TOP_K, HIDDEN, INTER = 4, 2, 32, 32


class Model(torch.nn.Module):
    def forward(self, x, gate_up_proj, down_proj, top_k_index, top_k_weights):
        return LigerFusedMoEFunction.apply(x, gate_up_proj, down_proj, top_k_index, top_k_weights)


def _route(tokens, gen, experts=None):
    """top-2 expert indices per token (distinct), from `experts` when given (a list of pairs)."""
    if experts is not None:
        return torch.tensor(experts, dtype=torch.int32)
    return torch.stack([torch.randperm(EXPERTS, generator=gen)[:TOP_K] for _ in range(tokens)]).int()


def _make_inputs(tokens=8, experts=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, HIDDEN, generator=gen)
    gate_up_proj = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) / HIDDEN ** 0.5
    down_proj = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) / INTER ** 0.5
    top_k_index = _route(tokens, gen, experts)
    top_k_weights = torch.rand(tokens, TOP_K, generator=gen).softmax(-1)
    return (x, gate_up_proj, down_proj, top_k_index, top_k_weights)


def reference(x, gate_up_proj, down_proj, top_k_index, top_k_weights):
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for k in range(top_k_index.shape[1]):
            e = int(top_k_index[t, k])
            gate, up = (gate_up_proj[e] @ x[t]).split(INTER)
            out[t] += top_k_weights[t, k] * (down_proj[e] @ (torch.nn.functional.silu(gate) * up))
    return out


model = Model()
example_inputs = _make_inputs()
# every token routed to experts 0 and 1 (2 tiles), or spread over all four (4 tiles)
extra_examples = [_make_inputs(experts=[[0, 1]] * 8)]
# tokens dynamic: two size pieces; in [2, 512] tile_expert_counts = torch.empty(E, cdiv(T, 512))
# has torch strides (1, 1) (n_tiles is 1 over the whole piece), which is dense there.
_tokens = torch.export.Dim("tokens", min=2, max=1024)
dynamic_shapes = {"x": {0: _tokens}, "gate_up_proj": None, "down_proj": None,
                  "top_k_index": {0: _tokens}, "top_k_weights": {0: _tokens}}
tolerance = (1e-4, 1e-4)
