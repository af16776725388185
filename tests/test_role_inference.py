"""Role inference on kernel sources held in the IR (no Triton needed)."""

from __future__ import annotations

import textwrap

import pytest

from kernel_lens.errors import RoleInferenceError
from kernel_lens.ir import DType, KernelIR, KernelParam, ParamKind, Role, SourceInfo
from kernel_lens.passes import infer_roles

TL = {"tl": "triton.language"}


def _source(text: str, qualname: str = "m.kernel", callees: dict | None = None) -> SourceInfo:
    return SourceInfo(qualname=qualname, file="m.py", line=1, source_hash=qualname,
                      text=textwrap.dedent(text), callees={**TL, **(callees or {})})


def _kernel(text: str, tensors: list[str], helpers: list[SourceInfo] = (),
            callees: dict | None = None, overrides: dict | None = None) -> KernelIR:
    params = []
    for i, name in enumerate(tensors):
        p = KernelParam(name=name, index=i, kind=ParamKind.tensor, dtype=DType.fp32)
        if overrides and name in overrides:
            p.role, p.role_source = Role(overrides[name]), "override"
        params.append(p)
    params.append(KernelParam(name="n", index=len(params), kind=ParamKind.scalar, dtype=DType.i32))
    return KernelIR(id="kernel", name="kernel", source=_source(text, callees=callees),
                    helpers=list(helpers), params=params)


def roles(k: KernelIR) -> dict[str, str]:
    return {n: r.value for n, r in infer_roles(k).items()}


def test_load_store_through_assignments_and_loops():
    k = _kernel("""
        def kernel(x_ptr, acc_ptr, out_ptr, n):
            offs = tl.arange(0, 16)
            p = x_ptr + offs
            acc = tl.zeros([16], dtype=tl.float32)
            for i in range(0, n, 16):
                acc += tl.load(p, mask=offs < n)
                p += 16
            a = acc_ptr
            tl.store(a + offs, tl.load(a + offs) + acc)
            tl.store(out_ptr + offs, acc)
        """, ["x_ptr", "acc_ptr", "out_ptr"])
    assert roles(k) == {"x_ptr": "input", "acc_ptr": "inplace", "out_ptr": "output"}


def test_loop_carried_pointer_reaches_fixed_point():
    # q only points into y_ptr after the first iteration: needs the loop fixed point.
    k = _kernel("""
        def kernel(x_ptr, y_ptr, n):
            p = x_ptr
            q = x_ptr
            for i in range(n):
                tl.store(q, tl.load(p))
                q = p
                p = y_ptr
        """, ["x_ptr", "y_ptr"])
    assert roles(k) == {"x_ptr": "inplace", "y_ptr": "inplace"}


def test_flow_sensitive_reassignment_is_not_a_write():
    k = _kernel("""
        def kernel(x_ptr, out_ptr, n):
            p = x_ptr
            v = tl.load(p)
            p = out_ptr
            tl.store(p, v)
        """, ["x_ptr", "out_ptr"])
    assert roles(k) == {"x_ptr": "input", "out_ptr": "output"}


