"""GPU host only: the runtime's CUDA-graph mode and lean run(), against the model run eagerly."""

from __future__ import annotations

import copy

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import InputError

from conftest import CORPUS, EXAMPLES, flatten, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _cuda(module):
    m = module.model
    return copy.deepcopy(m).cuda() if isinstance(m, torch.nn.Module) else m


def _compiled(module, **kw):
    return kl.compile(_cuda(module), [t.cuda() for t in module.example_inputs],
                      dynamic_shapes=module.dynamic_shapes, targets=["ort"], **kw)


MODES = ["torch", "ort"]  # a torch CUDA graph of ORT's Run; ORT's own graph mode


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name,sizes,exact", [
    ("toy_two_kernels", [1000, 4099, 1000, 17, 4099], True),
    ("llama_block", [16, 37, 16, 128, 37], False),
])
def test_cuda_graph_mode_matches_eager_across_shape_changes(name, sizes, exact, mode):
    path = EXAMPLES / f"{name}.py"
    module = load_module(path)
    compiled = _compiled(module)
    model = _cuda(module)
    g = torch.Generator(device="cuda").manual_seed(0)
    previous = []
    for size in sizes:
        inputs = []
        for t in module.example_inputs:
            shape = list(t.shape)
            shape[0 if t.dim() == 1 else 1] = size
            inputs.append(torch.randn(shape, generator=g, device="cuda", dtype=t.dtype))
        ours = flatten(compiled.run(*[t.clone() for t in inputs], cuda_graph=mode))
        ref = flatten(model(*[t.clone() for t in inputs]))
        plain = flatten(compiled.run(*[t.clone() for t in inputs]))
        for a, b, c in zip(ours, ref, plain):
            assert torch.equal(_bits(a), _bits(c)), "graph replay differs from the plain ORT run"
            if exact:
                assert torch.equal(_bits(a), _bits(b))
            else:
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
            print(f"{name} size={size} cuda_graph={mode} max_abs_diff={(a.float() - b.float()).abs().max().item()!r}")
        for kept, again in previous:  # results of earlier calls were not overwritten
            assert torch.equal(kept, again)
        previous.append((ours[0], ours[0].clone()))
    runner = compiled.runner(cuda_graph=mode)
    assert len(next(iter(runner._sessions.values())).graphs) == len(set(sizes))
    if mode == "torch":  # every graph captured once, replayed after
        assert all(g.captured is not None for g in next(iter(runner._sessions.values())).graphs.values())


@pytest.mark.parametrize("mode", [None, *MODES])
def test_cuda_graph_mutating_model_updates_the_callers_tensor(mode):
    module = load_module(CORPUS / "inplace_input.py")
    compiled = _compiled(module)
    for _ in range(3):
        inputs = [torch.randn_like(t.cuda()) if t.is_floating_point() else t.cuda() for t in module.example_inputs]
        mine, ref = [t.clone() for t in inputs], [t.clone() for t in inputs]
        out = flatten(compiled.run(*mine, cuda_graph=mode))
        expected = flatten(_cuda(module)(*ref))
        for a, b in zip(out, expected):
            assert torch.equal(_bits(a), _bits(b))
        for a, b in zip(mine, ref):
            assert torch.equal(_bits(a), _bits(b))


def test_inplace_inputs_are_bound_as_their_own_output():
    """The model's written input is updated in the caller's buffer: no copy back, and the
    binding of mutated_<input> is the input's own pointer."""
    module = load_module(CORPUS / "inplace_input.py")
    compiled = _compiled(module)
    runner = compiled.runner()
    assert runner.in_place, "inplace_input's written input should be updated in place"
    inputs = [torch.randn_like(t.cuda()) if t.is_floating_point() else t.cuda() for t in module.example_inputs]
    ref = [t.clone() for t in inputs]
    out = flatten(compiled.run(*inputs))
    expected = flatten(_cuda(module)(*ref))
    for a, b in zip(out + inputs, expected + ref):
        assert torch.equal(_bits(a), _bits(b))
    state = next(iter(runner._sessions.values()))
    for name in runner.in_place:
        i = compiled.ir.inputs.index(name)
        assert state.bound[f"mutated_{name}"][0] == inputs[i].data_ptr()


