"""Real kernels on a CPU-only host: libdevice math evaluated on the CPU during capture (scoped to
it), float scalars typed as Triton's JIT types them, and launches through the handle
``kernel.warmup(...)`` returns (``compiled[grid](...)``)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch
import triton
import triton.language as tl
import triton.language.extra.libdevice  # noqa: F401  (tl.extra.libdevice)
from triton.language.extra import libdevice
from triton.language.extra.cuda import libdevice as cuda_libdevice
from triton.language.extra.libdevice import asin, tanh

import kernel_lens as kl
from kernel_lens.errors import CaptureError, UnsupportedKernelError
from kernel_lens.frontends.capture import libdevice_cpu as ld
from kernel_lens.frontends import triton_compat as tc
from kernel_lens.frontends.capture.recorder import InterpretedHandle, capture

ROWS = torch.export.Dim("rows", min=2, max=1024)

# --- libdevice in the interpreter ---------------------------------------------------------------

#: (libdevice function, torch reference) evaluated by _unary_kernel, one output row each
UNARY = [
    ("tanh", torch.tanh), ("asin", torch.asin), ("acos", torch.acos), ("atan", torch.atan),
    ("asinh", torch.asinh), ("atanh", torch.atanh), ("sinh", torch.sinh), ("cosh", torch.cosh),
    ("erf", torch.special.erf), ("erfc", torch.special.erfc), ("erfinv", torch.special.erfinv),
    ("expm1", torch.expm1), ("log1p", torch.log1p), ("lgamma", torch.lgamma),
    ("exp10", lambda x: torch.pow(10.0, x)), ("cbrt", lambda x: x.sign() * x.abs().pow(1 / 3)),
    ("sinpi", lambda x: torch.sin(math.pi * x)), ("j0", torch.special.bessel_j0),
    ("cyl_bessel_i0", torch.special.i0), ("normcdf", torch.special.ndtr), ("rsqrt", torch.rsqrt),
]


@triton.jit
def _unary_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.5)
    # three ways kernels reach libdevice: names imported from the stub module, the stub module
    # itself, and the CUDA module (through tl.extra)
    tl.store(out_ptr + 0 * n + offs, tanh(x), mask=mask)
    tl.store(out_ptr + 1 * n + offs, asin(x), mask=mask)
    tl.store(out_ptr + 2 * n + offs, libdevice.acos(x), mask=mask)
    tl.store(out_ptr + 3 * n + offs, tl.extra.cuda.libdevice.atan(x), mask=mask)
    tl.store(out_ptr + 4 * n + offs, libdevice.asinh(x), mask=mask)
    tl.store(out_ptr + 5 * n + offs, libdevice.atanh(x), mask=mask)
    tl.store(out_ptr + 6 * n + offs, libdevice.sinh(x), mask=mask)
    tl.store(out_ptr + 7 * n + offs, libdevice.cosh(x), mask=mask)
    tl.store(out_ptr + 8 * n + offs, libdevice.erf(x), mask=mask)
    tl.store(out_ptr + 9 * n + offs, libdevice.erfc(x), mask=mask)
    tl.store(out_ptr + 10 * n + offs, libdevice.erfinv(x), mask=mask)
    tl.store(out_ptr + 11 * n + offs, libdevice.expm1(x), mask=mask)
    tl.store(out_ptr + 12 * n + offs, libdevice.log1p(x), mask=mask)
    tl.store(out_ptr + 13 * n + offs, libdevice.lgamma(x), mask=mask)
    tl.store(out_ptr + 14 * n + offs, libdevice.exp10(x), mask=mask)
    tl.store(out_ptr + 15 * n + offs, libdevice.cbrt(x), mask=mask)
    tl.store(out_ptr + 16 * n + offs, libdevice.sinpi(x), mask=mask)
    tl.store(out_ptr + 17 * n + offs, libdevice.j0(x), mask=mask)
    tl.store(out_ptr + 18 * n + offs, libdevice.cyl_bessel_i0(x), mask=mask)
    tl.store(out_ptr + 19 * n + offs, libdevice.normcdf(x), mask=mask)
    tl.store(out_ptr + 20 * n + offs, cuda_libdevice.rsqrt(x), mask=mask)


def _unary(x):
    out = torch.empty(len(UNARY), x.numel())
    _unary_kernel[(1,)](x, out, x.numel(), BLOCK=64)
    return out


def _inputs():
    return torch.linspace(0.05, 0.95, 37)  # inside every function's domain


class _Unary(torch.nn.Module):
    def forward(self, x):
        return _unary(x)


def test_libdevice_calls_match_torch_in_the_interpreter():
    x = _inputs()
    n = torch.export.Dim("n", min=2, max=64)
    result = kl.compile(_Unary(), (x,), dynamic_shapes={"x": {0: n}}, arch=90)
    for row, (name, ref) in enumerate(UNARY):
        expected = ref(x.double()).float()
        torch.testing.assert_close(result.example_outputs[row], expected, rtol=2e-6, atol=1e-6,
                                   msg=f"libdevice.{name}")
    (kernel,) = result.ir.kernels.values()
    assert kernel.binaries[0].ptx  # the same kernel compiles for the GPU afterwards


@triton.jit
def _scalar_kernel(out_ptr, scale, eps, shift: tl.float64):
    # float scalars are typed like Triton's JIT types them: fp32 (``.to()`` works), annotated fp64
    tl.store(out_ptr + 0, asin(scale))
    tl.store(out_ptr + 1, libdevice.tanh(eps.to(tl.float32) * 1000.0))
    tl.store(out_ptr + 2, libdevice.erf(shift).to(tl.float32))
    tl.store(out_ptr + 3, libdevice.pow(scale, 3))  # fp32 ** i32: __nv_powif


def test_libdevice_on_float_scalars_uses_their_triton_types():
    out = torch.zeros(4)
    # (a launch returns its compiled kernel, as Triton's JITFunction.run does: keep ``o``)
    cap = capture(lambda o: (_scalar_kernel[(1,)](o, 0.3, 1e-3, 0.7), o)[1], (out,), 90)
    scale = torch.tensor(0.3, dtype=torch.float32).double()  # rounded to fp32 first, like a GPU
    expected = torch.stack([torch.asin(scale), torch.tanh(torch.tensor(1e-3).double() * 1000),
                            torch.special.erf(torch.tensor(0.7, dtype=torch.float64)),
                            scale ** 3]).float()
    torch.testing.assert_close(cap.outputs, expected, rtol=0, atol=0)


def _lang_state():
    from triton.runtime import interpreter

    modules = [libdevice, cuda_libdevice, tl, tl.core, tl.math]
    state = {(m.__name__, k): v for m in modules for k, v in vars(m).items()}
    state.update({("globals", k): v for k, v in globals().items()})
    state.update({("interpreter", k): v for k, v in vars(interpreter).items()})
    state.update({("builder", k): v for k, v in vars(interpreter.InterpreterBuilder).items()})
    state.update({("tensor", k): v for k, v in vars(tl.core.tensor).items()})
    return state


def _assert_same_state(before):
    from kernel_lens.frontends.capture.recorder import _LibdeviceScope

    assert _LibdeviceScope.active == 0
    after = _lang_state()
    assert after.keys() >= before.keys()
    changed = [k for k, v in before.items() if after[k] is not v]
    assert not changed, f"capture leaked patches: {changed[:10]}"
    added = [k for k in after.keys() - before.keys() if k[0] != "globals"]
    assert not added, f"capture left new attributes: {added[:10]}"


def test_capture_restores_libdevice_and_interpreter_state_exactly():
    before = _lang_state()
    capture(_unary, (_inputs(),), 90)
    _assert_same_state(before)
    # a failing capture restores everything too
    with pytest.raises(CaptureError):
        capture(_no_cpu, (torch.zeros(8),), 90)
    _assert_same_state(before)
    # and nothing leaks into later real compilations: the stubs still map to CUDA libdevice
    assert libdevice.tanh is tanh and tanh(None) is None  # the backend-neutral stub, unpatched
    assert tc.backend_for(90).get_module_map()["triton.language.extra.libdevice"] is cuda_libdevice


@triton.jit
def _no_cuda_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, libdevice.fast_tanhf(tl.load(x_ptr + offs)))


@triton.jit
def _no_cpu_kernel(x_ptr, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, libdevice.jn(2, tl.load(x_ptr + offs)))


def _no_cpu(x):
    _no_cpu_kernel[(1,)](x, BLOCK=x.numel())
    return x


def test_libdevice_function_without_cpu_evaluation_is_a_clear_capture_error():
    with pytest.raises(CaptureError, match=r"kernel _no_cpu_kernel: libdevice\.jn \(__nv_jnf\) "
                                           r"has no CPU evaluation.*capture this model on a GPU"):
        capture(_no_cpu, (torch.zeros(8),), 90)


def test_libdevice_stub_without_cuda_implementation_is_a_clear_error():
    def forward(x):
        _no_cuda_kernel[(1,)](x, BLOCK=x.numel())
        return x

    with pytest.raises(UnsupportedKernelError,
                       match=r"kernel _no_cuda_kernel: libdevice\.fast_tanhf has no CUDA"):
        capture(forward, (torch.zeros(8),), 90)


def test_every_cuda_libdevice_function_is_evaluated_or_listed_as_cpu_less():
    names = {n for n, v in vars(cuda_libdevice).items() if tl.core.is_builtin(v)}
    assert names == set(tc.libdevice_symbols().values())
    table = set(ld._libdevice_table())
    assert names - table == ld.LIBDEVICE_NO_CPU
    with pytest.raises(LookupError):
        ld.libdevice_cpu("jn", [np.int32([2]), np.float32([1.0])], np.float32)


# --- the CPU evaluations themselves -------------------------------------------------------------

def _cuda_signatures():
    """(function, [argument dtypes], result dtype) for every typed overload of CUDA libdevice."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(cuda_libdevice))
    for fn in tree.body:
        if isinstance(fn, ast.FunctionDef):
            table = next(n for n in ast.walk(fn) if isinstance(n, ast.Dict))
            for key, value in zip(table.keys, table.values):
                yield (fn.name, [e.args[0].value for e in key.elts], value.elts[1].args[0].value)


