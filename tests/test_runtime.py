"""The run path on the CPU host: exact shape evaluators, backend choice through the targets'
runners, compile without a folder (content-addressed cache), save and load."""

from __future__ import annotations

import json

import pytest
import sympy
import torch
from hypothesis import assume, given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.errors import KernelLensError, SymbolicError
from kernel_lens.ir import evaluate, format_expr, parse, symbol
from kernel_lens.runtime.evaluate import evaluator
from kernel_lens.targets.base import Target, get_target

from conftest import EXAMPLES, eager_on_cpu, load_module

n, m = symbol("n"), symbol("m")
leaf = st.one_of(st.sampled_from([n, m]), st.integers(-50, 300).map(sympy.Integer))
ints = st.recursive(leaf, lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
    st.tuples(inner, st.integers(1, 3)).map(lambda t: t[0] ** t[1]),
    st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.floor(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.ceiling(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.Mod(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Min(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Max(t[0], t[1])),
), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(expr=ints, nv=st.integers(0, 2 ** 62), mv=st.integers(0, 2 ** 40))
def test_evaluator_is_exact_for_any_size(expr, nv, mv):
    try:
        expr = parse(format_expr(expr))  # as the runtime sees it: read back from the IR
    except SymbolicError as exc:  # a size past the 8th power is outside the IR grammar
        assume("a size to the power" not in str(exc))
        raise
    try:
        want = evaluate(expr, {"n": nv, "m": mv})
    except KernelLensError:  # sympy may fold the strategy's output into a non-integer
        with pytest.raises(KernelLensError, match="not an integer"):
            evaluator(expr, ["n", "m"])([nv, mv])
        return
    assert evaluator(expr, ["n", "m"])([nv, mv]) == want


def test_evaluator_refuses_non_integer_results():
    with pytest.raises(KernelLensError):
        evaluator(n / 2, ["n"])([3])
    assert evaluator(n / 2, ["n"])([4]) == 2


toy = load_module(EXAMPLES / "toy_two_kernels.py")


@pytest.fixture(scope="module")
def cached(ort_headers):
    return kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                      targets=["ort"])


def test_compile_without_a_folder_builds_into_the_cache(cached):
    from kernel_lens.compiler import artifact_cache_dir

    root = artifact_cache_dir()
    assert cached.artifacts["ort.library"].is_file()
    assert cached.artifacts["ort.onnx"].resolve().is_relative_to(root.resolve())
    again = kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                       targets=["ort"])
    assert again.artifacts == cached.artifacts  # same content key: the same folder, reused
    assert again.ir == cached.ir


def test_save_copies_the_artifacts_and_load_reads_them(cached, tmp_path):
    saved = cached.save(tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / "kernel_lens.json").read_text())
    assert set(manifest["artifacts"]) == set(cached.artifacts)
    for kind, path in saved.artifacts.items():
        assert path.parent == tmp_path / "saved"
        assert path.read_bytes() == cached.artifacts[kind].read_bytes()
    assert saved.ir == cached.ir and saved.folder == tmp_path / "saved"  # the returned model
    loaded = kl.load(tmp_path / "saved", cuda_graph=True)
    assert loaded.ir == cached.ir and loaded.cuda_graph
    assert kl.load(cached.artifacts["ir"].parent).ir == cached.ir  # the cache folder loads too


