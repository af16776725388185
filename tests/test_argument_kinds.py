"""Every argument kind Triton 3.6's JIT binder accepts, lifted into the IR and rebuilt into the
signature Triton's compiler takes: ``tl.dtype`` and ``tl.constexpr(...)`` values, @triton.jit
functions as constexprs, tuples and named tuples (nested, of tensors, ints, floats, None and
constexprs), host tensor descriptors (TMA), ``do_not_specialize``; and one-line refusals of what
the binder itself refuses. The corpus models ``arg_*`` run each kind (their interpreter outputs,
roles, grids and generated launches are checked by test_corpus and test_launch_sweep)."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

import kernel_lens as kl
from kernel_lens.errors import CompilationError, UnsupportedKernelError
from kernel_lens.frontends import arguments
from kernel_lens.frontends.aot import jit_resolver, signature_for
from kernel_lens.ir import DTypeValue, GraphIR, JitValue, ParamKind, TupleValue
from kernel_lens.summary import summarize

from conftest import CORPUS, load_module


def _compiled(stem: str):
    module = load_module(CORPUS / f"{stem}.py")
    inputs = tuple(t.clone() for t in module.example_inputs)
    return module, kl.compile(module.model, inputs, dynamic_shapes=module.dynamic_shapes, arch=90)


@pytest.fixture(scope="module")
def tuples():
    return _compiled("arg_tuples")


def test_tuple_parameters_are_trees_with_unique_leaf_names(tuples):
    _, c = tuples
    (kernel,) = c.ir.kernels.values()
    by_name = {p.name: p for p in kernel.params}
    assert [p.kind for p in by_name["ptrs"].items] == [ParamKind.tensor] * 3
    assert [p.name for p in by_name["ptrs"].items] == ["ptrs_0", "ptrs_1", "ptrs_2"]
    assert [q.name for p in by_name["strides"].items for q in p.items] == \
        ["strides_0_0", "strides_0_1", "strides_1_0", "strides_1_1"]
    extra = by_name["extra"].items
    assert extra[0].kind == ParamKind.scalar and extra[0].dtype.value == "fp32"
    assert (extra[1].kind, extra[1].constexpr_value) == (ParamKind.constexpr, None)
    assert (extra[2].kind, extra[2].constexpr_value) == (ParamKind.constexpr, 2.0)  # tl.constexpr(2.0)
    named = by_name["out_strides"]
    assert (named.fields, named.type_name) == (["row", "col"], "Strides")
    assert by_name["nothing"].kind == ParamKind.tuple and by_name["nothing"].items == []
    leaves = [p.name for p in kernel.leaves()]
    assert [a.name for a in c.ir.launches[0].args] == leaves and len(set(leaves)) == len(leaves)
    # yt = y.t() has stride 1 along dim 0 and x stride 1 along dim 1, for every size: Triton folds
    # them, and the specialization pass proves it for every binary (the generic one is for
    # unaligned input pointers)
    assert kernel.specialization["strides_1_0"].equal_to_1 and kernel.specialization["strides_0_1"].equal_to_1
    for binary in kernel.binaries:
        assert {"strides_1_0", "strides_0_1"}.isdisjoint(a.name for a in binary.abi)
        assert {"strides_0_0", "strides_1_1"} <= {a.name for a in binary.abi}
        assert binary.assumptions["strides_1_0"].equal_to_1
    assert {p.name: p.role.value for p in kernel.leaves() if p.binds_tensor} == \
        {"ptrs_0": "input", "ptrs_1": "input", "ptrs_2": "output"}


def test_ir_with_every_kind_round_trips_through_json(tuples):
    for stem in ("arg_tuples", "arg_dtype_constexpr", "arg_jit_function", "arg_misc_kinds",
                 "arg_tensor_descriptor"):
        ir = tuples[1].ir if stem == "arg_tuples" else _compiled(stem)[1].ir
        assert GraphIR.from_json(ir.to_json()) == ir, stem


def test_rebuilt_signature_is_the_binders_and_a_wrong_ir_is_caught(tuples):
    module, c = tuples
    (kernel,) = c.ir.kernels.values()
    spec, bound, _ = signature_for(kernel, kernel.specialization)
    assert spec[0] == (("*fp32", "*fp32", "*fp32"), ("D", "", "D")) or spec[0][0] == ("*fp32",) * 3
    assert type(spec[4][0]).__name__ == "Strides" and spec[4][0]._fields == ("row", "col")
    assert spec[5] == ((), ())
    assert bound["extra"][2] == 2.0 and bound["extra"][1] is None
    broken = kernel.model_copy(deep=True)
    broken.params[2].items[0].dtype = broken.params[2].items[0].dtype.__class__("i64")
    captured = signature_for(kernel, kernel.specialization)[0]
    with pytest.raises(CompilationError, match="parameter 'shape' rebuilds as type.*please report"):
        arguments.check_round_trip(broken, captured, jit_resolver(broken))


def test_dtype_constexprs_are_data_and_print_as_triton_dtypes():
    _, c = _compiled("arg_dtype_constexpr")
    kernels = {k.id: k for k in c.ir.kernels.values()}
    outs = sorted(k.param("OUT_DTYPE").constexpr_value.dtype for k in kernels.values()
                  if k.name == "scale_cast_kernel")
    assert outs == ["bf16", "fp16", "fp8e4nv"]
    (sums,) = [k for k in kernels.values() if k.name == "sum_rows_kernel"]
    assert sums.param("acc_dtype").constexpr_value == DTypeValue(dtype="fp64")  # tl.constexpr(tl.float64)
    assert "tl.dtype('fp8e4nv')" in summarize(c.ir)


def test_jit_functions_passed_as_constexprs_are_helpers_of_the_kernel():
    _, c = _compiled("arg_jit_function")
    kernels = sorted(c.ir.kernels.values(), key=lambda k: k.id)
    assert len(kernels) == 2  # two activations: two specializations
    for k in kernels:
        act, post = k.param("ACT").constexpr_value, k.param("post").constexpr_value
        assert isinstance(act, JitValue) and isinstance(post, JitValue)
        helpers = {h.qualname for h in k.helpers}
        assert {act.jit, post.jit} <= helpers
        assert {"arg_jit_function._sigmoid"} <= helpers  # what silu calls


def test_none_strings_globals_and_do_not_specialize():
    _, c = _compiled("arg_misc_kinds")
    first, second = (c.ir.kernels[l.kernel] for l in c.ir.launches)
    assert first.param("MODE").constexpr_value == "relu" and second.param("MODE").constexpr_value == "square"
    assert first.param("residual_ptr").kind == ParamKind.constexpr  # None
    assert second.param("bias_ptr").kind == ParamKind.constexpr
    assert first.param("shift").constexpr_value == 3  # tl.constexpr(3) to an unannotated parameter
    for k in (first, second):  # do_not_specialize: no divisibility or folding; no alignment
        assert not k.specialization["n"].divisible16
        assert k.param("one").kind == ParamKind.scalar and not k.specialization["one"].equal_to_1
        assert not k.specialization["x_ptr"].aligned16


def test_tensor_descriptors_lift_with_their_shapes_and_tma_abi():
    _, c = _compiled("arg_tensor_descriptor")
    (kernel,) = c.ir.kernels.values()
    x = kernel.param("x_desc")
    assert (x.kind, x.dtype.value, x.block_shape, x.role.value) == (ParamKind.tensordesc, "fp32", [16, 32], "input")
    args = {a.name: a for a in c.ir.launches[0].args}
    assert args["x_desc"].desc_shape == ["rows", "64"] and args["x_desc"].desc_strides == ["64", "1"]
    assert (args["x_desc"].constant, args["y_desc"].constant) == ("zero", "nan")
    for binary in kernel.binaries:  # sm_90: Triton lowers both to TMA
        assert [m.block_size for m in binary.tensordesc_meta] == [[16, 32], [16, 32]]
        parts = [(a.name, a.part, a.c_type, a.dim) for a in binary.abi if a.name == "x_desc"]
        assert parts == [("x_desc", "tma", "CUtensorMap", None), ("x_desc", "shape", "int32_t", 0),
                         ("x_desc", "shape", "int32_t", 1), ("x_desc", "stride", "int64_t", 0),
                         ("x_desc", "stride", "int64_t", 1)]


@triton.jit
def _copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr, DT: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n).to(DT), mask=offs < n)


class _Launch(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.kwargs = kwargs

    def forward(self, x):
        out = torch.empty_like(x)
        _copy[(1,)](x, out, **{"n": x.numel(), "BLOCK": 16, "DT": tl.float32, **self.kwargs})
        return out


@pytest.mark.parametrize("kwargs, match", [
    ({"DT": tl.pointer_type(tl.float32)}, r"argument 'DT': constexpr .* pointer_type"),
    # tl.constexpr(...) handed to an unannotated parameter: the same refusal, naming it
    ({"n": tl.constexpr(tl.pointer_type(tl.float32))}, r"argument 'n': constexpr .* pointer_type"),
    ({"n": (16, [1])}, r"argument 'n\[1\]' of type list: .*tuples, not lists"),
    ({"n": "16"}, r"argument 'n' of type str: .*only for tl.constexpr parameters"),
    ({"n": tl.float32}, r"argument 'n' of type dtype: .*only for a tl.constexpr parameter"),
])
def test_what_tritons_binder_refuses_is_one_line_naming_kernel_and_argument(kwargs, match):
    with pytest.raises(UnsupportedKernelError, match=match) as info:
        kl.lift(_Launch(**kwargs), (torch.randn(16),), arch=90)
    assert "\n" not in str(info.value) and "kernel _copy" in str(info.value)


def test_constexpr_values_convert_both_ways():
    resolve = {"tests.x": _copy}.get
    from collections import namedtuple
    Pair = namedtuple("Pair", ["a", "b"])
    value = (tl.float16, tl.constexpr(3), Pair(None, "s"), _copy)
    ir_value = arguments.constexpr_to_ir(value, "here")
    assert isinstance(ir_value, TupleValue) and ir_value.items[0] == DTypeValue(dtype="fp16")
    assert ir_value.items[2].fields == ["a", "b"] and ir_value.items[3] == JitValue(jit=arguments.qualname_of(_copy))
    back = arguments.constexpr_from_ir(ir_value, lambda q: _copy)
    assert back[0] == tl.float16 and back[1] == 3 and back[2].b == "s" and back[2]._fields == ("a", "b")
    assert back[3] is _copy and resolve("tests.x") is _copy


@triton.jit
def _read_ints(p_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(p_ptr + offs, mask=offs < n), mask=offs < n)


class _PointerTable(torch.nn.Module):
    """Tensor addresses computed into a tensor, as flashnn's callers build its logits processor's
    table of row pointers (here the kernel only copies the numbers)."""

    def forward(self, x):
        rows = torch.arange(x.shape[0], device=x.device)
        table = x.data_ptr() + rows * (x.stride(0) * x.element_size())
        out = torch.empty_like(table)
        _read_ints[(1,)](table, out, x.shape[0], BLOCK=64)
        return out


def test_tensor_addresses_computed_into_a_tensor_are_refused():
    with pytest.raises(UnsupportedKernelError, match=r"tensor's address \(data_ptr\(\)\).*pass the tensors") as info:
        kl.lift(_PointerTable(), (torch.randn(6, 4),), arch=90,
                dynamic_shapes=({0: torch.export.Dim("rows", min=2, max=64)},))
    assert "\n" not in str(info.value)


# ---- launch options: launch_pdl, launch_cooperative_grid (corpus model arg_launch_attrs) -----------
def test_launch_options_reach_every_binary_and_a_binary_disagreeing_is_refused():
    _, c = _compiled("arg_launch_attrs")
    kernels = c.ir.kernels
    assert {k.name: {f: k.options.extra.get(f) for f in ("launch_pdl", "launch_cooperative_grid")}
            for k in kernels.values()} == {"affine_kernel": {"launch_pdl": True, "launch_cooperative_grid": None},
                                           "mul_kernel": {"launch_pdl": None, "launch_cooperative_grid": True}}
    for kernel in kernels.values():
        assert kernel.binaries
        for b in kernel.binaries:
            assert (b.launch_pdl, b.launch_cooperative_grid) == \
                ((True, False) if kernel.name == "affine_kernel" else (False, True))
    shown = summarize(c.ir)  # dump-ir's text names the options of each kernel
    assert "num_ctas=1 launch_pdl=True\n" in shown and "num_ctas=1 launch_cooperative_grid=True\n" in shown
    doc = c.ir.model_dump(mode="json")
    affine = next(k for k in doc["kernels"].values() if k["name"] == "affine_kernel")
    affine["binaries"][0]["launch_pdl"] = False  # e.g. an IR written before the field existed
    with pytest.raises(ValueError, match=r"affine_kernel binary 0: launch_pdl=False but the kernel was "
                                         r"compiled with launch_pdl=True"):
        GraphIR.model_validate(doc)


@triton.jit
def _gdc_by_attribute(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    tl.extra.cuda.gdc_wait()
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    tl.extra.cuda.gdc_launch_dependents()
    tl.store(out_ptr + offs, x + 1.0, mask=offs < n)


@triton.jit
def _other_asm(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n)
    seven = tl.inline_asm_elementwise("mov.u32 $0, 7;", "=r", [], dtype=tl.int32, is_pure=True, pack=1)
    tl.store(out_ptr + offs, x + seven.to(tl.float32), mask=offs < n)


class _OneKernel(torch.nn.Module):
    def __init__(self, kernel):
        super().__init__()
        self.kernel = kernel

    def forward(self, x):
        out = torch.empty_like(x)
        self.kernel[(1,)](x, out, x.numel(), BLOCK=64, launch_pdl=True)
        return out


def test_grid_dependency_control_runs_as_nothing_on_the_cpu_and_other_assembly_is_refused():
    """Triton's interpreter runs no inline assembly; kernel_lens runs gdc_wait/launch_dependents
    (called as ``tl.extra.cuda.*`` here; imported by name in the corpus model) as nothing, since
    launches run one after another there, and names any other assembly and the way out."""
    x = torch.randn(50)
    c = kl.compile(_OneKernel(_gdc_by_attribute), (x,), arch=90)
    assert torch.equal(c.run(x), x + 1.0)  # the artifact evaluated on the CPU
    (kernel,) = c.ir.kernels.values()
    assert all(b.launch_pdl for b in kernel.binaries) and "griddepcontrol.wait" in kernel.binaries[0].ptx
    with pytest.raises(UnsupportedKernelError, match=r"inline assembly 'mov.u32 \$0, 7;' cannot run in "
                                                     r"Triton's interpreter on the CPU: capture this model "
                                                     r"on a GPU") as info:
        kl.compile(_OneKernel(_other_asm), (x,), arch=90)
    assert "\n" not in str(info.value)