def test_branches_join():
    k = _kernel("""
        def kernel(x_ptr, y_ptr, out_ptr, n):
            if n > 4:
                p = x_ptr
            else:
                p = y_ptr
            tl.store(out_ptr, tl.load(p))
        """, ["x_ptr", "y_ptr", "out_ptr"])
    assert roles(k) == {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output"}


def test_helpers_bind_parameters_per_call_site():
    helper = _source("""
        def copy(src, dst, offs):
            tl.store(dst + offs, tl.load(src + offs))
        """, qualname="m.copy")
    ptr_helper = _source("""
        def row(base, i):
            return base + i * 16
        """, qualname="m.row")
    k = _kernel("""
        def kernel(a_ptr, b_ptr, c_ptr, n):
            offs = tl.arange(0, 16)
            copy(a_ptr, b_ptr, offs)
            copy(src=c_ptr, dst=row(c_ptr, 1), offs=offs)
        """, ["a_ptr", "b_ptr", "c_ptr"], helpers=[helper, ptr_helper],
        callees={"copy": "jit:m.copy", "row": "jit:m.row"})
    assert roles(k) == {"a_ptr": "input", "b_ptr": "output", "c_ptr": "inplace"}


def test_block_pointers_and_atomics():
    k = _kernel("""
        def kernel(a_ptr, c_ptr, cnt_ptr, n):
            bp = tl.make_block_ptr(base=a_ptr, shape=(n, n), strides=(n, 1), offsets=(0, 0),
                                   block_shape=(16, 16), order=(1, 0))
            acc = tl.zeros((16, 16), dtype=tl.float32)
            for k in range(0, n, 16):
                acc += tl.load(bp, boundary_check=(0, 1))
                bp = tl.advance(bp, (0, 16))
            cp = tl.make_block_ptr(c_ptr, (n, n), (n, 1), (0, 0), (16, 16), (1, 0))
            tl.store(cp, acc, boundary_check=(0, 1))
            tl.atomic_add(cnt_ptr, 1)
        """, ["a_ptr", "c_ptr", "cnt_ptr"])
    assert roles(k) == {"a_ptr": "input", "c_ptr": "output", "cnt_ptr": "inplace"}


def test_unused_pointer_is_input_and_kwargs_forms():
    k = _kernel("""
        def kernel(x_ptr, unused_ptr, out_ptr, n):
            tl.store(pointer=out_ptr, value=tl.load(pointer=x_ptr))
        """, ["x_ptr", "unused_ptr", "out_ptr"])
    assert roles(k) == {"x_ptr": "input", "unused_ptr": "input", "out_ptr": "output"}


def test_names_never_decide_roles():
    # "out" in a name means nothing: this kernel only reads out_ptr and writes in_ptr.
    k = _kernel("""
        def kernel(out_ptr, in_ptr, n):
            tl.store(in_ptr, tl.load(out_ptr))
        """, ["out_ptr", "in_ptr"])
    assert roles(k) == {"out_ptr": "input", "in_ptr": "output"}


def test_pointer_into_unknown_code_is_an_error_naming_param_and_fix():
    k = _kernel("""
        def kernel(x_ptr, y_ptr, n):
            v = mystery(x_ptr)
            tl.store(y_ptr, v)
        """, ["x_ptr", "y_ptr"])
    with pytest.raises(RoleInferenceError) as err:
        infer_roles(k)
    text = str(err.value)
    assert "kernel" in text and "x_ptr" in text and "mystery" in text and "roles=" in text
    assert "y_ptr" not in text.split("pass roles=")[0].split("\n", 1)[1]


def test_inline_asm_with_pointer_needs_override_and_override_wins():
    text = """
        def kernel(x_ptr, y_ptr, n):
            tl.inline_asm_elementwise("st.global.f32 [$1], $2;", "=r,l,f", [x_ptr, 1.0],
                                      dtype=tl.int32, is_pure=False, pack=1)
            tl.store(y_ptr, tl.load(x_ptr))
        """
    with pytest.raises(RoleInferenceError, match="x_ptr"):
        infer_roles(_kernel(text, ["x_ptr", "y_ptr"]))
    k = _kernel(text, ["x_ptr", "y_ptr"], overrides={"x_ptr": "inplace"})
    assert roles(k) == {"x_ptr": "inplace", "y_ptr": "output"}


def test_tensor_descriptor_methods():
    k = _kernel("""
        def kernel(a_ptr, b_ptr, n):
            a = tl.make_tensor_descriptor(a_ptr, shape=[n], strides=[1], block_shape=[16])
            b = tl.make_tensor_descriptor(b_ptr, shape=[n], strides=[1], block_shape=[16])
            b.store([0], a.load([0]))
        """, ["a_ptr", "b_ptr"])
    assert roles(k) == {"a_ptr": "input", "b_ptr": "output"}


def _tuple_kernel(text: str, tuple_params: dict, helpers=(), callees=None, constexprs=None) -> KernelIR:
    """A kernel whose parameters are tuples of tensors (``tuple_params``: name -> element kinds,
    't' a tensor, 's' a scalar, or a (fields, kinds) pair for a named tuple) and constexprs."""
    params = []
    for i, (name, spec) in enumerate(tuple_params.items()):
        fields, kinds = spec if isinstance(spec, tuple) else (None, spec)
        items = [KernelParam(name=f"{name}_{j}", index=j,
                             kind=ParamKind.tensor if k == "t" else ParamKind.scalar,
                             dtype=DType.fp32 if k == "t" else DType.i32)
                 for j, k in enumerate(kinds)]
        params.append(KernelParam(name=name, index=i, kind=ParamKind.tuple, items=items,
                                  fields=fields, type_name="T" if fields else None))
    for name, value in (constexprs or {}).items():
        params.append(KernelParam(name=name, index=len(params), kind=ParamKind.constexpr,
                                  constexpr_value=value))
    return KernelIR(id="kernel", name="kernel", source=_source(text, callees=callees),
                    helpers=list(helpers), params=params)


def test_tuple_elements_keep_their_own_roles():
    k = _tuple_kernel("""
        def kernel(ptrs, meta):
            x_ptr, y_ptr = ptrs[0], ptrs[1]
            a, b, c = meta
            tl.store(ptrs[2], tl.load(x_ptr) + tl.load(y_ptr))
            tl.store(c, tl.load(c) + tl.load(a))
        """, {"ptrs": "ttt", "meta": "tst"})
    assert roles(k) == {"ptrs_0": "input", "ptrs_1": "input", "ptrs_2": "output",
                        "meta_0": "input", "meta_2": "inplace"}


def test_named_tuple_fields_and_tuples_through_helpers():
    helper = _source("""
        def store_into(pair, v):
            tl.store(pair.dst, v)
            return pair.src
        """, qualname="m.store_into")
    k = _tuple_kernel("""
        def kernel(pair, other):
            src = store_into(pair, 1.0)
            tl.store(other[-1], tl.load(src))
        """, {"pair": (["src", "dst"], "tt"), "other": "tt"}, helpers=[helper],
        callees={"store_into": "jit:m.store_into"})
    assert roles(k) == {"pair_0": "input", "pair_1": "output", "other_0": "input", "other_1": "output"}


def test_jit_function_constexprs_are_followed_where_they_are_called():
    from kernel_lens.ir import JitValue

    writer = _source("""
        def write_one(p):
            tl.store(p, 1.0)
        """, qualname="m.write_one")
    k = _tuple_kernel("""
        def kernel(ptrs, FN):
            apply(FN, ptrs[1])
            tl.load(ptrs[0])
        """, {"ptrs": "tt"}, helpers=[writer, _source("""
        def apply(f, p):
            f(p)
        """, qualname="m.apply")], callees={"apply": "jit:m.apply"},
        constexprs={"FN": JitValue(jit="m.write_one")})
    assert roles(k) == {"ptrs_0": "input", "ptrs_1": "output"}


def test_a_tuple_indexed_by_a_variable_is_every_element():
    k = _tuple_kernel("""
        def kernel(ptrs):
            for i in tl.static_range(2):
                tl.store(ptrs[i], 0.0)
        """, {"ptrs": "tt"})
    assert roles(k) == {"ptrs_0": "output", "ptrs_1": "output"}
