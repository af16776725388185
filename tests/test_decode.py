"""A LLaMA decode step with a static KV cache (examples/llama_decode.py), compiled by kernel_lens.

On this CPU-only host: the eager step is checked against transformers' own full forward (logits
and the KV cache it builds), the compiled IR and ONNX graph are checked for what a decode step
needs (one cache input per layer and k/v, each written in place by exactly one
``kv_cache_write_kernel`` launch whose node output is the graph output ``mutated_caches_<i>`` and
which is the input's only reader, the structure the runtime binds in place; ``position`` is a
graph input feeding both the cache writes and the attention mask), and the ONNX graph is run by
ONNX Runtime's CPU EP with the four Triton kernels replaced by equivalent ONNX functions, against
the eager step, at several batches and positions. One tiny compile (batch 2, dynamic batch,
stopped at the ORT target's ``emit`` stage) is shared by the whole file.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens import aten_facts
from kernel_lens.codegen.launch_io import root_of
from kernel_lens.onnx.lower import DOMAIN

from conftest import EXAMPLES, load_module, with_reference_kernels

D = load_module(EXAMPLES / "llama_decode.py")
K = load_module(EXAMPLES / "_hf_kernels.py")
BATCH = 2  # compiled with a dynamic batch: an example dim of 1 would be specialized
LAYERS = 2  # the tiny config
CACHES = [f"caches_{i}" for i in range(2 * LAYERS)]  # k_cache_0, v_cache_0, k_cache_1, v_cache_1


@pytest.fixture(scope="module")
def reference():
    """The same weights with HF's own torch norms, MLP and RoPE (no Triton: runs on the CPU)."""
    return D.LlamaDecodeStep("tiny", triton=False)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    model = D.LlamaDecodeStep("tiny")
    inputs = D.make_inputs(model, BATCH, position=5)
    before = tuple(t.clone() for t in inputs)
    out = tmp_path_factory.mktemp("kl_decode")
    result = kl.compile(model, inputs, dynamic_shapes=D.dynamic_shapes_for(BATCH, LAYERS),
                        arch=90, roles=D.roles, targets=["ort"], output_dir=out, stop_after="emit")
    return result, before, inputs


@pytest.fixture(scope="module")
def onnx_model(compiled):
    return onnx.load(str(compiled[0].artifacts["ort.onnx"]))


def _clone(inputs):
    return tuple(t.clone() for t in inputs)


# ------------------------------------------------------------------------------ eager step


def test_eager_step_matches_transformers_full_forward(reference):
    """Prefill token by token through the step == HF's full forward: same logits at every prompt
    position, and the static cache holds exactly the keys/values HF's own cache holds."""
    prompt = torch.randint(0, 1024, (2, 7), generator=torch.Generator().manual_seed(1))
    caches = reference.new_caches(2)
    assert len(caches) == 2 * LAYERS and caches[0].shape == (2, 4, 64, 32)  # HF StaticCache layout
    logits = []
    D.greedy_decode(reference, prompt, 1, caches, on_step=lambda step, out: logits.append(out))
    with torch.no_grad():
        full = reference.hf(prompt, use_cache=True)
    torch.testing.assert_close(torch.stack(logits, 1), full.logits, rtol=1e-4, atol=1e-4)
    cache = getattr(full, "cache", None) or full.past_key_values
    assert len(cache.layers) == LAYERS
    for i, layer in enumerate(cache.layers):
        k_cache, v_cache = caches[2 * i], caches[2 * i + 1]
        torch.testing.assert_close(k_cache[:, :, :7], layer.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache[:, :, :7], layer.values, rtol=1e-5, atol=1e-5)
    assert not any(c[:, :, 7:].any() for c in caches)  # untouched slots


def test_eager_greedy_loop_is_deterministic_and_agrees_with_full_forward(reference):
    prompt = torch.randint(0, 1024, (2, 4), generator=torch.Generator().manual_seed(2))
    tokens = D.greedy_decode(reference, prompt, 12, reference.new_caches(2))
    assert tokens.shape == (2, 12) and tokens.dtype == torch.int64
    assert torch.equal(tokens, D.greedy_decode(reference, prompt, 12, reference.new_caches(2)))
    with torch.no_grad():  # each generated token is the argmax of the full forward before it
        full = reference.hf(torch.cat([prompt, tokens[:, :-1]], 1)).logits
    assert torch.equal(full[:, 3:].argmax(-1), tokens)
    with pytest.raises(ValueError, match="do not fit"):
        D.greedy_decode(reference, prompt, reference.max_len, reference.new_caches(2))


