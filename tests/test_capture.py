"""Launch capture on a CPU-only host: interpreter, autotune, heuristics, kernel identity."""

from __future__ import annotations

import os

import pytest

import kernel_lens as kl
from kernel_lens.errors import CaptureError
from kernel_lens.frontends import triton_compat as tc

from conftest import CORPUS, load_module


def _compile(name, **kw):
    m = load_module(CORPUS / f"{name}.py")
    inputs = tuple(t.clone() for t in m.example_inputs)
    return m, kl.compile(m.model, inputs, dynamic_shapes=m.dynamic_shapes, arch=90, **kw)


def test_no_triton_interpret_needed_and_patches_are_restored():
    run, call = tc.JITFunction.run, tc.JITFunction.__call__
    assert "TRITON_INTERPRET" not in os.environ
    _compile("helper_call")
    assert tc.JITFunction.run is run and tc.JITFunction.__call__ is call


def test_autotune_on_cpu_takes_first_config_and_records_it():
    m, c = _compile("autotune")
    (kernel,) = c.ir.kernels.values()
    first = m.scaled_add_kernel.configs[0]
    assert kernel.options.autotune_choice == "first-config"
    assert kernel.options.autotune_config == first.kwargs
    assert kernel.options.num_warps == first.num_warps


def test_autotune_override_and_bad_override():
    m = load_module(CORPUS / "autotune.py")
    last = m.scaled_add_kernel.configs[-1]
    _, c = _compile("autotune", autotune={"scaled_add_kernel": last.kwargs})
    (kernel,) = c.ir.kernels.values()
    assert kernel.options.autotune_choice == "user"
    assert kernel.options.autotune_config == last.kwargs
    block = next(iter(last.kwargs))
    assert kernel.param(block).constexpr_value == last.kwargs[block]
    with pytest.raises(CaptureError, match="matches none of its configs"):
        _compile("autotune", autotune={"scaled_add_kernel": {"BLOCK_SIZE": 3}})


def test_heuristic_over_dynamic_dim_compiles_both_truth_values():
    _, c = _compile("heuristics")
    (launch,) = c.ir.launches
    assert launch.guards == {"EVEN_N": "Eq(Mod(n, 128), 0)"}
    kernels = {d.when["EVEN_N"]: c.ir.kernels[d.kernel] for d in launch.dispatch}
    assert kernels[True].param("EVEN_N").constexpr_value is True
    assert kernels[False].param("EVEN_N").constexpr_value is False
    assert launch.kernel == next(d.kernel for d in launch.dispatch if d.when["EVEN_N"])
    assert all(k.binaries for k in kernels.values())
    # the EVEN_N=False variant serves sizes the capture never saw: it needs a generic binary
    assert [b.specialized for b in kernels[False].binaries] == [True, False]


def test_same_named_kernels_from_two_modules_stay_distinct():
    _, c = _compile("same_name")
    kernels = list(c.ir.kernels.values())
    assert [k.name for k in kernels] == ["scale_kernel", "scale_kernel"]
    assert len({k.id for k in kernels}) == 2
    assert len({k.source.qualname for k in kernels}) == 2


def test_one_kernel_many_launches_with_different_scalars():
    _, c = _compile("multi_launch")
    consts = [next(a.constant for a in l.args if a.name == "alpha") for l in c.ir.launches]
    assert consts == [2.0, 0.5, -3.0]
    assert len(c.ir.launches) == 3


def test_non_contiguous_strides_are_symbolic_scalars():
    _, c = _compile("strided_input")
    (launch,) = c.ir.launches
    strides = {a.name: a.expr for a in launch.args if a.expr is not None and "stride" in a.name}
    assert strides and any(not s.isdigit() for s in strides.values())
    tensor = next(a for a in launch.args if a.value == c.ir.inputs[0] or a.value)
    assert tensor.strides is not None


def test_dtypes_are_recorded():
    for name, dtype in (("dtype_fp8", "fp8e4nv"), ("dtype_int8", "i8"), ("dtype_fp16_bf16", "bf16")):
        _, c = _compile(name)
        seen = {p.dtype.value for k in c.ir.kernels.values() for p in k.params if p.dtype}
        assert dtype in seen, (name, seen)
