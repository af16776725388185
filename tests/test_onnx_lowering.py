"""IR -> ONNX lowering: wiring of launch nodes, torch-op translations checked in ONNX Runtime.

ONNX Runtime (CPU) cannot run the ``kernel_lens`` custom ops, so numerical checks either
extract the pure-ONNX part of a lowered graph (``onnx.utils.Extractor``) or give each kernel a
model-local ONNX function written in standard ops (a reference implementation of what the
generated custom op does, wired by ``launch_io``), and run the whole graph at sizes different
from the capture sizes: symbolic sizes must be computed at run time.
"""

from __future__ import annotations


import numpy as np
import onnx
import pytest
import sympy
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens.errors import UnsupportedKernelError
from kernel_lens.ir import GraphIR, parse
from kernel_lens.codegen.launch_io import launch_io, root_of
from kernel_lens.aten_facts import allocates_uninitialized, is_inplace
from kernel_lens.onnx import DOMAIN, lower_to_onnx, onnx_dtype, save_onnx, supported
from kernel_lens.onnx.lower import Lowering

from conftest import EXAMPLES, corpus_files, load_module, with_reference_kernels

MODEL_PATHS = {p.stem: p for p in [EXAMPLES / "llama_block.py", EXAMPLES / "toy_two_kernels.py",
                                    *corpus_files()]}
REQUIRED_OPS = """aten.empty_like.default aten.empty.memory_format aten.zeros.default
aten.zeros_like.default aten.clone.default aten.reshape.default aten.view.default
aten.transpose.int aten.t.default aten.permute.default aten.slice.Tensor aten.select.int
aten.linear.default aten.matmul.default aten.mm.default aten.add.Tensor aten.sub.Tensor
aten.mul.Tensor aten.div.Tensor aten.neg.default aten.exp.default aten.sin.default
aten.cos.default aten.arange.default aten.arange.start aten.arange.start_step aten.outer.default
aten.sum.default aten.sum.dim_IntList aten.mean.dim aten.scaled_dot_product_attention.default
aten.to.dtype aten._to_copy.default aten.contiguous.default aten.alias.default
aten.detach.default aten.unsqueeze.default aten.squeeze.dim aten.cat.default
aten.expand.default""".split()


# ------------------------------------------------------------------------------------ helpers
_IRS: dict[str, tuple] = {}


def _compiled(stem: str):
    if stem not in _IRS:
        module = load_module(MODEL_PATHS[stem])
        inputs = tuple(t.clone() for t in module.example_inputs)
        result = kl.compile(module.model, inputs, dynamic_shapes=module.dynamic_shapes, arch=90,
                            roles=getattr(module, "roles", None))
        _IRS[stem] = (module, result.ir)
    return _IRS[stem]


def _session(model: onnx.ModelProto):
    ort = pytest.importorskip("onnxruntime")  # structure tests run without it
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])



def _const(name: str, values, dtype=TensorProto.INT64, dims=None) -> onnx.NodeProto:
    values = list(np.atleast_1d(values))
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(
        "v", dtype, [len(values)] if dims is None else dims, values))


def _check_structure(ir: GraphIR, model: onnx.ModelProto) -> None:
    onnx.checker.check_model(model, full_check=True)
    graph = model.graph
    assert graph.name == ir.name and "kernel_lens" in graph.doc_string
    assert {(o.domain, o.version) for o in model.opset_import} == {("", 18), (DOMAIN, 1)}
    assert model.ir_version <= 10
    # graph inputs: the IR's, with symbolic dims named after the IR's symbols/expressions
    assert [i.name for i in graph.input] == ir.inputs
    for inp in graph.input:
        value = ir.values[inp.name]
        assert inp.type.tensor_type.elem_type == onnx_dtype(value.dtype)
        dims = inp.type.tensor_type.shape.dim
        assert len(dims) == len(value.shape)
        for dim, text in zip(dims, value.shape):
            if parse(text).is_Integer:
                assert dim.dim_value == int(text)
            else:
                assert dim.dim_param == text
    for name, info in ir.symbols.items():
        dim = graph.input[info.input].type.tensor_type.shape.dim[info.dim]
        if info.scale == 1 and info.offset == 0:
            assert dim.dim_param == name
        else:
            assert name in {s.name for s in parse(dim.dim_param).free_symbols}
    # one kernel_lens node per launch, wired as launch_io says, renaming applied in order
    kernel_nodes = [n for n in graph.node if n.domain == DOMAIN]
    assert len(kernel_nodes) == len(ir.launches)
    current: dict[str, str] = {}
    names = ({o for n in graph.node for o in n.output} | {i.name for i in graph.input}
             | {t.name for t in graph.initializer})
    for idx, (launch, node) in enumerate(zip(ir.launches, kernel_nodes)):
        io = launch_io(ir, launch, f"__{launch.order}")
        assert node.op_type == launch.kernel
        assert node.name == f"launch{idx}_{launch.kernel}"
        assert [(a.name, a.type, a.i) for a in node.attribute] == [("launch", onnx.AttributeProto.INT, idx)]
        assert len(node.input) == len(io.inputs)
        for got, value in zip(node.input, io.inputs):
            want = current.get(value, value)
            # constant folding may replace a value that is a copy of another (Identity) by it
            assert got == want or got.startswith(f"{value}.zeros") or want not in names, (got, value)
        # a kernel result that is a graph output as is takes the output's name (folded Identity)
        graph_outputs = {o.name for o in graph.output}
        assert len(node.output) == len(io.outputs)
        for got, (_, new) in zip(node.output, io.outputs):
            assert got == new or got in graph_outputs, (got, new)
        current.update({value: got for (value, _), got in zip(io.outputs, node.output)})
    # topologically valid, every node input produced
    known = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    for node in graph.node:
        for x in node.input:
            assert not x or x in known, f"{node.name} reads {x!r} before anything produces it"
        known.update(node.output)
    inplace_roots = {root_of(ir, op.aliases[0]) for op in ir.ops if is_inplace(op.op) and op.aliases}
    mutated = [f"mutated_{v}" for v in ir.inputs if current.get(v, v) != v or v in inplace_roots]
    assert [o.name for o in graph.output] == [f"output_{i}" for i in range(len(ir.outputs))] + mutated
    for out, value in zip(graph.output, ir.outputs):
        assert out.type.tensor_type.elem_type == onnx_dtype(ir.values[value].dtype)
        assert len(out.type.tensor_type.shape.dim) == len(ir.values[value].shape)
    # every kernel output has a value_info with the IR's dtype and rank
    infos = {v.name: v for v in graph.value_info}
    for node in kernel_nodes:
        for out in node.output:
            assert out in infos or out in {o.name for o in graph.output}