@pytest.mark.parametrize("position", [0, 5, 63])
def test_eager_step_writes_only_the_slot_at_position(reference, position):
    inputs = D.make_inputs(reference, 2, position=position)
    before = _clone(inputs[2:])
    with torch.no_grad():
        reference(*inputs)
    _assert_only_slot_changed(inputs[2:], before, position)


def _changed_positions(new, old) -> list[int]:
    """Cache positions (dim 2 of [B, kv_heads, max_len, hd]) where ``new`` differs from ``old``."""
    return (new != old).transpose(1, 2).flatten(2).any(-1).any(0).nonzero().flatten().tolist()


def _assert_only_slot_changed(caches, before, position):
    assert len(caches) == len(before) == 2 * LAYERS
    for new, old in zip(caches, before):
        assert _changed_positions(torch.as_tensor(new), torch.as_tensor(old)) == [position]


# ------------------------------------------------------------------------------ capture and IR


def test_capture_runs_the_triton_kernels_and_matches_the_reference(compiled, reference):
    result, before, after = compiled
    counts = collections.Counter(result.ir.kernels[launch.kernel].name for launch in result.ir.launches)
    layers = reference.n_layers
    assert counts == {"rmsnorm_kernel": 2 * layers + 1, "rope_kernel": layers,
                      "silu_mul_kernel": layers, "kv_cache_write_kernel": 2 * layers}
    ref_inputs = _clone(before)
    with torch.no_grad():
        want = reference(*ref_inputs)
    # the patched forward (kernels in Triton's interpreter) during capture: same logits, and the
    # cache kernel updated the example caches in place the way the reference did, at position 5
    torch.testing.assert_close(result.example_outputs, want, rtol=1e-4, atol=1e-4)
    for got, ref in zip(after[2:], ref_inputs[2:], strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    _assert_only_slot_changed(after[2:], before[2:], 5)


def test_cache_kernel_role_is_inplace(compiled):
    """The kernel only stores to ``cache_ptr`` (inference alone says ``output``); the model file's
    ``roles`` override makes it ``inplace``: the cache is partially written and keeps the rest."""
    kernel = next(k for k in compiled[0].ir.kernels.values() if k.name == "kv_cache_write_kernel")
    roles = {p.name: (p.role.value, p.role_source) for p in kernel.params if p.role is not None}
    assert roles == {"cache_ptr": ("inplace", "override"), "new_ptr": ("input", "inferred"),
                     "pos_ptr": ("input", "inferred")}
    assert D.roles == {"kv_cache_write_kernel": {"cache_ptr": "inplace"}}
    from kernel_lens.passes.role_inference import _Analysis

    inferred = _Analysis(kernel).run()  # what inference alone gives
    assert inferred["cache_ptr"].value == "output"


def test_ir_keeps_position_and_caches_as_graph_inputs(compiled):
    ir = compiled[0].ir
    assert ir.inputs == ["input_ids", "position", *CACHES]
    # the only symbol is the batch (dim 0 of input_ids): no dim of a cache or position is one
    assert [(ir.inputs[s.input], s.dim) for s in ir.symbols.values()] == [("input_ids", 0)]
    # no torch op writes a cache (no index_put_/index_copy_/copy_): only the Triton kernel does
    assert not [op.op for op in ir.ops if aten_facts.is_inplace(op.op)]
    writes = [launch for launch in ir.launches
              if ir.kernels[launch.kernel].name == "kv_cache_write_kernel"]
    args = [{a.name: a for a in launch.args} for launch in writes]
    # one in-place write per cache input, into the whole input (not a view of it) ...
    assert [a["cache_ptr"].value for a in args] == CACHES
    assert all(a["cache_ptr"].role == "inplace" for a in args)
    # ... at the ``position`` input itself (read on the device), not a constant
    assert [root_of(ir, a["pos_ptr"].value) for a in args] == ["position"] * len(CACHES)


def test_onnx_graph_inputs_outputs_and_validity(compiled, onnx_model):
    onnx.checker.check_model(onnx_model, full_check=True)
    graph = onnx_model.graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}
    assert [v.name for v in graph.input] == ["input_ids", "position", *CACHES]
    assert [v.name for v in graph.output] == ["output_0", *(f"mutated_{c}" for c in CACHES)]
    assert dims["position"] == [1]
    for c in CACHES:
        assert dims[c] == dims[f"mutated_{c}"] == ["batch", 4, 64, 32]
    assert dims["output_0"] == ["batch", 1024]
    assert not any(init.name == "position" for init in graph.initializer)
    launches = collections.Counter(compiled[0].ir.kernels[n.op_type].name
                                   for n in graph.node if n.domain == DOMAIN)
    assert launches == {"rmsnorm_kernel": 5, "rope_kernel": 2, "silu_mul_kernel": 2,
                        "kv_cache_write_kernel": 4}


