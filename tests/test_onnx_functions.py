"""Issue 17: the lowered ONNX graph calls no function it does not carry.

torchlib translates some ATen ops with functions that are not trace-only (``aten_log_sigmoid``,
``aten_softplus``, ``aten_amax`` ...): torch's recorder emits a *call* node in the domain
``pkg.onnxscript.torch_lib`` plus the function. Those functions import the default domain at
opset 18; the ORT target lowers at opset 23, and onnx's inliner silently leaves calls to a
function of another opset in place unless it may version-convert it, after which the lowering
dropped ``model.functions``: ONNX Runtime then refused the model ("aten_log_sigmoid(-1) is not a
registered function/op"), while ``onnx.checker`` (which skips unknown domains) passed it.

Checked here: the issue's repro through ``kl.compile(..., targets=["ort"])`` loads in an ORT CPU
session with the generated custom-op library registered; every torchlib op known to produce a
function is inlined at both lowerings' opsets and computes what torch does; ``check_ops`` (run by
every lowering) names a dangling call and the ATen op behind it; every corpus model's and
example's ORT and TensorRT graph passes ``check_ops``. The ORT session over every corpus model's
ORT-target graph is opened in ``tests/test_targets.py``, which already builds each library.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F
import triton
import triton.language as tl
from onnx import helper

import kernel_lens as kl
from kernel_lens.errors import UnsupportedKernelError
from kernel_lens.onnx import DOMAIN, lower_to_onnx
from kernel_lens.onnx.lower import MIN_OPSET, Lowering, check_ops, check_types
from kernel_lens.targets.ort.target import OPSET as ORT_OPSET
from kernel_lens.targets.trt.target import trt_onnx

from conftest import assert_loads_in_ort, corpus_files, example_files, model_ir

MODELS = {p.stem: p for p in [*corpus_files(), *example_files()]}
OPSETS = [ORT_OPSET, MIN_OPSET]  # the ORT target's and the TensorRT target's
TORCHLIB = "pkg.onnxscript.torch_lib"


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


def _launch(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    n = x.numel()
    _double[(triton.cdiv(n, 64),)](x, y, n, BLOCK=64)
    return y


class LogSigmoid(torch.nn.Module):
    """The issue's repro: a Triton launch, then ``F.logsigmoid``."""

    def forward(self, x):
        return F.logsigmoid(_launch(x))


class FunctionOps(torch.nn.Module):
    """Every ATen op here is translated by a torchlib function that is not trace-only."""

    def forward(self, x, w):
        return _function_ops(_launch(x), x, w)


def _function_ops(y, x, w):
    return (F.logsigmoid(y) + F.softplus(y) + F.hardswish(y) + F.mish(y)
                + torch.log1p(y.abs()) + F.selu(y) + F.hardtanh(y) + torch.addcmul(y, y, w)
                + torch.lerp(y, x, 0.3) + torch.amax(y, -1, keepdim=True)
                + torch.amin(y, -1, keepdim=True) + F.glu(torch.cat([y, w], -1), -1)
                + torch.addcdiv(y, w, w.abs() + 1)
                + torch.where(torch.isnan(y) | torch.isinf(y), 0.0, 1.0))


FUNCTION_OPS = {"aten_addcdiv", "aten_addcmul", "aten_amax", "aten_amin", "aten_glu",
                "aten_hardswish", "aten_hardtanh", "aten_isinf", "aten_isnan", "aten_lerp",
                "aten_log1p", "aten_log_sigmoid", "aten_mish", "aten_selu", "aten_softplus"}


def _rows():
    return torch.export.Dim("rows", min=2, max=64)


def _case(cls):
    torch.manual_seed(0)
    n_in = 2 if cls is FunctionOps else 1
    inputs = tuple(torch.randn(4, 8) for _ in range(n_in))
    rows = _rows()
    dynamic = tuple({0: rows} for _ in range(n_in))
    return cls(), inputs, dynamic


_IRS: dict = {}


def _ir(cls):
    if cls not in _IRS:
        model, inputs, dynamic = _case(cls)
        _IRS[cls] = kl.compile(model, inputs, dynamic_shapes=dynamic, arch=90).ir
    return _IRS[cls]


