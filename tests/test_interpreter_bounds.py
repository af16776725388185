"""Issue 17: an out-of-bounds access during CPU capture is a one-line CaptureError, not a crash.

Without the bounds check these kernels either corrupt the heap silently (small overruns: the
tests then fail for want of the error) or kill the interpreter with SIGSEGV (large ones).
"""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

import kernel_lens as kl
from kernel_lens.errors import CaptureError
from kernel_lens.frontends.capture.recorder import interpret_launch
from kernel_lens.frontends.capture.interpreter_bounds import (HINT, MemoryRange, OutOfBoundsAccess,
                                                      _Checker, checked_memory)


def _one_line(err: BaseException) -> str:
    text = str(err)
    assert "\n" not in text
    return text


@triton.jit
def _double_and_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) and (offs >= 0)  # Python `and`: keeps only `offs >= 0`
    v = tl.load(x_ptr + offs, mask=mask)
    tl.store(x_ptr + offs, v * 2, mask=mask)


@triton.jit
def _fill_unmasked_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.full((BLOCK,), 1.0, tl.float32))


@triton.jit
def _atomic_add_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_add(x_ptr + offs, 1)


@triton.jit
def _atomic_cas_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.atomic_cas(x_ptr + offs, 0, 1)


@triton.jit
def _edge_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = (offs < n) & (offs >= 0)
    last = tl.load(x_ptr + n - 1)  # the very last element, unmasked
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask, other=0.0) + last, mask=mask)
    tl.atomic_add(out_ptr + offs, 1.0, mask=mask)


@triton.jit
def _read_storage_kernel(v_ptr, out_ptr, start, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(v_ptr + start + offs))


@triton.jit
def _block_ptr_kernel(x_ptr, out_ptr, M, N, BM: tl.constexpr, BN: tl.constexpr,
                      CHECK: tl.constexpr):
    src = tl.make_block_ptr(x_ptr, (M, N), (N, 1), (0, 0), (BM, BN), (1, 0))
    dst = tl.make_block_ptr(out_ptr, (M, N), (N, 1), (0, 0), (BM, BN), (1, 0))
    if CHECK:
        tl.store(dst, tl.load(src, boundary_check=(0, 1), padding_option="zero"),
                 boundary_check=(0, 1))
    else:
        tl.store(dst, tl.load(src))