def _downstream(graph, name):
    """Op types of every node reachable from value ``name``."""
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for i in node.input:
            consumers[i].append(node)
    seen, todo, kinds = set(), [name], collections.Counter()
    while todo:
        for node in consumers[todo.pop()]:
            if node.name not in seen:
                seen.add(node.name)
                kinds[node.op_type] += 1
                todo.extend(node.output)
    return kinds


def test_position_feeds_the_cache_writes_and_the_mask(onnx_model):
    direct = [n.op_type for n in onnx_model.graph.node if "position" in n.input]
    assert "LessOrEqual" in direct  # the mask arange(max_len) <= position
    # each cache write reads position (on the device)
    assert sum(t.startswith("kv_cache_write_kernel") for t in direct) == 2 * LAYERS
    assert not _downstream(onnx_model.graph, "position")["ScatterND"]  # no torch-op cache write


def in_place_writers(graph) -> dict[str, str]:
    """For each graph input ``x`` with a graph output ``mutated_x``: ``"ok"`` when ``x`` has
    exactly one consumer other than Shape nodes, a kernel_lens-domain node, one of whose outputs
    is ``mutated_x`` (directly or through Identity renames); else why not. This is what the
    runtime needs to bind ``x`` as its own output buffer (no copy back)."""
    consumers = collections.defaultdict(list)
    for node in graph.node:
        for i in set(node.input):
            consumers[i].append(node)
    renames = {n.input[0]: n.output[0] for n in graph.node if n.op_type == "Identity"}
    outputs = {o.name for o in graph.output}
    verdict = {}
    for value in graph.input:
        name = value.name
        if f"mutated_{name}" not in outputs:
            continue
        readers = [n for n in consumers[name] if n.op_type != "Shape"]
        if len(readers) != 1:
            verdict[name] = f"{len(readers)} readers: {[n.op_type for n in readers]}"
            continue
        (writer,) = readers
        if writer.domain != DOMAIN:
            verdict[name] = f"read by {writer.op_type} ({writer.domain or 'ai.onnx'})"
            continue
        reached = set()
        for out in writer.output:
            while out not in reached:
                reached.add(out)
                out = renames.get(out, out)
        verdict[name] = "ok" if f"mutated_{name}" in reached else \
            f"{writer.op_type} does not produce mutated_{name}"
    return verdict


def test_each_cache_input_is_written_in_place_by_one_kernel_node(onnx_model):
    """Each cache input's only reader (Shape aside) is its own kv_cache_write_kernel node, whose
    output is the graph output ``mutated_<cache>``: every later reader (repeat_kv / attention)
    reads the node's output, never the input, so the runtime can bind input and output to one
    buffer and skip both the node's copy and the copy back."""
    assert in_place_writers(onnx_model.graph) == {c: "ok" for c in CACHES}
    from kernel_lens.onnx.aliasing import in_place_inputs

    assert in_place_inputs(onnx_model) == set(CACHES)  # the runtime's own rule agrees
    for c in CACHES:
        (writer,) = [n for n in onnx_model.graph.node if c in n.input]
        assert writer.op_type.startswith("kv_cache_write_kernel")
        assert list(writer.output) == [f"mutated_{c}"]
        assert writer.input[0] == c and writer.input[2] == "position"
        # attention reads the written cache (the node's output), not the input
        assert _downstream(onnx_model.graph, f"mutated_{c}")["Attention"] >= 1