def test_every_cuda_libdevice_overload_evaluates_to_its_result_type():
    from triton.runtime.interpreter import _get_np_dtype

    rng = np.random.default_rng(0)
    count = 0
    for name, arg_types, ret in _cuda_signatures():
        if name in ld.LIBDEVICE_NO_CPU:
            continue
        args = []
        for ty in arg_types:
            dt = _get_np_dtype(tl.str_to_ty(ty, None) if ty.startswith("fp") else getattr(tl, ty))
            values = rng.uniform(0.05, 0.95, 6) if dt.kind == "f" else rng.integers(-50, 50, 6)
            args.append(values.astype(dt))
        out = _get_np_dtype(tl.str_to_ty(ret, None) if ret.startswith("fp") else getattr(tl, ret))
        got = ld.libdevice_cpu(name, args, out)
        assert got.dtype == out and got.shape == (6,), (name, arg_types)
        count += 1
    assert count > 300

def _ld(name, *args, out=np.float32):
    return ld.libdevice_cpu(name, [np.asarray(a) for a in args], np.dtype(out))


def _f32(values):
    return np.array(values, dtype=np.float32)


def test_directed_rounding_brackets_the_exact_result():
    rng = np.random.default_rng(0)
    a, b, c = ((rng.standard_normal(200) * 10.0 ** rng.integers(-3, 4, 200)).astype(np.float32)
               for _ in range(3))
    exact = {
        "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
        "div": lambda x, y: x / y, "fma": None,
    }
    for op, fn in exact.items():
        args = (a, b, c) if op == "fma" else (a, b)
        got = {m: _ld(f"{op}_{m}", *args) for m in ("rn", "rz", "rd", "ru")}
        for i in range(len(a)):
            vals = [Fraction(float(x[i])) for x in args]
            q = vals[0] * vals[1] + vals[2] if op == "fma" else fn(*vals)
            lo, hi = Fraction(float(got["rd"][i])), Fraction(float(got["ru"][i]))
            assert lo <= q <= hi, (op, i)
            assert hi == lo or np.nextafter(got["rd"][i], np.float32(np.inf)) == got["ru"][i]
            assert got["rz"][i] == (got["rd"][i] if q >= 0 else got["ru"][i])
            nearest = min((lo, hi), key=lambda v: abs(v - q))
            assert Fraction(float(got["rn"][i])) == nearest or abs(lo - q) == abs(hi - q), (op, i)
    # sqrt and conversions the same way
    x = np.abs(a)
    assert np.all(_ld("sqrt_rd", x) <= np.sqrt(x.astype(np.float64)))
    assert np.all(_ld("sqrt_ru", x) >= np.sqrt(x.astype(np.float64)))
    big = np.array([2**40 + 1, -(2**40) - 1, 16777217], np.int64)
    assert _ld("ll2float_rd", big).tolist() == [2.0**40, -(2.0**40) - 2**17, 16777216.0]
    assert _ld("ll2float_ru", big).tolist() == [2.0**40 + 2**17, -(2.0**40), 16777218.0]
    assert _ld("double2float_rz", np.float64([1 / 3]))[0] < np.float32(1 / 3)
    # an exactly cancelling sum is -0 only when rounding down
    zero = _ld("add_rd", _f32([1.5]), _f32([-1.5]))
    assert zero[0] == 0 and np.signbit(zero[0])
    assert not np.signbit(_ld("add_rn", _f32([1.5]), _f32([-1.5]))[0])