# ------------------------------------------------------------------------------------ structure
@pytest.mark.parametrize("stem", sorted(MODEL_PATHS))
def test_lowering_structure(stem):
    _, ir = _compiled(stem)
    model = lower_to_onnx(ir)
    _check_structure(ir, model)


def test_required_ops_are_supported():
    # translated by torchlib / kernel_lens, or decomposed by the front end into ops that are
    from kernel_lens.aten_facts import overload
    from kernel_lens.frontends.trace.decompose import needs_decomposition

    assert [op for op in REQUIRED_OPS
            if not supported(op) and not needs_decomposition(overload(op), supported)] == []


def test_dtype_mapping():
    from kernel_lens.ir import DType
    assert onnx_dtype(DType.fp8e4nv) == TensorProto.FLOAT8E4M3FN
    assert onnx_dtype(DType.fp8e5) == TensorProto.FLOAT8E5M2
    assert onnx_dtype(DType.i1) == TensorProto.BOOL
    assert onnx_dtype(DType.bf16) == TensorProto.BFLOAT16
    assert onnx_dtype(DType.fp16) == TensorProto.FLOAT16
    assert onnx_dtype(DType.u8) == TensorProto.UINT8


def test_llama_graph_shape_and_pruning(tmp_path):
    _, ir = _compiled("llama_block")
    model = lower_to_onnx(ir)
    ops = [n.op_type for n in model.graph.node]
    # views feeding only kernels emit nothing: no Reshape of x for the first rmsnorm
    assert not any(n.op_type == "Reshape" and n.input[0] == "x" for n in model.graph.node)
    # allocations produced by kernels are not emitted at all (no zero fill for any of them)
    allocs = [o for op in ir.ops if allocates_uninitialized(op.op) for o in op.outputs]
    assert allocs and ops
    assert not [n.name for n in model.graph.node if n.name.split(".zeros")[0] in allocs]
    # weights are initializers; constant folding may replace one by its folded transpose
    inits = {t.name for t in model.graph.initializer}
    assert all(n in ir.constants or "/" in n for n in inits) and inits & set(ir.constants)
    path = save_onnx(model, tmp_path / "llama.onnx")
    again = onnx.load(str(path))
    assert again.graph.name == ir.name and len(again.graph.node) == len(model.graph.node)


def test_allocation_read_before_write_becomes_zeros():
    _, ir = _compiled("atomic_sum")  # zeros() buffers accumulated into by atomics
    model = lower_to_onnx(ir)
    first = next(n for n in model.graph.node if n.domain == DOMAIN)
    producer = {o: n for n in model.graph.node for o in n.output}
    assert producer[first.input[1]].op_type in ("ConstantOfShape", "Expand")  # torchlib's zeros


def test_inplace_graph_input_is_renamed_and_output_as_mutated():
    _, ir = _compiled("inplace_input")
    model = lower_to_onnx(ir)
    node = next(n for n in model.graph.node if n.domain == DOMAIN)
    # the kernel's new y is the model's output as is: folding names it output_0 ("y__0" before)
    assert list(node.output) == ["output_0"]
    sources = {n.output[0]: n.input[0] for n in model.graph.node if n.op_type == "Identity"}
    assert [o.name for o in model.graph.output] == ["output_0", "mutated_y"]
    assert sources["mutated_y"] == "output_0"
    plain = lower_to_onnx(ir, mutated_inputs=False)
    assert [o.name for o in plain.graph.output] == ["output_0"]


# ------------------------------------------------------------------------------------ llama in ORT
def _llama_kernels(eps: float) -> dict:
    def rmsnorm(read, write):
        return [
            _const("hid", [-1, 64]),
            helper.make_node("Reshape", [read["x_ptr"], "hid"], ["x2"]),
            helper.make_node("Mul", ["x2", "x2"], ["sq"]),
            _const("ax", [-1]),
            helper.make_node("ReduceMean", ["sq", "ax"], ["ms"], keepdims=1),
            _const("eps", [eps], TensorProto.FLOAT, []),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Div", ["x2", "rms"], ["xn"]),
            helper.make_node("Mul", ["xn", read["w_ptr"]], [write["out_ptr"]]),
        ]

    def rope(read, write):
        return [
            _const("heads", [1, -1, 4, 16]),
            helper.make_node("Reshape", [read["x_ptr"], "heads"], ["x4"]),
            _const("half", [8, 8]),
            helper.make_node("Split", ["x4", "half"], ["x1", "x2"], axis=3),
            _const("one", [1]),
            helper.make_node("Unsqueeze", [read["cos_ptr"], "one"], ["c"]),
            helper.make_node("Unsqueeze", [read["sin_ptr"], "one"], ["s"]),
            helper.make_node("Mul", ["x1", "c"], ["x1c"]), helper.make_node("Mul", ["x2", "s"], ["x2s"]),
            helper.make_node("Mul", ["x2", "c"], ["x2c"]), helper.make_node("Mul", ["x1", "s"], ["x1s"]),
            helper.make_node("Sub", ["x1c", "x2s"], ["lo"]), helper.make_node("Add", ["x2c", "x1s"], ["hi"]),
            helper.make_node("Concat", ["lo", "hi"], [write["out_ptr"]], axis=3),
        ]

    def swiglu(read, write):
        return [
            helper.make_node("Sigmoid", [read["gate_ptr"]], ["sg"]),
            helper.make_node("Mul", [read["gate_ptr"], "sg"], ["silu"]),
            helper.make_node("Mul", ["silu", read["up_ptr"]], [write["out_ptr"]]),
        ]

    return {"rmsnorm_kernel": rmsnorm, "rope_kernel": rope, "swiglu_kernel": swiglu}


