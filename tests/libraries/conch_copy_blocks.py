"""conch-triton-kernels: `conch.ops.vllm.copy_blocks.copy_blocks` (vLLM's KV-cache block copy
across layers: the launcher passes the per-layer caches as a tensor of their data pointers, which
the kernel loads and casts with `.to(tl.pointer_type(...))`). Two layers; the model copies into
clones of the caches and returns them."""

import torch
from conch.ops.vllm.copy_blocks import copy_blocks

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

BLOCKS, PAGE_ELEMS = 16, 16 * 2 * 32


class Model(torch.nn.Module):
    def forward(self, k0, k1, v0, v1, block_mapping):
        k0, k1, v0, v1 = k0.clone(), k1.clone(), v0.clone(), v1.clone()
        copy_blocks([k0, k1], [v0, v1], block_mapping)
        return k0, k1, v0, v1


def _make_inputs(pairs=4):
    g = torch.Generator().manual_seed(0)
    caches = [torch.randn(BLOCKS, PAGE_ELEMS, generator=g) for _ in range(4)]
    perm = torch.randperm(BLOCKS, generator=g)
    pairs = min(pairs, BLOCKS // 2)
    block_mapping = torch.stack((perm[:pairs], perm[pairs:2 * pairs]), dim=1)
    return (*caches, block_mapping)


def reference(k0, k1, v0, v1, block_mapping):
    out = [c.clone() for c in (k0, k1, v0, v1)]
    for c in out:
        c[block_mapping[:, 1]] = c[block_mapping[:, 0]]
    return tuple(out)


model = Model()
example_inputs = _make_inputs()
dynamic_shapes = {"k0": None, "k1": None, "v0": None, "v1": None,
                  "block_mapping": {0: torch.export.Dim("pairs", min=2, max=BLOCKS // 2)}}
tolerance = (0, 0)
