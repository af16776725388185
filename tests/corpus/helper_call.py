"""A kernel that loads and stores only through ``@triton.jit`` helpers.

Covers case 2: pointer roles have to be inferred across calls. ``x_ptr``/``y_ptr`` are only read
inside ``_load_tile``, ``out_ptr`` is only written inside ``_store_tile``, and ``acc_ptr`` is read
and written inside ``_accumulate`` (which itself calls the other two helpers, with a pointer that
was already offset by the caller).
"""

import torch
import triton
import triton.language as tl


@triton.jit
def _load_tile(ptr, offsets, mask):
    return tl.load(ptr + offsets, mask=mask, other=0.0)


@triton.jit
def _store_tile(ptr, offsets, value, mask):
    tl.store(ptr + offsets, value, mask=mask)


@triton.jit
def _accumulate(acc_ptr, offsets, value, mask):
    acc = _load_tile(acc_ptr, offsets, mask)
    _store_tile(acc_ptr, offsets, acc + value, mask)


@triton.jit
def add_accumulate_kernel(x_ptr, y_ptr, out_ptr, acc_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    """out = x + y;  acc += out."""
    block_start = tl.program_id(0) * BLOCK_SIZE
    local = tl.arange(0, BLOCK_SIZE)
    offsets = block_start + local
    mask = offsets < n_elements
    total = _load_tile(x_ptr, offsets, mask) + _load_tile(y_ptr, offsets, mask)
    _store_tile(out_ptr, offsets, total, mask)
    _accumulate(acc_ptr + block_start, local, total, mask)


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        acc = x.clone()
        n_elements = x.numel()
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        add_accumulate_kernel[grid](x, y, out, acc, n_elements, BLOCK_SIZE=64)
        return out, acc


def _make_inputs(n=300):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, y):
    out = x + y
    return out, x + out


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=1 << 20)
dynamic_shapes = {"x": {0: _n}, "y": {0: _n}}
expected_roles = {
    "add_accumulate_kernel": {
        "x_ptr": "input",
        "y_ptr": "input",
        "out_ptr": "output",
        "acc_ptr": "inplace",
    }
}
tolerance = (0.0, 0.0)