@pytest.mark.parametrize("opset", [18, 23])
@pytest.mark.parametrize("seq", [5, 37])
def test_llama_end_to_end_in_ort(seq, opset):
    # opset 23 (the ORT target's): attention is one ONNX Attention node, causal like torch's
    module, ir = _compiled("llama_block")
    assert ir.symbols["seq"].example != seq
    lowered = lower_to_onnx(ir, opset=opset)
    attention = [n for n in lowered.graph.node if n.op_type == "Attention"]
    assert len(attention) == (opset >= 23)
    assert all({a.name: a.i for a in n.attribute}["is_causal"] == 1 for n in attention)
    model = with_reference_kernels(ir, lowered, _llama_kernels(module.model.eps))
    x = torch.randn(1, seq, 64, generator=torch.Generator().manual_seed(seq))
    (got,) = _session(model).run(None, {"x": x.numpy()})
    want = module.reference(x).numpy()
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_toy_end_to_end_in_ort():
    module, ir = _compiled("toy_two_kernels")
    scale = module.model.scale
    impls = {
        "add_kernel": lambda r, w: [helper.make_node("Add", [r["x_ptr"], r["y_ptr"]], [w["out_ptr"]])],
        "scale_relu_kernel": lambda r, w: [
            _const("k", [scale], TensorProto.FLOAT, []),
            helper.make_node("Mul", [r["x_ptr"], "k"], ["m"]),
            helper.make_node("Relu", ["m"], [w["out_ptr"]])],
    }
    model = with_reference_kernels(ir, lower_to_onnx(ir), impls)
    x, y = torch.randn(77), torch.randn(77)
    (got,) = _session(model).run(None, {"x": x.numpy(), "y": y.numpy()})
    np.testing.assert_allclose(got, module.reference(x, y).numpy(), rtol=1e-6)


def test_llama_rope_tables_subgraph():
    """Extract x -> (cos, sin): arange(seq) + outer + cos/sin, seq read from x at run time."""
    module, ir = _compiled("llama_block")
    model = lower_to_onnx(ir)
    sub = onnx.utils.Extractor(model).extract_model(["x"], ["cos", "sin"])
    assert not any(n.domain == DOMAIN for n in sub.graph.node)
    for seq in (3, 29):
        cos, sin = _session(sub).run(None, {"x": np.zeros((1, seq, 64), np.float32)})
        want_cos, want_sin = module.model.rope_tables(seq, "cpu")
        np.testing.assert_allclose(cos, want_cos.detach().numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(sin, want_sin.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_llama_attention_subgraph():
    """Extract the causal attention: inputs are the roots the kernels produced (q, k) and v."""
    _, ir = _compiled("llama_block")
    model = lower_to_onnx(ir)
    op = next(o for o in ir.ops if o.op == "aten.scaled_dot_product_attention.default")
    q_root, k_root, v_root = (root_of(ir, a.ref) for a in op.args[:3])
    # q and k are kernel outputs (fresh: they keep their names), v straight from a linear
    kernel_outputs = {o for n in model.graph.node if n.domain == DOMAIN for o in n.output}
    assert {q_root, k_root} <= kernel_outputs and v_root not in kernel_outputs
    # x too: view(batch, seq, 4, 16) of v reads seq from x's shape at run time
    sub = onnx.utils.Extractor(model).extract_model([q_root, k_root, v_root, "x"], [op.outputs[0]])
    assert [n.op_type for n in sub.graph.node].count("Softmax") == 1
    seq = 11
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, seq, 4, 16, generator=g), torch.randn(1, seq, 4, 16, generator=g)
    v = torch.randn(1, seq, 64, generator=g)
    feeds = {q_root: q.numpy(), k_root: k.numpy(), v_root: v.numpy(),
             "x": np.zeros((1, seq, 64), np.float32)}
    (got,) = _session(sub).run(None, feeds)
    want = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                          v.view(1, seq, 4, 16).transpose(1, 2), is_causal=True)
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------ torch ops
@triton.jit
def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=mask), mask=mask)