def test_a_written_input_passed_twice_is_refused_in_one_line():
    """Issue 30 item 10: the same tensor as the written input and as another input (or a view
    overlapping it) is refused before the launch; separate tensors run."""
    module = load_module(CORPUS / "inplace_input.py")
    compiled = _compiled(module)
    base = torch.randn(1000, device="cuda")
    y = base[:600]
    for other in (y, base[:600], base[300:900]):  # itself, an alias, an overlapping view
        with pytest.raises(InputError, match="written in place by the model and shares memory") as err:
            compiled.run(y, other)
        assert "\n" not in str(err.value)
    x = torch.randn(600, device="cuda")
    ref = y + module.Model.alpha * x
    compiled.run(y, x)
    assert torch.equal(_bits(y), _bits(ref))


def test_cuda_ep_views_of_a_written_input_read_after_the_writer_are_not_bound_in_place():
    """Issue 30 item 10: on the CUDA EP a Reshape of the written input is its buffer (Alias(0,0));
    bound in place, a reader after the writer sees the new contents. The rule keeps such an input
    out of place; a view read only before the writer stays in place and exact."""
    import numpy as np
    import onnxruntime as ort

    import test_aliasing as cases
    from kernel_lens.onnx.aliasing import in_place_inputs

    def run(model, alias):
        session = ort.InferenceSession(model.SerializeToString(), providers=["CUDAExecutionProvider"])
        x = torch.arange(12, dtype=torch.float32, device="cuda").reshape(cases.SHAPE)
        out = torch.empty_like(x)
        mutated = x if alias else torch.empty_like(x)
        binding = session.io_binding()
        binding.bind_input("x", "cuda", 0, np.float32, list(x.shape), x.data_ptr())
        binding.bind_output("output_0", "cuda", 0, np.float32, list(out.shape), out.data_ptr())
        binding.bind_output("mutated_x", "cuda", 0, np.float32, list(x.shape), mutated.data_ptr())
        session.run_with_iobinding(binding)
        torch.cuda.synchronize()
        return out.cpu(), mutated.cpu()

    hazard = cases._model(cases.VIEW_HAZARDS["view_read_after_writer"], ["output_0", "mutated_x"])
    assert in_place_inputs(hazard) == set()
    copied, aliased = run(hazard, False), run(hazard, True)
    print(f"cuda ep view hazard: out-of-place vs bound max_abs_diff={(copied[0] - aliased[0]).abs().max().item()}")
    assert not torch.equal(copied[0], aliased[0]), "the CUDA EP no longer aliases Reshape"
    nodes = [cases._SHAPE43, cases.helper.make_node("Reshape", ["x", "shape43"], ["v"]),
             cases.helper.make_node("ReduceSum", ["v", "ax"], ["row"], keepdims=1),
             cases.helper.make_node("ScatterND", ["x", "idx", "row"], ["mutated_x"]),
             cases.helper.make_node("Add", ["row", "one"], ["o"]),
             cases.helper.make_node("Expand", ["o", "shape43"], ["output_0"])]
    safe = cases._model(nodes, ["output_0", "mutated_x"])
    assert in_place_inputs(safe) == {"x"}
    copied, aliased = run(safe, False), run(safe, True)
    assert torch.equal(copied[0], aliased[0]) and torch.equal(copied[1], aliased[1])
    print("cuda ep view read before the writer: bound in place, max_abs_diff=0.0")


@pytest.mark.parametrize("mode", MODES)
def test_static_buffers_make_a_call_copy_nothing(mode):
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = _compiled(module)
    x, y = (t.cuda() for t in module.example_inputs)
    runner = compiled.runner(cuda_graph=mode)
    ins, outs = runner.cuda_graph_buffers(x, y)
    for step in range(3):
        ins[0].copy_(torch.randn_like(x))
        ins[1].copy_(torch.randn_like(y))
        got = compiled.run(*ins, out=outs, cuda_graph=mode)
        assert got.data_ptr() == outs[0].data_ptr()
        expected = _cuda(module)(ins[0].clone(), ins[1].clone())
        assert torch.equal(got, expected), step


def test_lean_run_rebinds_only_what_changed():
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = _compiled(module)
    x, y = (t.cuda() for t in module.example_inputs)
    out = torch.empty_like(x)
    compiled.run(x, y, out=[out])
    runner = compiled.runner()
    state = next(iter(runner._sessions.values()))
    calls = []
    real = state.binding.bind_input
    state.binding.bind_input = lambda *a: (calls.append(a[0]), real(*a))
    compiled.run(x, y, out=[out])
    assert calls == []  # same pointers and shapes: nothing rebound
    x2 = x.clone()
    compiled.run(x2, y, out=[out])
    assert calls == ["x"]
    assert torch.equal(out, _cuda(module)(x2, y))


# --- what makes a torch graph of ORT's Run unsafe to replay, and the clear errors -------------