def _line_of(kernel, text: str) -> int:
    lines, first = inspect.getsourcelines(kernel.fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


def test_dropped_mask_oob_load_names_kernel_parameter_and_element():
    x = torch.arange(100, dtype=torch.float32)
    line = _line_of(_double_and_kernel, "v = tl.load(")  # issue 43: the user's kernel line
    with pytest.raises(CaptureError, match=r"^kernel _double_and_kernel: out-of-bounds load "
                       rf"in program \(0, 0, 0\) at {re.escape(__file__)}:{line}: "
                       r"28 of 128 active lanes .* \(lane 100\) is at "
                       r"element 100 \(byte offset 400\) of the storage of parameter 'x_ptr' "
                       r"\(100 fp32 elements, 400 bytes\); a mask is missing or dropped") as info:
        interpret_launch(_double_and_kernel, (x, 100), {"BLOCK": 128}, (1,))
    assert "use `&`/`|`" in _one_line(info.value)
    torch.testing.assert_close(x, torch.arange(100, dtype=torch.float32))  # nothing written


def test_oob_store_is_caught_before_writing_far_away():
    x = torch.zeros(100)
    line = _line_of(_fill_unmasked_kernel, "tl.store(")
    with pytest.raises(CaptureError, match=r"kernel _fill_unmasked_kernel: out-of-bounds store "
                       rf".* at {re.escape(__file__)}:{line}: "
                       r"28 of 128 active lanes .*element 100 .*'x_ptr'") as info:
        interpret_launch(_fill_unmasked_kernel, (x,), {"BLOCK": 128}, (1,))
    _one_line(info.value)


@pytest.mark.parametrize("kernel", [_atomic_add_kernel, _atomic_cas_kernel])
def test_oob_atomic(kernel):
    x = torch.zeros(10, dtype=torch.int32)
    with pytest.raises(CaptureError, match=rf"kernel {kernel.fn.__name__}: out-of-bounds atomic "
                       r".* 6 of 16 active lanes .*element 10 .*'x_ptr' \(10 int32 elements"):
        interpret_launch(kernel, (x,), {"BLOCK": 16}, (1,))
    assert int(x.sum()) == 0  # checked before any lane was updated


def test_masked_kernel_at_the_edge_has_no_false_positive():
    x = torch.arange(100, dtype=torch.float32)
    out = torch.zeros(100)
    interpret_launch(_edge_kernel, (x, out, 100), {"BLOCK": 64}, (2,))
    torch.testing.assert_close(out, x + 99 + 1)


def test_view_may_read_its_storage_beyond_the_view():
    base = torch.arange(20, dtype=torch.float32)
    out = torch.zeros(16)
    # a strided view of 10 elements: its storage (20 elements) is what the kernel may touch
    interpret_launch(_read_storage_kernel, (base[::2], out, 4), {"BLOCK": 16}, (1,))
    torch.testing.assert_close(out, base[4:20])
    # a view starting at element 5: reading 5 elements before it stays in the storage
    interpret_launch(_read_storage_kernel, (base[5:10], out, -5), {"BLOCK": 16}, (1,))
    torch.testing.assert_close(out, base[:16])
    # ... but not 6: a negative offset is reported as such, not as a wrapped-around address
    with pytest.raises(CaptureError, match=r"out-of-bounds load .* 1 of 16 active lanes .*"
                       r"\(lane 0\) is at element -1 \(byte offset -4\) of the storage of "
                       r"parameter 'v_ptr'"):
        interpret_launch(_read_storage_kernel, (base[5:10], out, -6), {"BLOCK": 16}, (1,))


def test_block_pointers_boundary_check_lanes_are_not_checked():
    x = torch.arange(15, dtype=torch.float32).reshape(3, 5)
    out = torch.zeros(3, 5)
    interpret_launch(_block_ptr_kernel, (x, out, 3, 5), {"BM": 4, "BN": 8, "CHECK": True}, (1,))
    torch.testing.assert_close(out, x)
    with pytest.raises(CaptureError, match=r"_block_ptr_kernel: out-of-bounds load"):
        interpret_launch(_block_ptr_kernel, (x, out, 3, 5),
                         {"BM": 4, "BN": 8, "CHECK": False}, (1,))


class _Doubler(torch.nn.Module):
    def forward(self, x):
        y = x.clone()
        _double_and_kernel[(triton.cdiv(y.numel(), 128),)](y, y.numel(), BLOCK=128)
        return y


def test_compile_raises_one_line_capture_error_and_restores_the_interpreter():
    from triton.runtime.interpreter import InterpreterBuilder, InterpreterError

    before = dict(InterpreterBuilder.__dict__)
    with pytest.raises(CaptureError, match=r"^kernel _double_and_kernel: out-of-bounds load") \
            as info:
        kl.compile(_Doubler(), (torch.randn(100),), arch=90)
    text = _one_line(info.value)
    assert text.count("_double_and_kernel") == 1 and text.endswith(HINT)
    assert not isinstance(info.value, InterpreterError)
    assert dict(InterpreterBuilder.__dict__) == before


def test_checker_without_ranges_and_merged_ranges():
    from triton.runtime.interpreter import TensorHandle

    ptrs = TensorHandle(np.array([4096, 4100], dtype=np.uint64), tl.pointer_type(tl.float32))
    with pytest.raises(OutOfBoundsAccess, match=r"2 of 2 active lanes .*\(the launch has no "
                       r"tensor argument\)"):
        _Checker([]).check("load", ptrs, None)
    # two adjacent storages: an element may not straddle past the end, lanes may span both
    both = _Checker([MemoryRange("a", 4096, 4), MemoryRange("b", 4100, 8)])
    both.check("load", ptrs, None)
    with pytest.raises(OutOfBoundsAccess, match=r"lane 1\) is at byte offset 10 of .* 'b'"):
        both.check("store", TensorHandle(np.array([4100, 4110], dtype=np.uint64),
                                         tl.pointer_type(tl.float32)), None)
    # masked-off lanes are not checked
    both.check("store", ptrs, TensorHandle(np.array([True, False]), tl.int1))
    both.check("store", TensorHandle(np.array([1, 2], dtype=np.uint64),
                                     tl.pointer_type(tl.float32)), np.zeros(2, dtype=bool))


def test_checked_memory_nests_and_restores():
    from triton.runtime.interpreter import InterpreterBuilder

    orig = InterpreterBuilder.__dict__["create_masked_load"]
    with checked_memory([MemoryRange("a", 4096, 8)], kernel="outer"):
        patched = InterpreterBuilder.__dict__["create_masked_load"]
        assert patched is not orig
        with checked_memory([], kernel="inner"):
            assert InterpreterBuilder.__dict__["create_masked_load"] is patched
        assert InterpreterBuilder.__dict__["create_masked_load"] is patched
    assert InterpreterBuilder.__dict__["create_masked_load"] is orig
    with pytest.raises(OutOfBoundsAccess, match=r"^kernel k: out-of-bounds load"):
        with checked_memory([], kernel="k"):
            raise OutOfBoundsAccess("out-of-bounds load")


@triton.jit
def _one_past_kernel(x_ptr, out_ptr, n):
    tl.store(out_ptr, tl.load(x_ptr + n))  # one element past the end: a scalar, unmasked


@triton.jit
def _straddle_kernel(x_ptr, out_ptr, at):
    # an int64 load whose first byte is inside the fp32 storage and whose last byte is past it
    tl.store(out_ptr, tl.load(x_ptr.to(tl.pointer_type(tl.int64), bitcast=True) + at))


def test_one_element_past_the_end_is_caught():
    x = torch.arange(10, dtype=torch.float32)
    out = torch.zeros(1)
    interpret_launch(_one_past_kernel, (x, out, 9), {}, (1,))  # the last element: fine
    assert float(out) == 9.0
    with pytest.raises(CaptureError, match=r"_one_past_kernel: out-of-bounds load .* 1 of 1 active "
                       r"lanes .*element 10 \(byte offset 40\) of the storage of parameter 'x_ptr'"):
        interpret_launch(_one_past_kernel, (x, out, 10), {}, (1,))


def test_an_access_straddling_the_end_of_a_storage_is_caught():
    x = torch.arange(10, dtype=torch.float32)  # 40 bytes: int64 element 4 is bytes 32..39
    out = torch.zeros(1, dtype=torch.int64)
    interpret_launch(_straddle_kernel, (x, out, 4), {}, (1,))
    with pytest.raises(CaptureError, match=r"_straddle_kernel: out-of-bounds load"):
        # x is 40 bytes; an int64 at byte 36 would start inside it and end past it
        interpret_launch(_straddle_kernel, (x[1:], out, 4), {}, (1,))


@triton.jit
def _bf16_reduce_kernel(x_ptr, y_ptr, B: tl.constexpr):
    offs = tl.arange(0, B)
    x = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, x * 2)  # the interpreter makes no bf16 constant


@triton.jit
def _bf16_exp_kernel(x_ptr, y_ptr, B: tl.constexpr):
    offs = tl.arange(0, B)
    tl.store(y_ptr + offs, tl.exp(tl.load(x_ptr + offs)))  # Triton: exp takes fp32/fp64 only


@pytest.mark.parametrize("kernel, text, says", [
    (_bf16_reduce_kernel, "tl.store(", "numpy, which has no bfloat16: compute in fp32 there"),
    (_bf16_exp_kernel, "tl.store(", "Triton's language refuses the kernel line named (it would on a GPU too)"),
])
def test_an_interpreter_failure_names_the_kernel_line_and_the_way_past_it(kernel, text, says):
    """Issue 43 item 1: never a bare AttributeError: the kernel, its line, and what to do."""
    x, y = torch.randn(16, dtype=torch.bfloat16), torch.zeros(16, dtype=torch.bfloat16)
    with pytest.raises(CaptureError) as info:
        interpret_launch(kernel, (x, y), {"B": 16}, (1,))
    line = _one_line(info.value)
    assert line.startswith(f"kernel {kernel.fn.__name__} at {__file__}:{_line_of(kernel, text)}: "
                           f"Triton's interpreter failed to run this launch: "), line
    assert says in line, line