@triton.jit
def _accumulate_kernel(acc_ptr, x_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    acc = tl.load(acc_ptr + offsets, mask=mask)
    tl.store(acc_ptr + offsets, acc + tl.load(x_ptr + offsets, mask=mask), mask=mask)


_KERNELS = {
    "_copy_kernel": lambda r, w: [helper.make_node("Identity", [r["x_ptr"]], [w["out_ptr"]])],
    "_accumulate_kernel": lambda r, w: [helper.make_node("Add", [r["acc_ptr"], r["x_ptr"]],
                                                         [w["acc_ptr"]])],
}


class _Kernels(torch.nn.Module):
    """Runs the Triton kernels when lifted, their torch equivalents as the reference."""

    def __init__(self, triton_kernels: bool = True):
        super().__init__()
        self.triton_kernels = triton_kernels

    def copy(self, x):
        if not self.triton_kernels:
            return x.clone()
        out = torch.empty_like(x)
        _copy_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        return out

    def accumulate(self, acc, x):
        if not self.triton_kernels:
            acc += x
            return
        _accumulate_kernel[(triton.cdiv(x.numel(), 64),)](acc, x, x.numel(), BLOCK=64)


class _Views(_Kernels):
    def forward(self, x):  # x: (n, 2*h)
        x = self.copy(x)
        n = x.shape[0]
        a = x.reshape(n, 2, -1).transpose(1, 2)  # symbolic reshape + transpose
        b = a[:, 1:, :] * 2.0  # slice of a view, then mul with a scalar
        b.add_(1.0)  # in-place torch op on a root
        c = x.view(-1).unsqueeze(0).squeeze(0)
        d = x.t().contiguous()[:, 0]  # t + select
        e = x.unsqueeze(0).expand(3, -1, -1).permute(2, 0, 1)
        f = torch.cat([x, x * x], dim=1)[1 : n - 1, : x.shape[1] // 2 + 1]  # symbolic slice ends
        g = x.to(torch.float16)
        z = torch.zeros(n, 3) + x.new_ones(n, 1) - torch.zeros_like(x)[:, :1]
        s = x.sum(1) / x.sum()
        m = x.mean(dim=0, keepdim=True)
        u = (-x).exp() + x.sin() * x.cos()
        p0, p1 = x.view(n, 2, -1).split(1, dim=1)
        i = (x * 10).to(torch.int32).to(torch.bfloat16).float()
        # bf16 through Cast (torchlib fills bf16 zeros with Expand, which ORT's CPU EP lacks for
        # bf16; the CUDA EP has it)
        zb = torch.zeros(n, 2).to(torch.bfloat16).float() + 1
        return b, c, d, e, f, g, z, s, m, u, p0 - p1, i, zb


class _Attention(_Kernels):
    def __init__(self, triton_kernels: bool = True):
        super().__init__(triton_kernels)
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(32, 16, generator=g) / 4)
        self.b = torch.nn.Parameter(torch.randn(32, generator=g))
        self.register_buffer("freq", torch.rand(5, generator=g))

    def forward(self, x):  # x: (batch, seq, 16)
        x = self.copy(x)
        batch, seq, _ = x.shape
        h = F.linear(x, self.w, self.b)
        q = h.view(batch, seq, 2, 16).transpose(1, 2)
        k = (h * 0.5).view(batch, seq, 2, 16).transpose(1, 2)
        v = F.gelu(h).reshape(batch, seq, 2, 16).transpose(1, 2)
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        scaled = F.scaled_dot_product_attention(q, k, v, scale=0.3)
        y = torch.softmax(h, -1) + F.silu(h) + torch.sigmoid(h) * torch.rsqrt(h * h + 1)
        mm = torch.matmul(x, self.w.t()) - torch.mm(x[0], self.w.t())
        pos = torch.arange(seq, dtype=torch.float32)
        angles = torch.outer(pos, self.freq)
        steps = torch.arange(1, seq, 2).float() * 0.5
        return causal, scaled, y, mm, angles.cos(), angles.sin(), steps


class _MoreOps(_Kernels):
    def __init__(self, triton_kernels: bool = True):
        super().__init__(triton_kernels)
        g = torch.Generator().manual_seed(5)
        self.table = torch.nn.Parameter(torch.randn(10, 3, generator=g))

    def forward(self, x):  # x: (n, 6)
        x = self.copy(x)
        n = x.shape[0]
        a = F.gelu(x, approximate="tanh") + torch.log_softmax(x, dim=1) + x.clamp(-0.5, 0.5)
        b = torch.where(x > 0, x, -x) + x.masked_fill(x < -1, 3.0) + torch.maximum(x, x * 0.5)
        c = torch.addmm(x[:, :3], x, x.t()[:, :3], beta=0.5, alpha=2.0)
        idx = (x.abs() * 3).long().clamp(0, 9)
        e = F.embedding(idx[:, 0], self.table)
        f = torch.stack([x, x * 2], dim=1).amax(dim=1)
        u0, u1 = x.view(n, 2, 3).unbind(1)
        g = torch.div(x * 7, 2, rounding_mode="floor") + torch.div(x * 7, 2, rounding_mode="trunc")
        h = torch.div(idx, 4, rounding_mode="floor") + x.pow(2) + (x >= 0.25).float()
        k = torch.full((n, 2), 1.5) + x.narrow(1, 2, 2) + torch.ones_like(x[:, :2])
        return a, b, c, e, f, u0 - u1, g, h, k


class _WriteAfterView(_Kernels):
    def forward(self, x):  # x: (n, 4)
        buf = torch.zeros(x.shape[0], 4)
        early = buf[:, :2]  # a view taken before the kernel writes its root
        flat = buf.view(-1)
        self.accumulate(buf, x)  # kernel: buf += x
        seen = early * 1.0  # must see the kernel's write
        buf.mul_(2.0)  # in-place torch op on the root
        buf.view(-1).add_(1.0)  # in-place through a reshape-like view
        buf.t().mul_(3.0)  # in-place through a transpose
        return seen, flat, buf.t(), early


class _InputMutation(_Kernels):
    def forward(self, x):
        y = self.copy(x)
        x.mul_(2.0)  # in-place torch op on a graph input
        return y + x


class _MayAliasCopies(_Kernels):
    def forward(self, x):  # x: (n, 4)
        y = self.copy(x)
        c = y.t().contiguous()  # a copy, though the schema says "may alias"
        c.add_(1.0)  # must not change y
        d = y.to(torch.float64)  # a copy (dtype change)
        d.mul_(3.0)  # must not change y
        r = y.t().reshape(-1)  # reshape of a non-dense view: a copy
        r.mul_(0.0)  # must not change y
        same = y.contiguous()  # already dense: y itself
        same.add_(2.0)  # changes y
        return y * 1.0, c, d, r


class _PartialWrites(_Kernels):
    def forward(self, x):  # x: (n, 4)
        buf = torch.zeros(x.shape[0], 4)
        self.accumulate(buf, x)
        buf[1:3].copy_(x[:2] * 5)  # slice + copy_
        buf[:, -1].fill_(7.0)  # select (negative index) + fill_
        buf[-1] += 1.0  # select + add_ + copy_
        col = buf[:, 1:3]
        col.mul_(0.5)  # in-place through a column slice
        return buf, col


class _PermutedWrites(_Kernels):
    def forward(self, x):  # x: (n, 2, 3)
        buf = torch.zeros(x.shape[0], 2, 3)
        self.accumulate(buf, x)  # kernel: buf += x
        buf.permute(2, 0, 1).mul_(torch.tensor([1.0, 2.0, 3.0]).view(3, 1, 1))  # per-slice factor
        buf.permute(1, 2, 0)[1].add_(10.0)  # select of a permute: only buf[:, 1, :] changes
        return buf


def _lift(module_cls, inputs, dynamic_shapes):
    ir = kl.compile(module_cls(), inputs, dynamic_shapes=dynamic_shapes, arch=90).ir
    return ir, module_cls(triton_kernels=False)


def _run_and_compare(ir, reference, sizes, make, rtol=1e-5, atol=1e-5):
    model = lower_to_onnx(ir)
    _check_structure(ir, model)
    sess = _session(with_reference_kernels(ir, model, _KERNELS))
    for size in sizes:
        inputs = make(*size)
        names = [o.name for o in model.graph.output]
        got = sess.run(names, {name: t.numpy() for name, t in zip(ir.inputs, inputs)})
        ref_inputs = [t.clone() for t in inputs]
        with torch.no_grad():
            want = reference(*ref_inputs)
        want = want if isinstance(want, tuple) else (want,)
        # graph inputs the model mutates come back as mutated_<input>
        want += tuple(t for name, t in zip(ir.inputs, ref_inputs) if f"mutated_{name}" in names)
        assert len(got) == len(want)
        for i, (g, w) in enumerate(zip(got, want)):
            w = w.float().numpy() if w.dtype == torch.bfloat16 else w.numpy()
            assert g.shape == w.shape, (i, size, g.shape, w.shape)
            np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=rtol,
                                       atol=atol, err_msg=f"output {i} at sizes {size}")