def _graph_with(kind: str) -> int:
    """A CUgraph made with the driver API holding one node: a copy from host memory, a copy
    between device buffers, or a host callback; the caller destroys it."""
    import ctypes

    from kernel_lens.runtime import cuda_graph as G

    cuda = G._driver()
    torch.zeros(1, device="cuda")  # a current context
    graph, node, ctx = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert cuda.cuGraphCreate(ctypes.byref(graph), 0) == 0
    assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    if kind == "host callback":
        callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: None)
        _graph_with.keep = callback  # alive while the graph is

        class HostParams(ctypes.Structure):  # CUDA_HOST_NODE_PARAMS
            _fields_ = [("fn", ctypes.c_void_p), ("userData", ctypes.c_void_p)]

        params = HostParams(ctypes.cast(callback, ctypes.c_void_p), None)
        assert cuda.cuGraphAddHostNode(ctypes.byref(node), graph, None, ctypes.c_size_t(0),
                                       ctypes.byref(params)) == 0
        return graph.value
    dst = torch.empty(256, device="cuda")
    src = torch.ones(256).pin_memory() if kind == "host copy" else torch.ones(256, device="cuda")
    _graph_with.keep = (dst, src)
    p = G._Memcpy3D()
    p.WidthInBytes, p.Height, p.Depth = 1024, 1, 1
    p.srcPitch = p.dstPitch = 1024
    p.srcHeight = p.dstHeight = 1
    if kind == "host copy":
        p.srcMemoryType, p.srcHost = 1, src.data_ptr()  # CU_MEMORYTYPE_HOST
    else:
        p.srcMemoryType, p.srcDevice = 2, src.data_ptr()  # CU_MEMORYTYPE_DEVICE
    p.dstMemoryType, p.dstDevice = 2, dst.data_ptr()
    assert cuda.cuGraphAddMemcpyNode(ctypes.byref(node), graph, None, ctypes.c_size_t(0),
                                     ctypes.byref(p), ctx) == 0
    return graph.value


@pytest.mark.parametrize("kind,found", [("host copy", "a copy of 1024 bytes from host memory"),
                                        ("host callback", "a host callback"),
                                        ("device copy", None)])
def test_host_dependencies_finds_what_a_replay_would_redo_on_the_host(kind, found):
    import ctypes

    from kernel_lens.runtime.cuda_graph import _driver, host_dependencies, node_kinds

    graph = _graph_with(kind)
    try:
        assert host_dependencies(graph) == ([found] if found else [])
        assert node_kinds(graph) == {"host" if kind == "host callback" else "memcpy": 1}
    finally:
        _driver().cuGraphDestroy(ctypes.c_void_p(graph))


def test_a_graph_with_host_work_is_refused_with_a_clear_error(monkeypatch):
    """The runtime's check of the captured graph (here made to report a host callback, as ORT's
    deferred release of pinned buffers would be): a KernelLensError naming what was found and
    the way out; nothing is replayed."""
    import kernel_lens.runtime.ort as runtime_ort

    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = _compiled(module)
    x, y = (t.cuda() for t in module.example_inputs)
    monkeypatch.setattr(runtime_ort, "host_dependencies", lambda graph: ["a host callback"])
    with pytest.raises(kl.KernelLensError, match=r"on the host inside the captured graph \(a host "
                                                 r"callback\).*cuda_graph='ort'"):
        compiled.run(x, y, cuda_graph="torch")
    monkeypatch.undo()
    assert torch.equal(compiled.run(x, y, cuda_graph=False), _cuda(module)(x, y))


# --- issue 39's GPU pins ------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_a_static_buffer_re_pointed_or_resized_in_place_is_not_replayed_blindly(mode):
    """Item 9: the fast path replays the last graph only for the very same tensors with the same
    pointers and shapes; a static input re-pointed (``set_``) or resized (``resize_``) in place
    is the same tensor object but another buffer: the call must compute on what it now holds."""
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = _compiled(module)
    x, y = (t.cuda() for t in module.example_inputs)
    runner = compiled.runner(cuda_graph=mode)
    ins, outs = runner.cuda_graph_buffers(x, y)
    ins[0].copy_(x)
    ins[1].copy_(y)
    compiled.run(*ins, out=outs, cuda_graph=mode)
    fresh = torch.randn_like(x)
    ins[0].set_(fresh.clone())  # re-pointed: the graph's static buffer is no longer its memory
    got = compiled.run(*ins, out=outs, cuda_graph=mode)
    assert torch.equal(got, _cuda(module)(ins[0].clone(), ins[1].clone()))
    n = x.shape[0] // 2
    ins[0].resize_(n)
    ins[1].resize_(n)
    small = [torch.empty(n, device="cuda") for _ in outs]
    got = compiled.run(*ins, out=small, cuda_graph=mode)
    assert got.shape == (n,) and torch.equal(got, _cuda(module)(ins[0].clone(), ins[1].clone()))


