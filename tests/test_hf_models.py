"""Real-model conformance on a CPU-only host: tiny ``transformers`` models (Llama, Mistral, Qwen2,
Gemma, Phi, GPT-2, OPT, BERT; random weights, nothing downloaded) with Triton kernels patched into
their norms, MLP activations and RoPE (tests/hf/). Per architecture, one compile:

- the patched model (kernels run by Triton's interpreter) matches the unpatched transformers model,
  at the example size and at a ragged one (seq 37: masked tails);
- the IR has the expected launches per kernel, pointer roles, and batch/seq symbols; every grid
  is symbolic and evaluates to the right grid at other sizes;
- the ORT target builds; the folder reopens with ``kl.load``; the library registers with
  onnxruntime; the ONNX passes the full checker and shape inference keeps batch and seq symbolic.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
import torch

import kernel_lens as kl
from kernel_lens.frontends.capture.recorder import capture
from kernel_lens.ir import ParamKind, evaluate, parse

sys.path.insert(0, str(Path(__file__).resolve().parent / "hf"))
import _models as M  # noqa: E402
K = M.K  # the Triton drop-ins (examples/_hf_kernels.py)


@pytest.fixture(scope="module", params=M.ARCHS)
def case(request):
    """(arch, patched model, example inputs, expected, compiled) with one compile per arch."""
    arch = request.param
    model, inputs, dynamic_shapes, expected = M.build(arch)
    compiled = kl.compile(model, [t.clone() for t in inputs], dynamic_shapes=dynamic_shapes, arch=90)
    return arch, model, inputs, expected, compiled


@pytest.fixture(scope="module")
def ort_build(case, tmp_path_factory, ort_headers):
    """The ORT target built from the compiled IR (what ``kl.compile(..., targets=["ort"],
    output_dir=...)`` does after lifting): (folder, artifacts) or the exception it raised."""
    arch, _, _, _, compiled = case
    out = tmp_path_factory.mktemp(f"ort_{arch}")
    try:
        return out, compiled.write(out, ["ort"])
    except Exception as exc:  # reported by every ORT test of this arch
        return out, exc


def _built(ort_build):
    out, artifacts = ort_build
    if isinstance(artifacts, BaseException):
        raise artifacts
    return out, artifacts


def _reference(arch, inputs):
    with torch.no_grad():
        return M.reference(arch)(*inputs)


# --------------------------------------------------------------------------- eager numerics


def test_patched_model_matches_transformers(case):
    arch, _, inputs, expected, compiled = case
    out = compiled.example_outputs  # the patched forward, kernels run by the interpreter
    ref = _reference(arch, inputs)
    assert isinstance(out, torch.Tensor) and out.shape == ref.shape == (M.BATCH, M.SEQ, M.HIDDEN)
    rtol, atol = expected.tolerance
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    # The RoPE swap lasted only for the forward.
    if arch in M._ROPE_MODULES:
        module = sys.modules[M._ROPE_MODULES[arch]]
        assert module.apply_rotary_pos_emb is not K.apply_rotary_pos_emb


def test_patched_model_matches_transformers_at_a_ragged_size(case):
    arch, model, _, expected, _ = case
    inputs = M.make_inputs(batch=3, seq=37, seed=5)  # 37: RoPE's 16-position blocks are masked
    run = capture(model, inputs, 90)
    counts = {}
    for launch in run.launches:
        counts[launch.jit.fn.__name__] = counts.get(launch.jit.fn.__name__, 0) + 1
    assert counts == expected.launches
    rtol, atol = expected.tolerance
    torch.testing.assert_close(run.outputs, _reference(arch, inputs), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- IR


def test_ir_launch_counts_and_roles(case):
    _, _, _, expected, compiled = case
    ir = compiled.ir
    assert M.launch_counts(ir) == expected.launches
    for kernel in ir.kernels.values():
        got = {p.name: p.role.value for p in kernel.params if p.kind == ParamKind.tensor}
        assert got == expected.roles[kernel.name], kernel.id
    for launch in ir.launches:
        roles = expected.roles[ir.kernels[launch.kernel].name]
        for arg in launch.args:
            assert arg.role == roles.get(arg.name, arg.role)
            assert arg.role in ("input", "output", "scalar", "constexpr"), (launch.order, arg.name)
    # Weights reach the kernels as IR constants, not as graph inputs.
    assert len(ir.inputs) == 1 and ir.values[ir.inputs[0]].dtype.value == "i64"


def _expected_grid(kernel, batch, seq):
    rows = batch * seq
    if kernel.endswith("norm_kernel"):
        return (rows, 1, 1)
    if kernel == "rope_kernel":
        return (math.ceil(seq / K.ROPE_BLOCK_S), batch, 1)
    return (math.ceil(rows * M.INTERMEDIATE / K.ELEMENTWISE_BLOCK), 1, 1)  # MLP activations


def test_ir_symbols_and_symbolic_grids(case):
    _, _, _, expected, compiled = case
    ir = compiled.ir
    assert set(ir.symbols) == set(expected.symbols)
    batch, seq = ir.symbols["batch"], ir.symbols["seq"]
    assert (batch.input, batch.dim, batch.min, batch.max, batch.example) == (0, 0, 2, 16, M.BATCH)
    assert (seq.input, seq.dim, seq.min, seq.max, seq.example) == (0, 1, 2, M.SEQ_MAX, M.SEQ)
    assert ir.values[ir.inputs[0]].shape == ["batch", "seq"]
    assert [ir.values[o].shape for o in ir.outputs] == [["batch", "seq", str(M.HIDDEN)]]
    names = list(ir.symbols)
    example = {n: s.example for n, s in ir.symbols.items()}
    for launch in ir.launches:
        kernel = ir.kernels[launch.kernel].name
        grid = [parse(g, names) for g in launch.grid]
        assert {s.name for g in grid for s in g.free_symbols} >= {"seq"}, (kernel, launch.grid)
        assert tuple(evaluate(g, example) for g in grid) == tuple(launch.captured_grid)
        for b, s in ((2, 2), (3, 37), (16, 256), (5, 129)):
            got = tuple(evaluate(g, {"batch": b, "seq": s}) for g in grid)
            assert got == _expected_grid(kernel, b, s), (kernel, b, s, launch.grid)


# --------------------------------------------------------------------------- ORT artifacts


def test_ort_artifacts_build_and_load(ort_build, case):
    _, _, _, _, compiled = case
    out, artifacts = _built(ort_build)
    assert artifacts["ort.onnx"].is_file() and artifacts["ort.library"].is_file()
    again = kl.load(out)
    assert again.ir == compiled.ir
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(again.artifacts["ort.library"]))
    # Registered: ORT knows the kernel_lens ops and only lacks a CPU implementation for them.
    with pytest.raises(Exception, match=r"NOT_IMPLEMENTED.*(Could not find an implementation|"
                                        r"Failed to find kernel) for"):
        ort.InferenceSession(str(again.artifacts["ort.onnx"]), so, providers=["CPUExecutionProvider"])


def _dims(value_info):
    shape = value_info.type.tensor_type.shape
    return [d.dim_param if d.HasField("dim_param") else d.dim_value if d.HasField("dim_value")
            else None for d in shape.dim]


def test_onnx_is_valid_and_keeps_batch_and_seq_symbolic(ort_build, case):
    _, _, _, expected, compiled = case
    _, artifacts = _built(ort_build)
    model = onnx.load(str(artifacts["ort.onnx"]))
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True,
                                                 data_prop=True)
    assert [_dims(i) for i in inferred.graph.input] == [["batch", "seq"]]
    assert [_dims(o) for o in inferred.graph.output] == [["batch", "seq", M.HIDDEN]]
    kernels = {n.op_type for n in inferred.graph.node if n.domain == "kernel_lens"}
    assert kernels and all(any(k.startswith(name) for name in expected.launches) for k in kernels)
    # Nothing traced at the example size leaked into the graph as a fixed dim.
    baked = {M.SEQ, M.BATCH * M.SEQ}
    leaked = [(vi.name, _dims(vi)) for vi in inferred.graph.value_info if baked & set(_dims(vi))]
    assert not leaked, leaked[:5]