def _assert_standard(model: onnx.ModelProto) -> None:
    """Only standard ops and launch nodes: no function calls, no functions carried."""
    check_ops(model)
    domains = {n.domain for n in model.graph.node}
    assert domains <= {"", DOMAIN}, domains
    assert not model.functions
    assert {o.domain for o in model.opset_import} <= {"", DOMAIN}
    onnx.checker.check_model(model, full_check=True)


def _doubling_launches(model: onnx.ModelProto) -> onnx.ModelProto:
    """The graph with each ``_double`` launch replaced by what it computes (``Mul`` by 2), so ONNX
    Runtime's CPU EP runs the whole graph."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    nodes = []
    for node in model.graph.node:
        if node.domain == DOMAIN:
            assert node.op_type.startswith("_double") and len(node.output) == 1
            two = helper.make_node("Constant", [], [f"{node.name}.two"],
                                   value=helper.make_tensor("v", onnx.TensorProto.FLOAT, [], [2.0]))
            nodes += [two, helper.make_node("Mul", [node.input[0], two.output[0]], list(node.output))]
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [o for o in model.opset_import if o.domain != DOMAIN]
    del model.opset_import[:]
    model.opset_import.extend(kept)
    return model


def _run(model: onnx.ModelProto, inputs) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(["output_0"], dict(zip(names, (t.numpy() for t in inputs))))[0]


# ------------------------------------------------------------------------------ the repro


def test_logsigmoid_ort_target_loads_in_onnxruntime(tmp_path, ort_headers):
    model, inputs, dynamic = _case(LogSigmoid)
    compiled = kl.compile(model, inputs, dynamic_shapes=dynamic, arch=90, targets=["ort"],
                          output_dir=tmp_path)
    path, library = compiled.artifacts["ort.onnx"], compiled.artifacts["ort.library"]
    lowered = onnx.load(str(path))
    assert lowered.opset_import[0].version == ORT_OPSET
    _assert_standard(lowered)
    assert [n.op_type for n in lowered.graph.node if n.domain == ""][-2:] == ["Sigmoid", "Log"]
    # ORT resolves the whole graph: it lacks only a CPU kernel for the launch node
    assert_loads_in_ort(path, library)


@pytest.mark.parametrize("opset", OPSETS)
def test_logsigmoid_is_inlined_and_matches_torch(opset):
    lowered = lower_to_onnx(_ir(LogSigmoid), opset=opset)
    _assert_standard(lowered)
    x = torch.randn(7, 8)  # another row count than the capture's: sizes stay symbolic
    np.testing.assert_allclose(_run(_doubling_launches(lowered), (x,)),
                               F.logsigmoid(2 * x).numpy(), rtol=1e-5, atol=1e-6)


def test_trt_graph_of_logsigmoid_is_inlined():
    _assert_standard(trt_onnx(_ir(LogSigmoid)))


# ------------------------------------------------------------------ every function op


def test_these_ops_are_torchlib_functions():
    """The ops of FunctionOps really reach the lowering as function calls (else the test
    below proves nothing about inlining)."""
    for opset in OPSETS:
        lowering = Lowering(_ir(FunctionOps), opset)
        lowering.run()
        assert {name for _, name, _ in lowering.functions} == FUNCTION_OPS


@pytest.mark.parametrize("opset", OPSETS)
def test_function_ops_are_inlined_and_match_torch(opset):
    lowered = lower_to_onnx(_ir(FunctionOps), opset=opset)
    _assert_standard(lowered)
    x, w = torch.randn(5, 8), torch.randn(5, 8)
    expected = _function_ops(2 * x, x, w)
    np.testing.assert_allclose(_run(_doubling_launches(lowered), (x, w)), expected.numpy(),
                               rtol=1e-4, atol=1e-5)


# ----------------------------------------------------------------------- the check


def test_a_dangling_call_is_named_with_its_aten_op(monkeypatch):
    """Without inlining (the issue's graph: the call kept, its function dropped) the lowering
    refuses the graph and names the call and the ATen op that produced it."""
    monkeypatch.setattr(Lowering, "_inline_functions", lambda self, model: model)
    with pytest.raises(UnsupportedKernelError,
                       match=rf"{TORCHLIB}::aten_log_sigmoid, produced by torch op "
                             rf"aten\.log_sigmoid\.default \(position \d+\),.*opset {ORT_OPSET}"):
        lower_to_onnx(_ir(LogSigmoid), opset=ORT_OPSET)


def _graph(nodes, opset=ORT_OPSET, functions=(), extra_imports=()):
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    imports = [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, 1), *extra_imports]
    return helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=imports,
                             functions=list(functions))


def test_check_ops_accepts_standard_ops_launches_and_carried_functions():
    check_ops(_graph([helper.make_node("Relu", ["x"], ["y"])]))
    check_ops(_graph([helper.make_node("k", ["x"], ["y"], domain=DOMAIN)]))
    fn = helper.make_function("local", "f", ["a"], ["b"], [helper.make_node("Neg", ["a"], ["b"])],
                              [helper.make_opsetid("", ORT_OPSET)])
    check_ops(_graph([helper.make_node("f", ["x"], ["y"], domain="local")], functions=[fn],
                     extra_imports=[helper.make_opsetid("local", 1)]))


@pytest.mark.parametrize("node, opset, what", [
    (helper.make_node("aten_log_sigmoid", ["x"], ["y"], domain=TORCHLIB), ORT_OPSET,
     f"{TORCHLIB}::aten_log_sigmoid"),
    (helper.make_node("NoSuchOp", ["x"], ["y"]), ORT_OPSET, "ai.onnx::NoSuchOp"),
    (helper.make_node("Attention", ["x", "x", "x"], ["y"]), 18, "ai.onnx::Attention"),  # opset 23
])
def test_check_ops_refuses_what_no_runtime_knows(node, opset, what):
    with pytest.raises(UnsupportedKernelError, match=rf"{what}"):
        check_ops(_graph([node], opset=opset))


def test_check_ops_looks_inside_functions():
    fn = helper.make_function("local", "f", ["a"], ["b"],
                              [helper.make_node("aten_log_sigmoid", ["a"], ["b"], domain=TORCHLIB)],
                              [helper.make_opsetid("", ORT_OPSET)])
    with pytest.raises(UnsupportedKernelError, match="function local::f"):
        check_ops(_graph([helper.make_node("f", ["x"], ["y"], domain="local")], functions=[fn],
                         extra_imports=[helper.make_opsetid("local", 1)]))


# ------------------------------------------------------------- every corpus model


@pytest.mark.parametrize("name", sorted(MODELS))
def test_corpus_graphs_hold_standard_ops_and_launches_only(name):
    ir = model_ir(MODELS[name])
    for lowered in (lower_to_onnx(ir, opset=ORT_OPSET), trt_onnx(ir)):
        check_ops(lowered)
        assert {n.domain for n in lowered.graph.node} <= {"", DOMAIN}
        assert not lowered.functions


@pytest.mark.parametrize("opset", OPSETS)
def test_every_torchlib_function_is_inlinable_at_the_targets_opsets(opset):
    """Every torchlib function that is not trace-only reads the same at the target's opset
    (so it is inlined, not shipped): a newer onnxscript or opset that breaks this shows here."""
    from kernel_lens.onnx import torchlib
    from kernel_lens.onnx.lower import _at_opset

    names = set()
    for metas in torchlib.registry(opset).functions.values():
        for meta in metas:
            fn = meta.onnx_function
            if getattr(fn, "traceable", True):
                continue
            proto = _at_opset(fn.to_function_proto(), opset)
            assert {o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")} == {opset}, fn.name
            names.add(fn.name)
    assert FUNCTION_OPS <= names


def test_check_types_refuses_int32_gathernd_indices_and_reads_no_weight_data(monkeypatch):
    """What ORT refuses at load (GatherND indices must be int64) is refused at compile time; the
    check serializes initializer types and dims only (a model past 2 GB could not be)."""
    big = helper.make_tensor("w", onnx.TensorProto.FLOAT, [512, 512], np.zeros(512 * 512, np.float32).tobytes(),
                             raw=True)
    def model(index_type):
        g = helper.make_graph([helper.make_node("GatherND", ["w", "i"], ["y"], name="gather")], "g",
                              [helper.make_tensor_value_info("i", index_type, [2, 1])],
                              [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [big])
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", MIN_OPSET)])
    ok = model(onnx.TensorProto.INT64)
    check_types(ok)
    assert ok.graph.initializer[0].raw_data  # the model itself keeps its weights
    with pytest.raises(UnsupportedKernelError, match="gather.*int32"):
        check_types(model(onnx.TensorProto.INT32))
    real, seen = onnx.shape_inference.infer_shapes, []
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes",
                        lambda m, **kw: seen.append(m.ByteSize()) or real(m, **kw))
    check_types(ok)
    assert seen and seen[0] < 10_000 < ok.ByteSize()


@triton.jit
def _plus_one(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    keep = i < n
    tl.store(o_ptr + i, tl.load(x_ptr + i, mask=keep) + 1, mask=keep)


def _sorts(x, ids):
    """A kernel's result sorted stably both ways, int32 ids with ties sorted, a 2-D sort along
    dim 0, and an unstable sort."""
    o = torch.empty_like(x)
    _plus_one[(1,)](x, o, x.numel(), BLOCK=64)
    down = torch.sort(o, stable=True, descending=True)
    up = torch.sort(ids, stable=True)
    cols = torch.sort(o.view(2, -1), dim=0, stable=True)
    plain = torch.sort(o)
    return (*down, *up, *cols, plain.values)


def test_sort_is_topk_over_the_whole_dim_ties_by_index_and_refuses_nan_at_run_time():
    from kernel_lens.errors import UntracedBranchError
    from conftest import eager_on_cpu

    x = torch.tensor([3., 1., 3., 2., 1., 3.])
    ids = torch.tensor([2, 0, 1, 2, 0, 1, 2, 2], dtype=torch.int32)
    c = kl.compile(_sorts, (x, ids), arch=90)
    def ops(graph):  # the checks nest what follows them in If branches
        for n in graph.node:
            yield n.op_type
            for a in n.attribute:
                if a.type == onnx.AttributeProto.GRAPH:
                    yield from ops(a.g)
    found = list(ops(lower_to_onnx(c.ir, opset=ORT_OPSET).graph))
    assert found.count("TopK") == 4 and found.count("IsNaN") == 3  # no NaN check for ints
    for xs, ii in [(x, ids), (torch.tensor([0., -2., 5., 5., -2., 0.]), torch.tensor([1, 1, 1, 0, 0, 0, 3, 3], dtype=torch.int32))]:
        got, want = c.run(xs.clone(), ii.clone()), eager_on_cpu(_sorts, (xs, ii))
        assert all(torch.equal(a, b) for a, b in zip(got, want))
    with pytest.raises(UntracedBranchError, match=r"torch.sort \(aten.sort.stable, position \d+\) got a NaN"):
        c.run(torch.tensor([1., float("nan"), 0., 2., 1., 1.]), ids.clone())


@pytest.mark.parametrize("elements", [2, 20_000])  # 8 bytes (kept whole), 80 KB (its type only)
def test_check_types_sees_the_type_of_an_initializer_of_any_size(elements):
    """int32 GatherND indices held as an initializer are refused whatever their size: the check
    drops no initializer (small ones stay, larger ones become inputs of their type)."""
    data = helper.make_tensor("data", onnx.TensorProto.FLOAT, [4, 3], np.zeros(12, np.float32).tobytes(), raw=True)
    indices = helper.make_tensor("i", onnx.TensorProto.INT32, [elements, 1],
                                 np.zeros(elements, np.int32).tobytes(), raw=True)
    g = helper.make_graph([helper.make_node("GatherND", ["data", "i"], ["y"], name="gather")], "g", [],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)], [data, indices])
    with pytest.raises(UnsupportedKernelError, match="gather.*int32"):
        check_types(helper.make_model(g, opset_imports=[helper.make_opsetid("", MIN_OPSET)]))