def test_backend_choice(cached, monkeypatch):
    assert cached.backends() == ["ort"]
    with pytest.raises(KernelLensError, match="not built for backend 'trt-v3'"):
        cached.run(*toy.example_inputs, backend="trt-v3")
    bare = kl.CompiledModel(cached.ir)
    with pytest.raises(KernelLensError, match="no target was built"):
        bare.runner()
    # CPU tensors are evaluated on the CPU (the graph the ORT target would write) and equal eager
    eager = eager_on_cpu(toy.model, toy.example_inputs)
    got = bare.run(*[t.clone() for t in toy.example_inputs])
    for g, e in zip(got, eager):
        assert torch.equal(g, e)
    # The runner comes from the target (no backend names in the driver): a registered target's.
    seen = {}

    class Echo(Target):
        name = "echo"

        def build(self, ir, out_dir):
            return {}

        def runner(self, ir, artifacts, **options):
            seen.update(artifacts=artifacts, options=options)

            class R:
                def run(self, *tensors, out=None):
                    return ("echo", len(tensors))
            return R()

    kl.register_target(Echo)
    model = kl.CompiledModel(cached.ir, artifacts={**cached.artifacts, "echo.file": cached.artifacts["ir"]})
    with pytest.raises(KernelLensError, match="pick one with backend="):
        model.run(*toy.example_inputs)
    assert model.run(*toy.example_inputs, backend="echo", cuda_graph=True) == ("echo", 2)
    assert seen == {"artifacts": {"file": cached.artifacts["ir"]}, "options": {"cuda_graph": True}}


def test_ort_runner_without_cuda_ep_is_a_clear_error(cached):
    with pytest.raises(KernelLensError, match="CUDAExecutionProvider|onnxruntime-gpu"):
        cached.runner()
    with pytest.raises(KernelLensError, match="unknown options"):
        get_target("ort").runner(cached.ir, {}, speed="fast")


# --- behaviours an audit found untested (issue 31) -----------------------------------------------
class _FakeGraphDriver:
    """Just the CUDA driver calls ``runtime.cuda_graph`` makes, over graphs given as data: graph
    -> node handles, node -> CUgraphNodeType, child-graph nodes -> their graph, copy nodes -> the
    memory type of their source."""

    def __init__(self, graphs, kinds, children, copies):
        self.graphs, self.kinds, self.children, self.copies = graphs, kinds, children, copies

    def cuGraphGetNodes(self, graph, nodes, count):
        listed = self.graphs[graph.value]
        if nodes is not None:
            for i, node in enumerate(listed):
                nodes[i] = node
        count._obj.value = len(listed)
        return 0

    def cuGraphNodeGetType(self, node, kind):
        kind._obj.value = self.kinds[node.value]
        return 0

    def cuGraphChildGraphNodeGetGraph(self, node, child):
        child._obj.value = self.children[node.value]
        return 0

    def cuGraphMemcpyNodeGetParams(self, node, params):
        memory_type, nbytes = self.copies[node.value]
        params._obj.srcMemoryType, params._obj.WidthInBytes = memory_type, nbytes
        return 0

    def cuPointerGetAttribute(self, value, attribute, pointer):
        return 1  # not asked for: every copy here names its memory type


def test_host_work_two_child_graphs_deep_is_found(monkeypatch):
    from kernel_lens.runtime import cuda_graph

    # graph 1: a kernel and a child graph (2); graph 2: a device copy and a child graph (3);
    # graph 3: a host callback and a copy from host memory
    fake = _FakeGraphDriver(graphs={1: [10, 11], 2: [20, 21], 3: [30, 31]},
                            kinds={10: 0, 11: 4, 20: 1, 21: 4, 30: 3, 31: 1},
                            children={11: 2, 21: 3}, copies={20: (2, 64), 31: (1, 256)})
    monkeypatch.setattr(cuda_graph, "_driver", lambda: fake)
    assert cuda_graph.host_dependencies(1) == ["a host callback", "a copy of 256 bytes from host memory"]
    assert cuda_graph.node_kinds(1) == {"kernel": 1, "graph": 2, "memcpy": 2, "host": 1}
    assert cuda_graph.host_dependencies(2) == cuda_graph.host_dependencies(1)
    fake.kinds[30] = 0
    fake.copies[31] = (2, 256)  # device memory only: nothing to refuse
    assert cuda_graph.host_dependencies(1) == []


