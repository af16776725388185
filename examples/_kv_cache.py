"""A Triton kernel that writes one new token's key (or value) into a static KV cache in place.

The cache is one layer's ``[B, kv_heads, max_len, head_dim]`` tensor (the layout of
transformers' ``StaticCache``); ``new`` is that layer's ``[B, kv_heads, 1, head_dim]`` key or
value for the new token (any strides, last dim contiguous); ``position`` is a 1-element int64
tensor holding the slot to write, the same for every sequence. One program per (batch, kv_head)
loads the position from device memory (no host sync: the position stays a tensor, so one compiled
graph or CUDA graph serves every step) and stores ``new[b, h, 0, :]`` into ``cache[b, h, pos, :]``
(cast to the cache's dtype). Every other slot of the cache is left as it was. Plain ``tl`` ops only:
it also runs in Triton's interpreter on a CPU-only host.

The kernel only stores to ``cache_ptr``, so role inference calls that parameter ``output``; the
cache is partially written and keeps its other slots, so the right role is ``inplace``:
:data:`ROLES` is the override to hand ``kernel_lens.compile(roles=...)`` (a model file exports it
as ``roles``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def kv_cache_write_kernel(cache_ptr, new_ptr, pos_ptr,
                          stride_cb, stride_ch, stride_cs, stride_nb, stride_nh,
                          HEAD_DIM: tl.constexpr, BLOCK: tl.constexpr):
    """One program per (batch, kv_head): cache[b, h, pos, :] = new[b, h, 0, :]."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr)
    dims = tl.arange(0, BLOCK)
    mask = dims < HEAD_DIM
    row = tl.load(new_ptr + b * stride_nb + h * stride_nh + dims, mask=mask)
    dst = cache_ptr + b * stride_cb + h * stride_ch + pos * stride_cs + dims
    tl.store(dst, row.to(cache_ptr.dtype.element_ty), mask=mask)


ROLES = {"kv_cache_write_kernel": {"cache_ptr": "inplace"}}


def kv_cache_write(cache: torch.Tensor, new: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """Write ``new`` ``[B, H, 1, D]`` into ``cache`` ``[B, H, max_len, D]`` at ``position`` (a
    1-element int64 tensor) in place; returns ``cache``."""
    batch, heads, _, head_dim = cache.shape
    if new.shape != (batch, heads, 1, head_dim):
        raise ValueError(f"new {tuple(new.shape)} does not match cache {tuple(cache.shape)}")
    if cache.stride(-1) != 1:
        raise ValueError("the cache's last dim must be contiguous")
    if new.stride(-1) != 1:
        new = new.contiguous()
    kv_cache_write_kernel[(batch, heads)](
        cache, new, position,
        cache.stride(0), cache.stride(1), cache.stride(2), new.stride(0), new.stride(1),
        HEAD_DIM=head_dim, BLOCK=triton.next_power_of_2(head_dim),
    )
    return cache