def test_on_the_legacy_default_stream_ort_waits_for_the_callers_earlier_work():
    """Item 10: the caller's default stream is busy (a long sleep, then the input's new values);
    ORT runs on a side stream that must wait for that work before reading the input."""
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    compiled = _compiled(module)
    x, y = (t.cuda() for t in module.example_inputs)
    compiled.run(x, y)  # sessions, modules: made before the timed part
    with torch.cuda.stream(torch.cuda.default_stream()):
        for _ in range(3):
            new = torch.randn_like(x)
            torch.cuda.synchronize()
            torch.cuda._sleep(50_000_000)  # ~25 ms of GPU time on the default stream
            x.copy_(new)                   # the input's new values, after the sleep
            got = compiled.run(x, y)
            torch.cuda.synchronize()
            assert torch.equal(got, _cuda(module)(new, y))


def test_a_first_launch_inside_a_capture_still_gives_cublas_its_workspace_later():
    """Item 16: kl_ort.cpp gives the cuBLAS handle ORT runs GEMMs with a workspace of its own at
    a kernel instance's first launch outside a stream capture (inside one nothing may be
    allocated). A session whose first Run is captured by the caller gives it at the next plain
    launch: a later capture then holds no memory alloc/free node (cuBLAS's cudaMallocAsync)."""
    from kernel_lens.runtime.cuda_graph import node_kinds

    module = load_module(EXAMPLES / "llama_block.py")  # ORT MatMuls (cuBLAS) and Triton kernels
    compiled = _compiled(module)
    inputs = [t.cuda() for t in module.example_inputs]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    # ORT synchronizes the device while it opens a session: open this stream's session first
    compiled.runner().session(torch.cuda.current_device(), stream.cuda_stream)
    first = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(first, stream=stream, capture_error_mode="relaxed"):
        compiled.run(*inputs)  # the session's first Run: every kernel's first launch is captured
    kinds = node_kinds(first.raw_cuda_graph())
    assert "mem_alloc" in kinds, kinds  # the premise: a handle without a workspace allocates
    with torch.cuda.stream(stream):
        want = compiled.run(*inputs)  # outside a capture: the handle gets its workspace now
    stream.synchronize()
    again = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(again, stream=stream, capture_error_mode="relaxed"):
        got = compiled.run(*inputs)
    kinds = node_kinds(again.raw_cuda_graph())
    print(f"llama_block captured after a captured first Run: {kinds}")
    assert kinds.get("kernel", 0) > 3
    assert "mem_alloc" not in kinds and "mem_free" not in kinds, kinds
    again.replay()
    torch.cuda.synchronize()
    for a, b in zip(flatten(got), flatten(want)):
        assert torch.equal(_bits(a), _bits(b))


@pytest.mark.parametrize("mode", MODES)
def test_pdl_and_cooperative_launches_replay_in_a_cuda_graph(mode):
    """Launches through cuLaunchKernelEx (``launch_pdl``, ``launch_cooperative_grid``) captured
    in a CUDA graph and replayed: bit-identical to the model run by Triton at each size, a size
    seen before replays its graph, and the torch graph holds the model's three kernels."""
    module = load_module(CORPUS / "arg_launch_attrs.py")
    compiled = _compiled(module)
    g = torch.Generator(device="cuda").manual_seed(0)
    sizes = [1000, 1 << 16, 1000, 4099, 1 << 16]
    for n in sizes:
        x = torch.randn(n, generator=g, device="cuda")
        got = flatten(compiled.run(x.clone(), cuda_graph=mode))
        ref = flatten(module.model(x.clone()))
        assert len(got) == len(ref) == 2
        for a, b in zip(got, ref):
            assert torch.equal(_bits(a), _bits(b)), (mode, n)
        print(f"arg_launch_attrs n={n} cuda_graph={mode} bit_identical=True")
    runner = compiled.runner(cuda_graph=mode)
    graphs = next(iter(runner._sessions.values())).graphs
    assert len(graphs) == len(set(sizes))
    if mode == "torch":
        from kernel_lens.runtime.cuda_graph import node_kinds

        kinds = node_kinds(runner._last.captured.raw_cuda_graph())
        print(f"arg_launch_attrs captured graph nodes: {kinds}")
        assert kinds.get("kernel", 0) == 3, kinds