def test_cuda_graph_true_means_the_torch_graph():
    from kernel_lens.errors import InputError
    from kernel_lens.runtime.ort import graph_mode

    assert graph_mode(True) == "torch"  # as docs/ort.md documents
    assert (graph_mode(False), graph_mode(None), graph_mode("ort")) == (None, None, "ort")
    with pytest.raises(InputError, match="cuda_graph='cuda'"):
        graph_mode("cuda")


def test_out_tensors_sharing_memory_with_each_other_are_refused():
    import torch

    from conftest import CORPUS
    from kernel_lens.errors import InputError
    from kernel_lens.runtime.signature import CallSignature

    two = load_module(CORPUS / "arg_jit_function.py")  # two outputs of one shape
    ir = kl.lift(two.model, tuple(t.clone() for t in two.example_inputs),
                 dynamic_shapes=two.dynamic_shapes, arch=90)
    signature = CallSignature(ir, device_type="cpu")
    x = tuple(t.clone() for t in two.example_inputs)
    shapes = signature.output_shapes(signature.symbol_values(x))
    assert len(shapes) == 2
    outs = [torch.empty(s, dtype=o.dtype) for s, o in zip(shapes, signature.outputs)]
    signature.check_out(outs, shapes, torch.device("cpu"), x)  # separate buffers: accepted
    n0, n1 = outs[0].numel(), outs[1].numel()
    buffer = torch.empty(n0 + n1, dtype=outs[0].dtype)
    for first, second in ((buffer[:n0], buffer[:n1]),            # the same memory
                          (buffer[1:n0 + 1], buffer[:n1])):      # overlapping by all but one
        with pytest.raises(InputError, match=r"out\[1\] shares memory with out\[0\]"):
            signature.check_out([first.view(shapes[0]), second.view(shapes[1])], shapes,
                                torch.device("cpu"), x)
    adjacent = [buffer[:n0].view(shapes[0]), buffer[n0:].view(shapes[1])]
    signature.check_out(adjacent, shapes, torch.device("cpu"), x)  # touching, not sharing


def test_the_compile_cache_is_keyed_by_targets(cached):
    # the 'ort' compile above made a cache entry; a trt-v3 compile of the same model gets its own
    trt = kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                     targets=["trt-v3"])
    assert "trt-v3.library" in trt.artifacts and "ort.library" not in trt.artifacts
    assert trt.artifacts["trt-v3.library"].parent != cached.artifacts["ort.library"].parent


def test_a_graph_mode_name_is_checked_once_by_the_runner_that_has_it(tmp_path):
    """Issue 28: the driver passes cuda_graph through; the ORT runner's vocabulary refuses a bad
    name before opening anything, with the same line from run(), runner() and load()."""
    import kernel_lens as kl
    from kernel_lens.compiler import CompiledModel
    from kernel_lens.errors import InputError

    toy = load_module(EXAMPLES / "toy_two_kernels.py")
    ir = kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes).ir
    files = {"ort.onnx": tmp_path / "m.onnx", "ort.library": tmp_path / "libm.so"}
    for path in files.values():
        path.write_bytes(b"")
    compiled = CompiledModel(ir, artifacts=files)
    lines = set()
    for call in (lambda: compiled.runner("ort", cuda_graph="banana"),
                 lambda: CompiledModel(ir, artifacts=files, cuda_graph="banana").runner()):
        with pytest.raises(InputError) as err:
            call()
        lines.add(str(err.value))
    assert lines == {"cuda_graph='banana': pass True, False, or one of ('torch', 'ort')"}
    with pytest.raises(InputError, match="cuda_graph='banana' with CPU tensors: CUDA graphs need "
                       "CUDA tensors"):  # CPU tensors are evaluated: no graph of any name
        compiled.run(*toy.example_inputs, cuda_graph="banana")
    with pytest.raises(InputError, match=r"cuda_graph=\[1\]: pass True, False or the name"):
        compiled.runner("ort", cuda_graph=[1])
