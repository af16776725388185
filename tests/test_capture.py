"""Launch capture on a CPU-only host: interpreter, autotune, heuristics, kernel identity."""

from __future__ import annotations

import os

import pytest

import kernel_lens as kl
from kernel_lens.errors import CaptureError, InputError
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


@pytest.mark.parametrize("api", ["compile", "lift"])
def test_python_api_refuses_an_override_that_would_be_ignored(api):
    """An override naming a kernel the model does not launch, or one that is not autotuned,
    would change nothing: the Python API refuses it as the CLI does, listing the kernels."""
    m = load_module(CORPUS / "autotune.py")
    call = kl.compile if api == "compile" else kl.lift
    with pytest.raises(InputError, match=r"'scaled_add_kernal', which the model does not launch; "
                                         r"its kernels: scaled_add_kernel; autotuned: scaled_add_kernel"):
        call(m.model, tuple(t.clone() for t in m.example_inputs), arch=90,
             autotune={"scaled_add_kernal": {"BLOCK_SIZE": 128}})
    helper = load_module(CORPUS / "helper_call.py")
    (name,) = {k.name for k in kl.lift(helper.model, tuple(helper.example_inputs), arch=90).kernels.values()}
    with pytest.raises(InputError, match=rf"'{name}', which is not autotuned"):
        call(helper.model, tuple(t.clone() for t in helper.example_inputs), arch=90,
             autotune={name: {"BLOCK": 1}})


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


# --- scalar kinds ------------------------------------------------------------------------------
import math  # noqa: E402

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from kernel_lens.frontends.capture.recorder import capture  # noqa: E402
from kernel_lens.frontends.arguments import kernel_params  # noqa: E402
from kernel_lens.ir import DType, ParamKind  # noqa: E402


def test_every_scalar_kind_is_typed_like_tritons_jit_and_keeps_its_value():
    m, c = _compile("scalar_kinds")
    (kernel,) = c.ir.kernels.values()
    dtypes = {p.name: p.dtype for p in kernel.params if p.kind == ParamKind.scalar}
    assert dtypes == {
        "n": DType.i32, "flag": DType.i1, "off": DType.i1, "big": DType.i64, "neg_big": DType.i64,
        "int_min": DType.i64, "huge": DType.u64, "small_u": DType.u32, "scale": DType.fp32,
        "shift": DType.fp64, "pos_inf": DType.fp32, "neg_inf": DType.fp32, "nan": DType.fp32,
    }
    (launch,) = c.ir.launches
    args = {a.name: a for a in launch.args}
    assert args["n"].expr == "n"
    ints = {"big": m.BIG, "neg_big": m.NEG_BIG, "int_min": -2**63, "small_u": m.SMALL_U, "huge": m.HUGE}
    for name, value in ints.items():  # int64-range ints are exact int expressions; u64 a constant
        got = args[name].constant if args[name].expr is None else int(args[name].expr)
        assert got == value and type(got) is int, name
    assert args["flag"].constant is True and args["off"].constant is False
    assert args["scale"].constant == m.SCALE and args["shift"].constant == m.SHIFT
    assert args["pos_inf"].constant == math.inf and args["neg_inf"].constant == -math.inf
    assert math.isnan(args["nan"].constant)
    abi = {a.name: a.c_type for a in kernel.binaries[0].abi}
    assert (abi["scale"], abi["shift"], abi["huge"], abi["small_u"], abi["flag"]) == \
        ("float", "double", "uint64_t", "uint32_t", "bool")
    # the interpreter saw fp32-rounded scale, fp64 shift, exact ints, inf and nan (tolerance 0)
    torch.testing.assert_close(c.example_outputs, m.reference(*m.example_inputs), rtol=0, atol=0)