def test_float_to_int_conversions_round_and_saturate_like_ptx():
    x = _f32([2.5, 3.5, -2.5, -0.5, 1e20, -1e20, np.nan])
    assert _ld("float2int_rn", x, out=np.int32).tolist() == [2, 4, -2, 0, 2**31 - 1, -2**31, 0]
    assert _ld("float2int_rz", x, out=np.int32).tolist() == [2, 3, -2, 0, 2**31 - 1, -2**31, 0]
    assert _ld("float2int_rd", x, out=np.int32).tolist() == [2, 3, -3, -1, 2**31 - 1, -2**31, 0]
    assert _ld("float2int_ru", x, out=np.int32).tolist() == [3, 4, -2, 0, 2**31 - 1, -2**31, 0]
    assert _ld("float2uint_rn", _f32([-3.0, 5e9]), out=np.uint32).tolist() == [0, 2**32 - 1]
    assert _ld("llround", _f32([2.5, -2.5, 0.49999997]), out=np.int64).tolist() == [3, -3, 0]
    assert _ld("round", np.float64([0.49999999999999994, 2.5, -2.5])).tolist() == [0.0, 3.0, -3.0]


def test_integer_and_bit_intrinsics():
    i32 = np.array([1, 0, -1, 256, 0x00F0], np.int32)
    assert _ld("clz", i32, out=np.int32).tolist() == [31, 32, 0, 23, 24]
    assert _ld("ffs", i32, out=np.int32).tolist() == [1, 0, 1, 9, 5]
    assert _ld("popc", i32, out=np.int32).tolist() == [1, 0, 32, 1, 4]
    assert _ld("brev", i32, out=np.int32).tolist() == [-2**31, 0, -1, 1 << 23, 0x0F000000]
    assert _ld("clz", np.array([1], np.int64), out=np.int32).tolist() == [63]
    perm = _ld("byte_perm", np.int32([0x33221100]), np.int32([0x77665544]), np.int32([0x7531]),
               out=np.int32)
    assert perm.view(np.uint32).tolist() == [0x77553311]
    assert _ld("mulhi", np.int64([2**62, -5]), np.int64([8, 2**62]), out=np.int64).tolist() \
        == [2, -2]
    assert _ld("mulhi", np.uint32([2**31]), np.uint32([6]), out=np.uint32).tolist() == [3]
    assert _ld("mul24", np.int32([0x00FFFFFF]), np.int32([2]), out=np.int32).tolist() == [-2]
    assert _ld("hadd", np.int32([2**31 - 1, -3]), np.int32([1, 0]), out=np.int32).tolist() \
        == [2**30, -2]
    assert _ld("rhadd", np.int32([2, -3]), np.int32([1, 0]), out=np.int32).tolist() == [2, -1]
    assert _ld("sad", np.int32([3]), np.int32([10]), np.uint32([5]), out=np.int32).tolist() == [12]
    d = np.float64([1.5])
    hi, lo = _ld("double2hiint", d, out=np.int32), _ld("double2loint", d, out=np.int32)
    assert _ld("hiloint2double", hi, lo, out=np.float64).tolist() == [1.5]
    assert _ld("float_as_int", _f32([1.0]), out=np.int32).tolist() == [0x3F800000]
    assert _ld("int_as_float", np.int32([0x3F800000])).tolist() == [1.0]


