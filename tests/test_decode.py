"""A LLaMA decode step with a static KV cache (examples/llama_decode.py), compiled by kernel_lens.

On this CPU-only host: the eager step is checked against transformers' own full forward (logits
and the KV cache it builds), the compiled IR and ONNX graph are checked for what a decode step
needs (the caches are graph inputs written in place and come back as ``mutated_*`` outputs;
``position`` is a graph input feeding both the cache write and the attention mask), and the ONNX
graph is run by ONNX Runtime's CPU EP with the three Triton kernels replaced by equivalent ONNX
functions, against the eager step, at several batches and positions. One tiny compile (batch 2,
dynamic batch, stopped at the ORT target's ``emit`` stage) is shared by the whole file.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens.codegen.launch_io import launch_io, root_of
from kernel_lens.onnx.lower import DOMAIN

from conftest import EXAMPLES, load_module

D = load_module(EXAMPLES / "llama_decode.py")
BATCH = 2  # compiled with a dynamic batch: an example dim of 1 would be specialized


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
    result = kl.compile(model, inputs, dynamic_shapes=D.dynamic_shapes_for(BATCH), arch=90,
                        targets=["ort"], output_dir=out, stop_after="emit")
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
    k_cache, v_cache = reference.new_caches(2)
    logits = []
    D.greedy_decode(reference, prompt, 1, (k_cache, v_cache),
                    on_step=lambda step, out: logits.append(out))
    with torch.no_grad():
        full = reference.hf(prompt, use_cache=True)
    torch.testing.assert_close(torch.stack(logits, 1), full.logits, rtol=1e-4, atol=1e-4)
    cache = getattr(full, "cache", None) or full.past_key_values
    for i, layer in enumerate(cache.layers):
        torch.testing.assert_close(k_cache[i, :, :, :7], layer.keys, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(v_cache[i, :, :, :7], layer.values, rtol=1e-5, atol=1e-5)
    assert not k_cache[:, :, :, 7:].any() and not v_cache[:, :, :, 7:].any()  # untouched slots


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
    k0, v0 = inputs[2].clone(), inputs[3].clone()
    with torch.no_grad():
        reference(*inputs)
    for new, old in ((inputs[2], k0), (inputs[3], v0)):
        changed = (new != old).flatten(end_dim=2).any(0).any(-1)  # per cache position
        assert changed.nonzero().flatten().tolist() == [position]


# ------------------------------------------------------------------------------ capture and IR


def test_capture_runs_the_triton_kernels_and_matches_the_reference(compiled, reference):
    result, before, after = compiled
    counts = collections.Counter(result.ir.kernels[launch.kernel].name for launch in result.ir.launches)
    layers = reference.n_layers
    assert counts == {"rmsnorm_kernel": 2 * layers + 1, "rope_kernel": layers,
                      "silu_mul_kernel": layers}
    ref_inputs = _clone(before)
    with torch.no_grad():
        want = reference(*ref_inputs)
    # the patched forward (kernels in Triton's interpreter) during capture: same logits, and it
    # updated the example caches in place the way the reference did
    torch.testing.assert_close(result.example_outputs, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(after[2], ref_inputs[2], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(after[3], ref_inputs[3], rtol=1e-5, atol=1e-5)


def test_ir_keeps_position_and_caches_as_graph_inputs(compiled):
    ir = compiled[0].ir
    assert ir.inputs == ["input_ids", "position", "k_cache", "v_cache"]
    # the only symbol is the batch (dim 0 of input_ids): no dim of the cache or position is one
    assert [(ir.inputs[s.input], s.dim) for s in ir.symbols.values()] == [("input_ids", 0)]
    writes = [op for op in ir.ops if op.op == "aten.index_put_.default"]
    # one in-place write per layer and cache, through the layer's slice of the cache input
    assert sorted(root_of(ir, op.aliases[0]) for op in writes) == ["k_cache"] * 2 + ["v_cache"] * 2
    # ... indexing dim 2 (the cache position) with the ``position`` input itself, not a constant
    for op in writes:
        indices = op.args[1].items
        assert [getattr(i, "ref", None) for i in indices] == [None, None, "position"], op


def test_onnx_graph_inputs_outputs_and_validity(compiled, onnx_model):
    onnx.checker.check_model(onnx_model, full_check=True)
    graph = onnx_model.graph
    dims = {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in list(graph.input) + list(graph.output)}
    assert [v.name for v in graph.input] == ["input_ids", "position", "k_cache", "v_cache"]
    assert [v.name for v in graph.output] == ["output_0", "mutated_k_cache", "mutated_v_cache"]
    assert dims["position"] == [1]
    assert dims["k_cache"] == dims["mutated_k_cache"] == [2, "batch", 4, 64, 32]
    assert dims["output_0"] == ["batch", 1024]
    assert not any(init.name == "position" for init in graph.initializer)
    launches = collections.Counter(compiled[0].ir.kernels[n.op_type].name
                                   for n in graph.node if n.domain == DOMAIN)
    assert launches == {"rmsnorm_kernel": 5, "rope_kernel": 2, "silu_mul_kernel": 2}


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
    reach = _downstream(onnx_model.graph, "position")
    assert reach["ScatterND"] == 4  # each layer's k and v write is indexed by position


# ------------------------------------------------------------------------------ ONNX Runtime (CPU)


def _reference_kernels(model: D.LlamaDecodeStep) -> dict:
    """ONNX function bodies equivalent to the three Triton kernels on their root tensors."""
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

    return {"rmsnorm_kernel": rmsnorm, "rope_kernel": rope, "silu_mul_kernel": silu_mul}


def _with_reference_kernels(ir, model: onnx.ModelProto, impls: dict) -> onnx.ModelProto:
    """A model-local ONNX function per kernel_lens node kind, so the CPU EP can run the graph."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next(o.version for o in model.opset_import if o.domain == "")
    done = set()
    for launch in ir.launches:
        if launch.kernel in done:
            continue
        done.add(launch.kernel)
        io = launch_io(ir, launch, f"__{launch.order}")
        read, write = {}, {}
        for arg in launch.args:
            if arg.value is None or arg.name not in io.bindings:
                continue
            root = root_of(ir, arg.value)
            if root in io.inputs:
                read[arg.name] = f"in{io.inputs.index(root)}"
            kind, index = io.bindings[arg.name]
            if kind == "out":
                write[arg.name] = f"out{index}"
        nodes = impls[ir.kernels[launch.kernel].name](read, write)
        model.functions.append(helper.make_function(
            DOMAIN, launch.kernel, [f"in{i}" for i in range(len(io.inputs))],
            [f"out{i}" for i in range(len(io.outputs))], nodes,
            [helper.make_opsetid("", opset)], attributes=["launch"]))
    return model