def test_scalar_kinds_emit_exact_cxx_literals_and_abi_types():
    from kernel_lens.targets.common.emit import c_scalar, render_launches

    assert c_scalar(2**63 + 5) == "UINT64_C(9223372036854775813)"
    assert c_scalar(2**64 - 1) == "UINT64_C(18446744073709551615)"
    assert "9223372036854775808" not in c_scalar(-2**63)
    assert c_scalar(-3_000_000_123) == "(-INT64_C(3000000123))" and c_scalar(-7) == "-7"
    assert (c_scalar(math.inf), c_scalar(-math.inf), c_scalar(math.nan)) == ("INFINITY", "-INFINITY", "NAN")
    with pytest.raises(kl.errors.UnsupportedKernelError, match="2\\*\\*64"):
        c_scalar(2**64)
    _, c = _compile("scalar_kinds")
    text = render_launches(c.ir)
    for line in ("const uint64_t v_huge = UINT64_C(9223372036854775813);",
                 "const int64_t v_int_min = (-INT64_C(9223372036854775807) - INT64_C(1));",
                 "const double v_nan = NAN;", "const double v_neg_inf = -INFINITY;",
                 "const bool v_flag = true;",
                 "float a0_scale = static_cast<float>(v_scale);",
                 "float a0_nan = static_cast<float>(v_nan);",
                 "double a0_shift = static_cast<double>(v_shift);",
                 "uint64_t a0_huge = static_cast<uint64_t>(v_huge);",
                 "uint32_t a0_small_u = static_cast<uint32_t>(v_small_u);"):
        assert line in text, line


@triton.jit
def _typed_kernel(x_ptr, out_ptr, eps, wide: tl.float64, count: tl.uint32, on: tl.int1, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs)
    y = x + eps.to(tl.float32) + wide.to(tl.float32) + count.to(tl.float32)  # Liger RMSNorm: eps.to()
    tl.store(out_ptr + offs, tl.where(on, y, x))


def _run_typed(x, *scalars):
    out = torch.empty_like(x)
    _typed_kernel[(1,)](x, out, *scalars, BLOCK=x.numel())
    return out


def test_float_and_annotated_scalars_are_typed_scalars_in_the_interpreter():
    x = torch.arange(8, dtype=torch.float32)
    cap = capture(lambda t: _run_typed(t, 0.1, 0.25, 3_000_000_000, True), (x,), 90)
    (launch,) = cap.launches
    params, _ = kernel_params(launch.jit, "_typed_kernel", launch.params, launch.specialization, [])
    assert {p.name: p.dtype for p in params if p.kind == ParamKind.scalar} == \
        {"eps": DType.fp32, "wide": DType.fp64, "count": DType.u32, "on": DType.i1}
    expected = x + torch.tensor(0.1, dtype=torch.float32) + 0.25 + 3e9
    torch.testing.assert_close(cap.outputs, expected, rtol=0, atol=0)
    assert launch.params["eps"] == 0.1 and type(launch.params["count"]) is int  # raw values kept


def test_out_of_range_scalars_raise_capture_error_naming_kernel_and_argument():
    x = torch.zeros(8)
    with pytest.raises(CaptureError, match=r"_typed_kernel.*'count' = -1.*u32"):
        capture(lambda t: _run_typed(t, 0.1, 0.25, -1, True), (x,), 90)
    with pytest.raises(CaptureError, match=r"_typed_kernel.*'count' = 18446744073709551616"):
        capture(lambda t: _run_typed(t, 0.1, 0.25, 2**64, True), (x,), 90)


@triton.jit
def _broken_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, tl.no_such_op(offs), mask=offs < n)


def test_interpreter_failure_is_a_capture_error_and_patches_are_restored():
    from triton.runtime import interpreter

    run, call, patch = tc.JITFunction.run, tc.JITFunction.__call__, interpreter._patch_lang_tensor

    def forward(x):
        _broken_kernel[(1,)](x, x.numel(), BLOCK=8)
        return x

    with pytest.raises(CaptureError, match=r"kernel _broken_kernel at .*test_capture.py:\d+: .*AttributeError.*no_such_op.*the kernel line named raised it") as info:
        capture(forward, (torch.zeros(8),), 90)
    assert not isinstance(info.value, interpreter.InterpreterError)
    assert tc.JITFunction.run is run and tc.JITFunction.__call__ is call
    assert interpreter._patch_lang_tensor is patch