def test_special_values():
    assert _ld("ilogb", _f32([8.0, 0.0, np.inf, 1e-40]), out=np.int32).tolist() \
        == [3, -2**31, 2**31 - 1, -133]
    assert _ld("logb", _f32([8.0, 0.0, -np.inf])).tolist() == [3.0, -np.inf, np.inf]
    assert _ld("tgamma", np.float64([0.5, -1.0, 0.0, -0.0, 200.0]), out=np.float64)[[0, 2, 3, 4]] \
        .tolist() == [math.sqrt(math.pi), np.inf, -np.inf, np.inf]
    assert np.isnan(_ld("tgamma", np.float64([-1.0]), out=np.float64)[0])
    assert _ld("sinpi", _f32([1.0, -2.0, 0.5])).tolist() == [0.0, -0.0, 1.0]
    assert _ld("cospi", _f32([0.5, 1.5, 2.0])).tolist() == [0.0, 0.0, 1.0]
    assert _ld("saturatef", _f32([-1.0, 0.25, 3.0, np.nan])).tolist() == [0.0, 0.25, 1.0, 0.0]
    assert _ld("remainder", _f32([5.0, 7.0]), _f32([2.0, 2.0])).tolist() == [1.0, -1.0]
    assert _ld("pow", _f32([-2.0]), np.int32([3])).tolist() == [-8.0]
    assert _ld("signbit", _f32([-0.0, 1.0]), out=np.int32).tolist() == [1, 0]
    fma = _ld("fma", _f32([1 + 2**-23]), _f32([1 - 2**-23]), _f32([-1.0]))
    assert fma.tolist() == [-(2.0**-46)]  # one rounding, not two