def test_views_reshapes_casts_reductions_in_ort():
    dims = {"x": {0: torch.export.Dim("n", min=4, max=64), 1: 2 * torch.export.Dim("h", min=2, max=32)}}
    ir, ref = _lift(_Views, (torch.randn(4, 6),), dims)
    assert any(info.scale == 2 for info in ir.symbols.values())  # dim 1 is 2*symbol
    ops = {op.op for op in ir.ops}
    for name in ("aten.reshape.default", "aten.transpose.int", "aten.slice.Tensor",
                 "aten.add_.Tensor", "aten.select.int", "aten.expand.default", "aten.cat.default",
                 "aten._to_copy.default", "aten.zeros.default", "aten.sum.dim_IntList", "aten.mean.dim"):
        assert name in ops, name
    g = torch.Generator().manual_seed(0)
    _run_and_compare(ir, ref, [(4, 6), (5, 10), (9, 4)],
                     lambda n, w: (torch.randn(n, w, generator=g),), rtol=1e-4, atol=1e-4)


def test_linear_attention_arange_in_ort():
    dims = {"x": {0: torch.export.Dim("batch", min=1, max=8), 1: torch.export.Dim("seq", min=4, max=64)}}
    ir, ref = _lift(_Attention, (torch.randn(2, 6, 16),), dims)
    # batch 1 is a piece of its own (torch guards a size-1 case there; traced static)
    assert [p.when[0].ranges["batch"] for p in ir.pieces] == [(1, 1), (2, 8)]
    ops = {op.op for g in ir.graphs() for op in g.ops}
    assert {"aten.linear.default", "aten.scaled_dot_product_attention.default",
            "aten.arange.default"} <= ops
    assert "aten.outer.default" not in ops  # torchlib has none: decomposed by the front end
    g = torch.Generator().manual_seed(1)
    _run_and_compare(ir, ref, [(2, 6), (1, 9), (3, 17)],
                     lambda b, s: (torch.randn(b, s, 16, generator=g),), rtol=1e-4, atol=1e-4)


def test_more_elementwise_reductions_and_joins_in_ort():
    ir, ref = _lift(_MoreOps, (torch.randn(5, 6),), {"x": {0: torch.export.Dim("n", min=3, max=64)}})
    g = torch.Generator().manual_seed(6)
    _run_and_compare(ir, ref, [(5,), (8,)], lambda n: (torch.randn(n, 6, generator=g),),
                     rtol=1e-4, atol=1e-4)


def test_kernel_write_after_view_and_inplace_views_in_ort():
    dims = {"x": {0: torch.export.Dim("n", min=2, max=64)}}
    ir, ref = _lift(_WriteAfterView, (torch.randn(6, 4),), dims)
    assert any(op.op == "aten.mul_.Tensor" for op in ir.ops)
    g = torch.Generator().manual_seed(2)
    _run_and_compare(ir, ref, [(6,), (3,), (13,)], lambda n: (torch.randn(n, 4, generator=g),))


def test_inplace_writes_through_slices_and_selects_in_ort():
    dims = {"x": {0: torch.export.Dim("n", min=4, max=64)}}
    ir, ref = _lift(_PartialWrites, (torch.randn(6, 4),), dims)
    ops = [op.op for op in ir.ops]
    assert {"aten.copy_.default", "aten.fill_.Scalar", "aten.select.int"} <= set(ops)
    g = torch.Generator().manual_seed(3)
    _run_and_compare(ir, ref, [(6,), (4,), (13,)], lambda n: (torch.randn(n, 4, generator=g),))


def test_inplace_writes_through_permutes_in_ort():
    # each write lands on the right elements: a wrong inverse permutation changes the numbers
    dims = {"x": {0: torch.export.Dim("n", min=2, max=64)}}
    ir, ref = _lift(_PermutedWrites, (torch.randn(5, 2, 3),), dims)
    assert sum(op.op == "aten.permute.default" for op in ir.ops) == 2
    g = torch.Generator().manual_seed(7)
    _run_and_compare(ir, ref, [(5,), (2,), (11,)], lambda n: (torch.randn(n, 2, 3, generator=g),))