def test_an_override_keyed_by_the_ir_id_is_refused_naming_the_python_name():
    """Kernel ids (``name_<digest>`` when a kernel has several specializations) are the IR's;
    capture picks configs by the kernel's Python name, so an id would be dropped without a word."""
    m = load_module(CORPUS / "autotune.py")

    class Twice(torch.nn.Module):
        def forward(self, x, y):
            out = torch.empty_like(x)
            grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK_SIZE"]),)
            m.scaled_add_kernel[grid](x, y, out, 2.0, x.numel())  # n divisible by 16
            m.scaled_add_kernel[grid](x[1:], y[1:], out[1:], 2.0, x.numel() - 1)  # not: another binary
            return out

    inputs = (torch.randn(64), torch.randn(64))
    ids = sorted(kl.lift(Twice(), inputs, arch=90).kernels)
    assert len(ids) == 2 and all(i.startswith("scaled_add_kernel_") for i in ids)
    config = m.scaled_add_kernel.configs[0].kwargs
    with pytest.raises(InputError, match=r"by its IR id; name it by its Python name 'scaled_add_kernel'"):
        kl.lift(Twice(), inputs, arch=90, autotune={ids[0]: config})
    ir = kl.lift(Twice(), inputs, arch=90, autotune={"scaled_add_kernel": config})
    assert all(k.options.autotune_choice == "user" for k in ir.kernels.values())


def test_an_autotune_config_pre_hook_is_kept_in_the_graph():
    """autotune_features' count_kernel config has a pre_hook zeroing its counter (the model fills
    it with 7 first): the zeroing is traced into the graph before the launch, so the deployed
    model counts from 0 (without it the output would be 7 too high)."""
    m = load_module(CORPUS / "autotune_features.py")
    ir = kl.lift(m.model, tuple(t.clone() for t in m.example_inputs),
                 dynamic_shapes=m.dynamic_shapes, arch=90)
    launch = next(l for l in ir.launches if ir.kernels[l.kernel].name == "count_kernel")
    counter = next(a.value for a in launch.args if a.name == "count_ptr")
    writes = [op for op in ir.ops if op.order < launch.order and counter in op.outputs + op.aliases
              and op.op.startswith(("aten.zero", "aten.fill"))]
    assert writes, [(op.order, op.op, op.outputs) for op in ir.ops]
    fill = next(op for op in ir.ops if op.op.startswith("aten.full") and op.order < writes[0].order)
    assert fill is not None


def test_autotune_overrides_apply_to_every_kernel_of_that_name_across_modules(tmp_path):
    """Two modules each define an autotuned ``scale_kernel``: an override by name picks the config
    for both (and one that matches only one kernel's configs is refused naming it)."""
    import importlib
    import sys

    body = ('import triton, triton.language as tl\n'
            '@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": {b}})], key=["n"])\n'
            '@triton.jit\n'
            'def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n'
            '    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n'
            '    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * {f}, mask=offs < n)\n')
    (tmp_path / "_tune_a.py").write_text(body.replace("{b}", "64").replace("{f}", "2.0"))
    (tmp_path / "_tune_b.py").write_text(body.replace("{b}", "128").replace("{f}", "3.0"))
    sys.path.insert(0, str(tmp_path))
    try:
        a, b = importlib.import_module("_tune_a"), importlib.import_module("_tune_b")

        class Both(torch.nn.Module):
            def forward(self, x):
                y, z = torch.empty_like(x), torch.empty_like(x)
                grid = lambda meta: (triton.cdiv(x.numel(), meta["BLOCK"]),)
                a.scale_kernel[grid](x, y, x.numel())
                b.scale_kernel[grid](x, z, x.numel())
                return y, z

        ir = kl.lift(Both(), (torch.randn(100),), arch=90, autotune={"scale_kernel": {"BLOCK": 32}})
        kernels = sorted(ir.kernels.values(), key=lambda k: k.source.qualname)
        assert [k.source.qualname for k in kernels] == ["_tune_a.scale_kernel", "_tune_b.scale_kernel"]
        assert all(k.options.autotune_choice == "user" and k.param("BLOCK").constexpr_value == 32
                   for k in kernels)
        with pytest.raises(CaptureError, match=r"kernel scale_kernel: autotune override \{'BLOCK': 64\} "
                                               r"matches none of its configs"):
            kl.lift(Both(), (torch.randn(100),), arch=90, autotune={"scale_kernel": {"BLOCK": 64}})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("_tune_a", None)
        sys.modules.pop("_tune_b", None)