# --- launches through kernel.warmup(...) handles -------------------------------------------------

@triton.jit
def _softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, n_rows, n_cols,
                    BLOCK_SIZE: tl.constexpr, num_stages: tl.constexpr):
    row_start = tl.program_id(0)
    row_step = tl.num_programs(0)
    for row_idx in tl.range(row_start, n_rows, row_step, num_stages=num_stages):
        cols = tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        row = tl.load(in_ptr + row_idx * in_stride + cols, mask=mask, other=-float("inf"))
        num = tl.exp(row - tl.max(row, axis=0))
        tl.store(out_ptr + row_idx * out_stride + cols, num / tl.sum(num, axis=0), mask=mask)


class _WarmedSoftmax(torch.nn.Module):
    """Triton's fused-softmax tutorial: warm the kernel up, then launch its compiled handle."""

    def forward(self, x):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        block = triton.next_power_of_2(n_cols)
        kernel = _softmax_kernel.warmup(y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                                        BLOCK_SIZE=block, num_stages=2, num_warps=8, grid=(1,))
        kernel[(n_rows, 1, 1)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, block, 2)
        return y


def test_launch_through_warmup_handle_is_captured_and_traced_on_cpu():
    from triton.compiler.compiler import CompiledKernel

    launcher, handle_run = CompiledKernel.__dict__["run"], InterpretedHandle.__dict__["run"]
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    result = kl.compile(_WarmedSoftmax(), (x,), dynamic_shapes={"x": {0: ROWS}}, arch=90)
    torch.testing.assert_close(result.example_outputs, torch.softmax(x, -1))
    (launch,) = result.ir.launches
    assert launch.grid == ("rows", "1", "1") and tuple(launch.captured_grid) == (6, 1, 1)
    (kernel,) = result.ir.kernels.values()
    assert kernel.name == "_softmax_kernel"
    # the warmup's options and constexprs, num_stages included (a parameter Triton also reads
    # as the compile option, as its JIT does)
    assert (kernel.options.num_warps, kernel.options.num_stages) == (8, 2)
    assert kernel.param("BLOCK_SIZE").constexpr_value == 64
    assert kernel.binaries[0].ptx
    assert CompiledKernel.__dict__["run"] is launcher
    assert InterpretedHandle.__dict__["run"] is handle_run


class _CachedSoftmax(torch.nn.Module):
    """Warms up once and keeps the handle: the trace (and a later compile) only launch it."""

    handle = None

    def forward(self, x):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        if self.handle is None:
            self.handle = _softmax_kernel.warmup(y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                                                 BLOCK_SIZE=64, num_stages=2, num_warps=8,
                                                 grid=(1,))
        self.handle[(n_rows, 1, 1)](y, x, x.stride(0), y.stride(0), n_rows, n_cols, 64, 2)
        return y