def test_may_alias_ops_that_copied_are_roots_of_their_own_in_ort():
    ir, ref = _lift(_MayAliasCopies, (torch.randn(6, 4),), {"x": {0: torch.export.Dim("n", min=4, max=64)}})
    ops = {op.op: op for op in ir.ops}
    assert not ops["aten.contiguous.default"].aliases  # torch copied: the IR records no alias
    g = torch.Generator().manual_seed(4)
    _run_and_compare(ir, ref, [(6,), (9,)], lambda n: (torch.randn(n, 4, generator=g),))


def test_inplace_torch_op_on_graph_input_in_ort():
    ir, ref = _lift(_InputMutation, (torch.randn(6),), {"x": {0: torch.export.Dim("n", min=4, max=64)}})
    assert any(op.op == "aten.mul_.Tensor" and op.aliases == ["x"] for op in ir.ops)
    model = lower_to_onnx(ir)
    assert [o.name for o in model.graph.output] == ["output_0", "mutated_x"]
    _run_and_compare(ir, ref, [(6,), (11,)], lambda n: (torch.randn(n),))


# ------------------------------------------------------------------------------------ symbolic ints
def test_symbolic_expressions_are_computed_at_run_time():
    _, ir = _compiled("swiglu")  # x: (tokens, 2*intermediate): intermediate has scale 2
    lowering = Lowering(ir, 18)
    exprs = ["intermediate", "tokens*intermediate + 3", "floor(tokens/3)", "ceiling((tokens + 1)/4)", "Mod(tokens, 5)",
             "Max(tokens, 2*intermediate)", "Min(7, intermediate)", "intermediate**2", "floor(tokens*intermediate/2) - 1"]
    outs = [lowering.sym(e) for e in exprs]
    graph = helper.make_graph(
        lowering.nodes, "syms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["t", "w"])],
        [helper.make_tensor_value_info(o, TensorProto.INT64, [1]) for o in outs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.checker.check_model(model, full_check=True)
    sess = _session(model)
    for tokens, intermediate in [(5, 3), (12, 7), (1, 2)]:
        got = [int(v[0]) for v in sess.run(None, {"x": np.zeros((tokens, 2 * intermediate), np.float32)})]
        names = {"tokens": sympy.Symbol("tokens"), "intermediate": sympy.Symbol("intermediate")}
        want = [int(sympy.sympify(e, locals=names).subs({names["tokens"]: tokens, names["intermediate"]: intermediate}))
                for e in exprs]
        assert got == want, (tokens, intermediate)


# ------------------------------------------------------------------------------------ rejections
def _extend(ir: GraphIR, ops: list[dict], values: list[dict], outputs: list[str]) -> GraphIR:
    doc = ir.model_dump()
    start = max(n.order for n in ir.nodes()) + 1
    for i, op in enumerate(ops):
        doc["ops"].append({"order": start + i, **op})
    for v in values:
        doc["values"][v["name"]] = {"kind": "intermediate", **v}
    doc["outputs"] = outputs
    return GraphIR.model_validate(doc)


def test_unsupported_op_is_named():
    _, ir = _compiled("vector_add")
    # an IR written by hand (or by another front end) with an op torchlib has no function for
    bad = _extend(ir, [{"op": "aten.diff.default", "args": [{"ref": "empty_like"}],
                        "outputs": ["diff"]}],
                  [{"name": "diff", "dtype": "fp32", "shape": ["n - 1"], "strides": ["1"]}],
                  ["diff"])
    with pytest.raises(UnsupportedKernelError, match=r"aten\.diff\.default.*position 2") as err:
        lower_to_onnx(bad)
    assert "torchlib has none" in str(err.value)


def test_dead_unsupported_op_is_pruned():
    _, ir = _compiled("vector_add")
    dead = _extend(ir, [{"op": "aten.cumsum.default", "args": [{"ref": "empty_like"}, {"const": 0}],
                         "outputs": ["cumsum"]}],
                   [{"name": "cumsum", "dtype": "fp32", "shape": ["n"], "strides": ["1"]}],
                   ["empty_like"])
    model = lower_to_onnx(dead)
    onnx.checker.check_model(model, full_check=True)
    assert all(n.op_type != "Unsupported" for n in model.graph.node)


def test_inplace_through_strided_slice_is_rejected():
    _, ir = _compiled("vector_add")
    bad = _extend(ir, [
        {"op": "aten.slice.Tensor", "args": [{"ref": "empty_like"}, {"const": 0}, {"const": 0},
                                             {"const": 4}, {"const": 2}], "outputs": ["part"],
         "aliases": ["empty_like"]},
        {"op": "aten.add_.Tensor", "args": [{"ref": "part"}, {"const": 1.0}], "outputs": ["add_"],
         "aliases": ["part"]},
    ], [{"name": "part", "dtype": "fp32", "shape": ["2"], "strides": ["1"]},
        {"name": "add_", "dtype": "fp32", "shape": ["2"], "strides": ["1"]}], ["empty_like"])
    with pytest.raises(UnsupportedKernelError, match=r"aten\.add_\.Tensor.*aten\.slice\.Tensor.*strided"):
        lower_to_onnx(bad)


def test_kernel_on_non_dense_root_is_rejected():
    _, ir = _compiled("vector_add")
    doc = ir.model_dump()
    doc["values"]["x"]["shape"], doc["values"]["x"]["strides"] = ["n", "2"], ["1", "n"]
    for arg in doc["launches"][0]["args"]:
        if arg.get("value") == "x":
            arg["shape"], arg["strides"] = ["n", "2"], ["1", "n"]
    with pytest.raises(UnsupportedKernelError, match=r"not dense row-major"):
        lower_to_onnx(GraphIR.model_validate(doc))


def test_kernel_on_a_cast_is_rejected():
    _, ir = _compiled("vector_add")
    doc = ir.model_dump()
    doc["ops"].insert(0, {"order": -1, "op": "aten.to.dtype", "args": [{"ref": "x"}, {"const": "torch.float16"}],
                          "outputs": ["x16"], "aliases": ["x"]})
    doc["values"]["x16"] = {"name": "x16", "dtype": "fp16", "shape": ["n"], "strides": ["1"],
                            "kind": "intermediate"}
    for arg in doc["launches"][0]["args"]:
        if arg.get("value") == "x":
            arg["value"] = "x16"
    with pytest.raises(UnsupportedKernelError, match=r"as another dtype"):
        lower_to_onnx(GraphIR.model_validate(doc))


class _TwoWriters(_Kernels):
    def forward(self, x):
        out = torch.empty_like(x)
        _copy_kernel[(triton.cdiv(x.numel(), 64),)](x, out, x.numel(), BLOCK=64)
        y = out * 2
        _copy_kernel[(triton.cdiv(x.numel(), 64),)](y, out, x.numel(), BLOCK=64)  # overwrite
        return out


def test_allocation_written_fresh_twice_never_yields_invalid_onnx():
    """launch_io names a fresh output after its value, so two kernels writing one allocation
    would give two producers of one name: the lowering refuses rather than emit broken ONNX."""
    ir, _ = _lift(_TwoWriters, (torch.randn(6),), {"x": {0: torch.export.Dim("n", min=4, max=64)}})
    try:
        model = lower_to_onnx(ir)
    except kl.KernelLensError as exc:
        assert "already in use" in str(exc)
    else:
        _check_structure(ir, model)


def test_ir_without_roles_is_refused_clearly():
    _, ir = _compiled("vector_add")
    doc = ir.model_dump()
    for arg in doc["launches"][0]["args"]:
        if arg.get("value"):
            arg["role"] = None
    with pytest.raises(kl.KernelLensError, match="role inference"):
        lower_to_onnx(GraphIR.model_validate(doc))


def test_old_opset_is_refused():
    _, ir = _compiled("vector_add")
    with pytest.raises(ValueError, match="opset"):
        lower_to_onnx(ir, opset=17)
    model = lower_to_onnx(ir, opset=21)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version == 21


def test_dense_layout_is_proven_not_sampled():
    # a kernel is bound to a root only if its strides are dense row-major for EVERY size: a
    # stride expression equal to the dense one at a few sizes (here n = 2, 4, 7) is not enough
    n, m = (sympy.Symbol(s, integer=True, positive=True) for s in "nm")
    assert Lowering._equal(n * (m + 1), n * m + n)
    assert Lowering._equal(sympy.Mod(n, 1) + n, n)
    assert not Lowering._equal(n + (n - 2) * (n - 4) * (n - 7), n)
    assert not Lowering._equal(2 * sympy.floor(n / 2), n)


def test_onnx_values_carry_the_ir_names():
    # a reader of the ONNX graph finds each torch op's result under its IR name (dump-ir's),
    # suffixed .vN only when a value is written again; helper nodes are scoped by op position
    _, ir = _compiled("llama_block")
    model = lower_to_onnx(ir)
    produced = [o for n in model.graph.node for o in n.output]
    ir_names = set(ir.values)
    named = [o for o in produced if o in ir_names]
    assert len(named) >= 20 and not [o for o in produced if ".v" in o]  # no value is rewritten
    scoped = [o for o in produced if o not in ir_names and not o.startswith("output_")]
    assert all(o.split("/")[0] in ("shape", "const") or o.split("/")[0].removeprefix("op").isdigit()
               for o in scoped), scoped


def test_symbolic_expressions_the_lowering_cannot_compute_are_named():
    _, ir = _compiled("swiglu")
    lowering = Lowering(ir, 18)
    intermediate = parse("intermediate", list(ir.symbols))
    for expr, message in [
        (sympy.Abs(intermediate - 5), r"symbolic expression Abs\(intermediate - 5\) \(Abs\) cannot be computed at run time"),
        (intermediate ** -1, r"symbolic expression 1/intermediate \(Pow\) cannot be computed"),
        (intermediate / 3, r"symbolic expression intermediate/3 is not an integer expression \(use floor\(intermediate/3\)\)"),
    ]:
        with pytest.raises(UnsupportedKernelError, match=message):
            lowering.sym(expr)


def test_weights_past_the_limit_are_saved_as_external_data(tmp_path, monkeypatch):
    # past protobuf's 2 GB limit the weights go to NAME.onnx.data beside the model (the limit is
    # lowered here so that a small model takes that path)
    from kernel_lens.onnx import lower

    _, ir = _compiled("llama_block")
    model = lower_to_onnx(ir)
    assert len(model.graph.initializer) >= 4
    small = save_onnx(model, tmp_path / "small" / "m.onnx")
    assert sorted(p.name for p in small.parent.iterdir()) == ["m.onnx"]
    monkeypatch.setattr(lower, "EXTERNAL_DATA_BYTES", 0)
    before = onnx.ModelProto()
    before.CopyFrom(model)
    path = save_onnx(model, tmp_path / "big" / "m.onnx")
    for t in model.graph.initializer:  # the caller's model keeps its weights
        assert t.data_location != TensorProto.EXTERNAL and not t.external_data
    assert sorted(p.name for p in path.parent.iterdir()) == ["m.onnx", "m.onnx.data"]
    assert path.stat().st_size < small.stat().st_size // 10  # the weights are not inside
    again = onnx.load(str(path))
    assert [n.op_type for n in again.graph.node] == [n.op_type for n in model.graph.node]
    for a, b in zip(again.graph.initializer, before.graph.initializer, strict=True):
        assert a.name == b.name
        assert onnx.numpy_helper.to_array(a).tobytes() == onnx.numpy_helper.to_array(b).tobytes()
    for a, b in zip(model.graph.initializer, before.graph.initializer, strict=True):
        assert onnx.numpy_helper.to_array(a).tobytes() == onnx.numpy_helper.to_array(b).tobytes()


class _Zeroed(_Kernels):
    def forward(self, x):
        acc = torch.empty_like(x)
        acc.zero_()  # aten.zero_: ConstantOfShape
        self.accumulate(acc, x)  # the kernel reads the zeros
        zb = torch.empty_like(x, dtype=torch.bfloat16)
        zb.zero_()  # bf16: ConstantOfShape lacks it before opset 20, so fp32 zeros, then Cast
        zi = torch.empty(x.shape[0], 2, dtype=torch.int64)
        zi.zero_()
        return acc * 2, zb.float() + 1, zi + 3


def test_zero_fills_in_every_dtype_in_ort():
    dims = {"x": {0: torch.export.Dim("n", min=2, max=64)}}
    ir, ref = _lift(_Zeroed, (torch.randn(8),), dims)
    assert sum(op.op == "aten.zero_.default" for op in ir.ops) == 3
    model = lower_to_onnx(ir)
    fills = [n for n in model.graph.node if n.op_type == "ConstantOfShape"]
    dtypes = {helper.get_attribute_value(a).data_type for n in fills for a in n.attribute}
    assert dtypes == {TensorProto.FLOAT, TensorProto.INT64}, dtypes  # bf16 filled as fp32
    _run_and_compare(ir, ref, [(8,), (13,)], lambda n: (torch.randn(n),), rtol=0, atol=0)


def test_launch_wiring_refuses_tensor_arguments_without_roles():
    from kernel_lens.errors import IRError

    module = load_module(MODEL_PATHS["vector_add"])
    ir = kl.lift(module.model, tuple(module.example_inputs), arch=90,
                 dynamic_shapes=module.dynamic_shapes)  # no passes: no roles yet
    launch = ir.launches[0]
    with pytest.raises(IRError, match=rf"launch {launch.order} \(add_kernel\): tensor arguments \['x_ptr', "
                                      r"'y_ptr', 'out_ptr'\] have no role; run the role-inference"):
        launch_io(ir, launch, "__0")


@triton.jit
def _copy_bytes(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class _ZerosLikeFp8(torch.nn.Module):
    def forward(self, x):
        out = torch.zeros_like(x)  # Cast(0) then Expand: Expand takes no float8 in ONNX
        _copy_bytes[(1,)](x, out, x.numel(), BLOCK=64)
        return out


def test_an_fp8_expand_is_widened_so_the_graph_type_checks():
    x = torch.randn(32).to(torch.float8_e4m3fn)
    ir = kl.compile(_ZerosLikeFp8(), (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2, max=64)},),
                    arch=90).ir
    model = lower_to_onnx(ir, opset=23)
    expands = [n for n in model.graph.node if n.op_type == "Expand"]
    assert expands and all(n.input[0].endswith(".fp32") for n in expands)
    # ONNX Runtime refused the graph ("Type 'tensor(float8e4m3fn)' ... of operator (Expand) is
    # invalid"); onnx's strict type check refuses it the same way
    onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)