@pytest.fixture(scope="module")
def ort_session(compiled, onnx_model, reference):
    ort = pytest.importorskip("onnxruntime")
    model = _with_reference_kernels(compiled[0].ir, onnx_model,
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
    feeds = {name: t.numpy() for name, t in zip(("input_ids", "position", "k_cache", "v_cache"), inputs)}
    logits, k_new, v_new = ort_session.run(["output_0", "mutated_k_cache", "mutated_v_cache"], feeds)
    ref_inputs = _clone(inputs)
    with torch.no_grad():
        want = reference(*ref_inputs)
    np.testing.assert_allclose(logits, want.numpy(), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(k_new, ref_inputs[2].numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(v_new, ref_inputs[3].numpy(), rtol=1e-5, atol=1e-5)
    changed = (k_new != feeds["k_cache"]).reshape(-1, reference.max_len, reference.head_dim).any(-1).any(0)
    assert np.flatnonzero(changed).tolist() == [position]
    # the graph inputs themselves are not changed by ORT (the runtime copies mutated_* back)
    assert np.array_equal(feeds["k_cache"], inputs[2].numpy())


def test_onnx_greedy_loop_in_onnxruntime_matches_eager(ort_session, reference):
    """A short greedy decode driven through the ONNX graph (caches carried from mutated_* outputs
    into the next step's inputs, as the runtime does) produces the eager loop's tokens."""
    prompt = torch.randint(0, 1024, (2, 3), generator=torch.Generator().manual_seed(3))

    def step(ids, position, k_cache, v_cache):
        logits, k_new, v_new = ort_session.run(None, {
            "input_ids": ids.numpy(), "position": position.numpy(),
            "k_cache": k_cache.numpy(), "v_cache": v_cache.numpy()})
        k_cache.copy_(torch.from_numpy(k_new))
        v_cache.copy_(torch.from_numpy(v_new))
        return torch.from_numpy(logits)

    want = D.greedy_decode(reference, prompt, 6, reference.new_caches(2))
    got = D.greedy_decode(step, prompt, 6, reference.new_caches(2))
    assert torch.equal(got, want)