def test_a_kept_warmup_handle_is_launched_in_trace_and_later_compiles():
    model = _CachedSoftmax()
    x = torch.randn(6, 40, generator=torch.Generator().manual_seed(0))
    for _ in range(2):
        result = kl.compile(model, (x,), dynamic_shapes={"x": {0: ROWS}}, arch=90)
        torch.testing.assert_close(result.example_outputs, torch.softmax(x, -1))
        (launch,) = result.ir.launches
        assert launch.grid == ("rows", "1", "1")
        (kernel,) = result.ir.kernels.values()
        assert (kernel.options.num_warps, kernel.options.num_stages) == (8, 2)


def test_warmup_handle_misuse_on_cpu_is_a_clear_capture_error():
    def binary_attributes(x):
        kernel = _softmax_kernel.warmup(x, x, 1, 1, 1, 1, BLOCK_SIZE=8, num_stages=1, grid=(1,))
        return kernel.n_regs

    with pytest.raises(CaptureError, match=r"_softmax_kernel: .*no 'n_regs' on a CPU-only host"):
        capture(binary_attributes, (torch.zeros(8),), 90)

    def wrong_arity(x):
        kernel = _softmax_kernel.warmup(x, x, 1, 1, 1, 1, BLOCK_SIZE=8, num_stages=1, grid=(1,))
        kernel[(1, 1, 1)](x, x, 1, 1, 1, 1)
        return x

    with pytest.raises(CaptureError, match=r"launched with 6 arguments but the kernel has 8"):
        capture(wrong_arity, (torch.zeros(8),), 90)


def test_launch_through_a_compiled_kernel_built_before_capture():
    """A CompiledKernel compiled outside the forward (here ahead of time for sm_90, as a GPU
    warmup would) and launched through its ``run`` inside it: its kernel, constexprs and options
    are read off Triton's record of the compilation."""
    from triton.compiler import ASTSource

    names = [p.name for p in _softmax_kernel.params]
    signature = {n: ty for n, ty in zip(names, ["*fp32", "*fp32", "i32", "i32", "i32", "i32",
                                                 "constexpr", "constexpr"])}
    aligned = [["tt.divisibility", 16]]  # what Triton's JIT assumes of 16-byte aligned tensors
    src = ASTSource(_softmax_kernel, signature, {(6,): 64, (7,): 2}, {(0,): aligned, (1,): aligned})
    handle = triton.compile(src, target=tc.target_for(90),
                            options={"num_warps": 8, "num_stages": 2})

    class Prewarmed(torch.nn.Module):
        def forward(self, x):
            y = torch.empty_like(x)
            n_rows, n_cols = x.shape
            handle.run(n_rows, 1, 1, None, None, None, None, None, None,  # the launcher's call
                       y, x, x.stride(0), y.stride(0), n_rows, n_cols, 64, 2)
            return y

    x = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    result = kl.compile(Prewarmed(), (x,), dynamic_shapes={"x": {0: ROWS}}, arch=90)
    torch.testing.assert_close(result.example_outputs, torch.softmax(x, -1))
    (launch,) = result.ir.launches
    assert launch.grid == ("rows", "1", "1")
    (kernel,) = result.ir.kernels.values()
    assert (kernel.options.num_warps, kernel.options.num_stages) == (8, 2)
    assert kernel.param("BLOCK_SIZE").constexpr_value == 64
    assert kernel.binaries[0].ptx == handle.asm["ptx"]  # the same binary as the handle's


class _NoModuleCallable:
    """A callable whose ``__module__`` cannot be read (proxies and lazy objects do this)."""

    def __call__(self):
        return None

    def __getattribute__(self, name):
        if name == "__module__":
            raise AttributeError(name)
        return object.__getattribute__(self, name)


_odd_global = _NoModuleCallable()  # in this kernel module's globals, beside libdevice's names


@triton.jit
def _tanh_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tanh(tl.load(x_ptr + offs, mask=offs < n)), mask=offs < n)


def test_libdevice_is_mapped_in_a_kernel_module_holding_a_callable_without_a_module():
    def model(x):
        out = torch.empty_like(x)
        _tanh_kernel[(1,)](x, out, x.numel(), BLOCK=16)
        return out

    x = torch.linspace(-2, 2, 16)
    got = capture(model, (x,), 90).outputs
    assert torch.allclose(got, torch.tanh(x), atol=1e-6)