def test_the_lowering_cache_is_keyed_by_opset():
    from kernel_lens.onnx.lower import lower_to_onnx_cached

    toy = load_module(EXAMPLES / "toy_two_kernels.py")
    ir = kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90).ir
    for opset in (18, 23, 18):  # the second 18 comes from the cache: still opset 18
        model = lower_to_onnx_cached(ir, opset=opset)
        assert {o.domain: o.version for o in model.opset_import}[""] == opset


class _TransposedWeight(_Kernels):
    """A weight stored transposed (strides [1, 5] for shape [5, 3], as quantization libraries
    keep theirs) read flat by a kernel, which reads its memory order, and by a torch op."""

    def __init__(self, triton_kernels: bool = True):
        super().__init__(triton_kernels)
        self.w = torch.nn.Parameter(torch.arange(15.0).reshape(3, 5).t(), requires_grad=False)

    def forward(self, x):  # x: (n,)
        flat = torch.empty(15)
        if self.triton_kernels:
            _copy_kernel[(1,)](self.w, flat, 15, BLOCK=16)
        else:
            flat = self.w.t().reshape(-1).clone()  # the storage: what the kernel reads
        return flat.sum() + x, self.w * 2


def test_a_kernel_reading_a_transposed_weight_reads_its_memory_order_in_ort():
    assert not _TransposedWeight().w.is_contiguous()
    ir, ref = _lift(_TransposedWeight, (torch.randn(4),), {"x": {0: torch.export.Dim("n", min=2, max=64)}})
    model = lower_to_onnx(ir)
    launch = next(n for n in model.graph.node if n.domain == "kernel_lens")
    weights = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    bound = weights[launch.input[0]]  # the Transpose to memory order, folded into a weight
    np.testing.assert_array_equal(bound, np.arange(15.0).reshape(3, 5))
    _run_and_compare(ir, ref, [(4,), (9,)], lambda n: (torch.randn(n),))


