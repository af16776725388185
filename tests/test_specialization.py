"""The specialization pass: which of Triton's assumptions are proven, and the generic binary."""

from __future__ import annotations

import torch

import kernel_lens as kl
from kernel_lens.ir import DType

from conftest import EXAMPLES, ROOT, load_module

cases = load_module(ROOT / "tests" / "models" / "specialization_cases.py")


def _binaries(ir, name):
    kernel = next(k for k in ir.kernels.values() if k.name == name)
    return kernel, kernel.binaries


def test_graph_inputs_are_not_assumed_aligned_intermediates_are():
    m = load_module(EXAMPLES / "toy_two_kernels.py")
    ir = kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes, arch=90).ir
    kernel, bins = _binaries(ir, "add_kernel")  # reads graph inputs: alignment unproven
    assert [b.specialized for b in bins] == [True, False]
    assert bins[0].assumptions["x_ptr"].aligned16
    assert "x_ptr" not in bins[1].assumptions and "out_ptr" in bins[1].assumptions
    assert bins[1].assumptions["out_ptr"].aligned16  # fresh torch.empty_like allocation
    kernel, bins = _binaries(ir, "scale_relu_kernel")  # only intermediates, n < 2**31
    assert [b.specialized for b in bins] == [True]


def test_unbounded_dim_widens_int32_scalar_to_int64_in_generic_binary():
    x = torch.randn(4096)
    ir = kl.compile(cases.Scale(), (x,), dynamic_shapes=({0: cases.unbounded},), arch=90).ir
    kernel, bins = _binaries(ir, "scale_kernel")
    spec, generic = bins
    assert kernel.specialization["n"].divisible16 and kernel.specialization["n"].int32
    assert spec.int_types["n"] == DType.i32 and generic.int_types["n"] == DType.i64
    assert next(a for a in generic.abi if a.name == "n").c_type == "int64_t"
    assert ".param .u64 scale_kernel_param_2" in generic.ptx
    assert ".param .u32 scale_kernel_param_2" in spec.ptx
    # stride(-1) == 1 for every input: folded in both binaries, absent from both ABIs.
    assert kernel.specialization["stride"].equal_to_1
    assert generic.assumptions["stride"].equal_to_1
    assert all("stride" not in [a.name for a in b.abi] for b in bins)


def test_divisibility_proven_from_derived_dims():
    x = torch.randn(3, 64)
    r = torch.export.Dim("r", min=2, max=64)
    ir = kl.compile(cases.Scale(), (x,), dynamic_shapes=({0: r, 1: 16 * cases.sixteens},),
                    arch=90).ir
    # k from 1: k = 1 is traced on its own (torch reasons as if a dynamic size were >= 2)
    assert [p.when[0].ranges for p in ir.pieces] == [{"k": (1, 1)}, {"k": (2, 1024)}]
    kernel, bins = _binaries(ir.pieces[1].graph, "scale_kernel")
    assert kernel.specialization["n"].divisible16
    generic = bins[-1]
    assert not generic.specialized and generic.assumptions["n"].divisible16
    assert generic.assumptions["n"].int32  # 64 * 16 * 1024 < 2**31
    assert "x_ptr" not in generic.assumptions


def test_int32_range_ends_are_inclusive():
    # an integer argument keeps Triton's int32 assumption only if its bounds fit [-2**31, 2**31)
    from kernel_lens.passes.specialization import INT32, _within

    assert _within((-2**31, 2**31 - 1), INT32)
    assert not _within((-2**31 - 1, 0), INT32) and not _within((0, 2**31), INT32)