class _StackedCacheStep(torch.nn.Module):
    """The old layout in miniature: a stacked cache [layers, B, kv_heads, max_len, hd] written
    with ``cache[i][:, :, position] = k`` (index_put_ through a layer's slice) and read per layer;
    k comes from a Triton kernel (kernel_lens compiles only models that launch one)."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(8))

    def forward(self, x, position, cache):
        k = K.rms_norm(x, self.weight, 1e-6)
        out = x.new_zeros(())
        for i in range(cache.shape[0]):
            cache[i][:, :, position] = k * (i + 1)
            out = out + cache[i].sum()
        return out


def test_in_place_writer_check_rejects_the_stacked_cache_layout(tmp_path):
    """The check above is not vacuous: the stacked layout (Gather of the layer, ScatterND, ...)
    reads the cache input from several nodes and writes it with ONNX ops."""
    inputs = (torch.randn(2, 4, 1, 8), torch.tensor([3]), torch.zeros(2, 2, 4, 16, 8))
    result = kl.compile(_StackedCacheStep(), inputs, arch=90, targets=["ort"], output_dir=tmp_path,
                        stop_after="emit")
    graph = onnx.load(str(result.artifacts["ort.onnx"])).graph
    verdict = in_place_writers(graph)
    assert list(verdict) == ["cache"] and verdict["cache"] != "ok", verdict


# ------------------------------------------------------------------------------ ONNX Runtime (CPU)


def _reference_kernels(model: D.LlamaDecodeStep) -> dict:
    """ONNX function bodies equivalent to the four Triton kernels on their root tensors."""
    hidden, eps = model.config.hidden_size, float(model.config.rms_norm_eps)

    def const(name, values, dtype=TensorProto.INT64):
        values = list(np.atleast_1d(values))
        return helper.make_node("Constant", [], [name], value=helper.make_tensor(
            "v", dtype, [len(values)], values))

    def rmsnorm(r, w):  # x root (..., hidden) -> out root (rows, hidden)
        return [
            const("axes", [-1]), const("eps", [eps], TensorProto.FLOAT), const("rows", [-1, hidden]),
            helper.make_node("Mul", [r["x_ptr"], r["x_ptr"]], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Div", [r["x_ptr"], "rms"], ["xn"]),
            helper.make_node("Mul", ["xn", r["w_ptr"]], ["y"]),
            helper.make_node("Reshape", ["y", "rows"], [w["out_ptr"]]),
        ]

    def rope(r, w):  # q/k roots (B, 1, heads*hd): one token -> (B, heads, 1, hd) rotated
        nodes = [const("cs_axes", [0]), const("q_shape", [-1, model.n_heads, 1, model.head_dim]),
                 const("k_shape", [-1, model.n_kv_heads, 1, model.head_dim])]
        for t in ("cos", "sin"):  # (1, 1, hd) -> (1, 1, 1, hd)
            nodes.append(helper.make_node("Unsqueeze", [r[f"{t}_ptr"], "cs_axes"], [t]))
        for x, shape in (("q", "q_shape"), ("k", "k_shape")):
            nodes += [
                helper.make_node("Reshape", [r[f"{x}_ptr"], shape], [f"{x}4"]),
                helper.make_node("Split", [f"{x}4"], [f"{x}1", f"{x}2"], axis=-1, num_outputs=2),
                helper.make_node("Neg", [f"{x}2"], [f"{x}2n"]),
                helper.make_node("Concat", [f"{x}2n", f"{x}1"], [f"{x}rot"], axis=-1),
                helper.make_node("Mul", [f"{x}4", "cos"], [f"{x}c"]),
                helper.make_node("Mul", [f"{x}rot", "sin"], [f"{x}s"]),
                helper.make_node("Add", [f"{x}c", f"{x}s"], [w[f"{x}_out_ptr"]]),
            ]
        return nodes

    def silu_mul(r, w):
        return [helper.make_node("Sigmoid", [r["gate_ptr"]], ["sg"]),
                helper.make_node("Mul", [r["gate_ptr"], "sg"], ["silu"]),
                helper.make_node("Mul", ["silu", r["up_ptr"]], [w["out_ptr"]])]

    def kv_cache_write(r, w):  # cache [B, kv, L, hd]; new root: (B, kv, 1, hd) or (B, 1, kv*hd)
        return [
            const("new_shape", [-1, model.n_kv_heads, 1, model.head_dim]),
            const("pos_index", [1, 1]),
            helper.make_node("Reshape", [r["new_ptr"], "new_shape"], ["new4"]),
            helper.make_node("Transpose", [r["cache_ptr"]], ["by_pos"], perm=[2, 0, 1, 3]),
            helper.make_node("Transpose", ["new4"], ["update"], perm=[2, 0, 1, 3]),
            helper.make_node("Reshape", [r["pos_ptr"], "pos_index"], ["index"]),
            helper.make_node("ScatterND", ["by_pos", "index", "update"], ["written"]),
            helper.make_node("Transpose", ["written"], [w["cache_ptr"]], perm=[1, 2, 0, 3]),
        ]

    return {"rmsnorm_kernel": rmsnorm, "rope_kernel": rope, "silu_mul_kernel": silu_mul,
            "kv_cache_write_kernel": kv_cache_write}




@pytest.fixture(scope="module")
def ort_session(compiled, onnx_model, reference):
    ort = pytest.importorskip("onnxruntime")
    model = with_reference_kernels(compiled[0].ir, onnx_model,
                                    _reference_kernels(reference))
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("batch,position", [(2, 5), (1, 0), (3, 63), (2, 17)])
def test_onnx_step_in_onnxruntime_matches_eager(ort_session, reference, batch, position):
    """The lowered graph (torch ops as ONNX Runtime runs them, kernels as ONNX functions) gives the
    eager step's logits and writes the caches at ``position`` and nowhere else, for batches other
    than the compiled one and positions other than the captured one."""
    inputs = D.make_inputs(reference, batch, position=position, seed=batch * 100 + position)
    feeds = {name: t.numpy() for name, t in zip(("input_ids", "position", *CACHES), inputs)}
    originals = {c: feeds[c].copy() for c in CACHES}
    logits, *new_caches = ort_session.run(["output_0", *(f"mutated_{c}" for c in CACHES)], feeds)
    ref_inputs = _clone(inputs)
    with torch.no_grad():
        want = reference(*ref_inputs)
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-4, atol=1e-4)
    for got, ref in zip(new_caches, ref_inputs[2:], strict=True):
        np.testing.assert_allclose(got, ref.numpy(), rtol=1e-5, atol=1e-5)
    _assert_only_slot_changed(new_caches, [originals[c] for c in CACHES], position)
    # the graph inputs themselves are not changed by ORT here (with the reference functions the
    # CPU EP writes fresh outputs; the runtime binds or copies mutated_* back)
    assert all(np.array_equal(feeds[c], originals[c]) for c in CACHES)


def test_onnx_greedy_loop_in_onnxruntime_matches_eager(ort_session, reference):
    """A short greedy decode driven through the ONNX graph (caches carried from mutated_* outputs
    into the next step's inputs, as the runtime does) produces the eager loop's tokens."""
    prompt = torch.randint(0, 1024, (2, 3), generator=torch.Generator().manual_seed(3))

    def step(ids, position, *caches):
        logits, *new_caches = ort_session.run(None, {
            "input_ids": ids.numpy(), "position": position.numpy(),
            **{name: c.numpy() for name, c in zip(CACHES, caches, strict=True)}})
        for cache, new in zip(caches, new_caches, strict=True):
            cache.copy_(torch.from_numpy(new))
        return torch.from_numpy(logits)

    want = D.greedy_decode(reference, prompt, 6, reference.new_caches(2))
    got = D.greedy_decode(step, prompt, 6, reference.new_caches(2))
    assert torch.equal(got, want)