def test_a_kernel_writing_a_transposed_tensor_is_rejected():
    _, ir = _compiled("vector_add")
    doc = ir.model_dump()
    out = next(a["value"] for a in doc["launches"][0]["args"] if a.get("role") == "output")
    assert doc["values"][out]["kind"] != "constant"
    doc["values"][out]["shape"], doc["values"][out]["strides"] = ["n", "2"], ["1", "n"]
    for arg in doc["launches"][0]["args"]:
        if arg.get("value") == out:
            arg["shape"], arg["strides"] = ["n", "2"], ["1", "n"]
    with pytest.raises(UnsupportedKernelError, match="not dense row-major"):
        lower_to_onnx(GraphIR.model_validate(doc))


class _ResultType(_Kernels):
    """torch.result_type in the forward (FlagGems' where): a dtype known at trace time."""

    def forward(self, x):
        dtype = torch.result_type(x, torch.ones(1, dtype=torch.float64))  # float64
        return self.copy(x).to(dtype) * 2


def test_a_dtype_computed_in_the_forward_is_a_constant_in_ort():
    ir, ref = _lift(_ResultType, (torch.randn(6),), {"x": {0: torch.export.Dim("n", min=2, max=64)}})
    assert any("to" in op.op for op in ir.ops) and not any("result_type" in op.op for op in ir.ops)
    _run_and_compare(ir, ref, [(6,), (11,)], lambda n: (torch.randn(n),))
