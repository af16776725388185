"""GPU host only: every example and corpus model through ONNX Runtime (CUDA EP) with the
kernel_lens custom-op library, compared bit for bit with the same Triton kernels launched
natively, over dynamic sizes, misaligned views and repeated calls; plus the C++ example."""

from __future__ import annotations

import copy
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

import kernel_lens as kl
from kernel_lens.ir import evaluate, parse

from conftest import ROOT, corpus_files, example_files, flatten, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

MODELS = {p.stem: p for p in corpus_files()}
MODELS.update({p.stem: p for p in example_files()})


def _cuda_model(module):
    model = module.model
    return copy.deepcopy(model).cuda() if isinstance(model, torch.nn.Module) else model


def _inputs_at(ir, examples, values, seed):
    """Fresh inputs with the model's dtypes at the given symbol values."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for name, ex in zip(ir.inputs, examples):
        shape = [evaluate(parse(s, list(values)), values) for s in ir.values[name].shape]
        if ex.dtype.is_floating_point:
            t = torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(ex.dtype)
        else:  # indices (e.g. class targets) must stay below every dynamic size
            hi = max(0, min(int(ex.max()), min(values.values(), default=1 << 30) - 1))
            t = torch.randint(0, hi + 1, shape, generator=g, device="cuda", dtype=ex.dtype)
        out.append(t)
    return out


def _sizes(ir):
    """Symbol assignments to sweep: ragged sizes, block-size multiples, the range ends."""
    picks = []
    for i, candidates in enumerate(([0, 17, 1000 + 3], [1, 64, 256], [2, 511, 97])):
        values = {}
        for sym, info in ir.symbols.items():
            hi = info.max if info.max is not None else 4096
            want = candidates[len(values) % 3] or info.min
            values[sym] = max(info.min, min(hi, want, 4096 if sym != "seq" else 512))
        picks.append(values)
    return picks


# Torch ops that ONNX Runtime computes with other algorithms (cuBLAS matmul, attention) or in
# another order (reductions: sum, mean, softmax, norms): outputs of models using them are
# compared with a tolerance; kernels and elementwise torch ops must be bit-identical.
INEXACT_OPS = ("aten.linear", "aten.matmul", "aten.mm", "aten.bmm", "aten.addmm", "aten.baddbmm",
               "aten.scaled_dot_product_attention", "aten.sum", "aten.mean", "aten.cumsum",
               "aten.softmax", "aten._softmax", "aten.log_softmax", "aten._log_softmax",
               "aten.var", "aten.std", "aten.layer_norm", "aten.native_layer_norm")


def _bits(t):
    return t.contiguous().reshape(-1).view(torch.uint8)


def _check(compiled, module, inputs):
    ref_inputs = [t.clone() for t in inputs]
    native = flatten(_cuda_model(module)(*ref_inputs))
    ours = flatten(compiled.run(*inputs))
    # Float atomics accumulate in a nondeterministic order: two native runs differ too.
    graphs = compiled.ir.graphs()  # each piece's, for a model split by size
    exact = not any(op.op.startswith(INEXACT_OPS) for g in graphs for op in g.ops) and not any(
        "atomic_" in k.source.text for k in compiled.ir.all_kernels().values())
    assert len(ours) == len(native)
    for a, b in zip(ours, native):
        assert a.dtype == b.dtype and a.shape == b.shape
        finite = torch.isfinite(a.float()) & torch.isfinite(b.float())
        diff = (a.float() - b.float())[finite].abs().max().item() if finite.any() else 0.0
        print(f"{compiled.ir.name} {tuple(a.shape)} max_abs_diff={diff!r} exact_required={exact}")
        if exact:  # bit for bit: NaN payloads and signed zeros included
            assert torch.equal(_bits(a), _bits(b)), f"max abs diff {diff}"
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    for a, b in zip(inputs, ref_inputs):  # in-place updates of inputs match too (bit for bit
        if exact:                           # under the same rule: a KV cache written from a
            assert torch.equal(_bits(a), _bits(b))  # cuBLAS projection is not)
        else:
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    return ours


@pytest.mark.parametrize("name", sorted(MODELS))
def test_ort_matches_native_triton_bit_for_bit(name, tmp_path):
    module = load_module(MODELS[name])
    examples = [t.cuda() for t in module.example_inputs]
    compiled = kl.compile(_cuda_model(module), [t.clone() for t in examples],
                          dynamic_shapes=module.dynamic_shapes, targets=["ort"], output_dir=tmp_path)
    first = _check(compiled, module, [t.clone() for t in examples])
    kept = [t.clone() for t in first]
    if compiled.ir.symbols:
        for seed, values in enumerate(_sizes(compiled.ir)):
            _check(compiled, module, _inputs_at(compiled.ir, examples, values, seed))
    for a, b in zip(first, kept):  # later calls did not overwrite earlier results
        assert torch.equal(a, b)
    reopened = kl.load(tmp_path)  # from disk, no recompilation
    _check(reopened, module, [t.clone() for t in examples])


def test_misaligned_input_views_use_the_generic_binary(tmp_path):
    module = load_module(MODELS["vector_add"])
    compiled = kl.compile(_cuda_model(module), [t.cuda() for t in module.example_inputs],
                          dynamic_shapes=module.dynamic_shapes, targets=["ort"], output_dir=tmp_path)
    for n in (1000, 1001, 4099):
        buf_x, buf_y = torch.randn(n + 1, device="cuda"), torch.randn(n + 3, device="cuda")
        x, y = buf_x[1:], buf_y[3:]  # 4- and 12-byte offsets: not 16-byte aligned
        assert x.data_ptr() % 16 and y.data_ptr() % 16
        _check(compiled, module, [x, y])


def _cuda_lib_env():
    """CUDA runtime libraries for a plain C++ process: those of torch's nvidia-* wheels."""
    site = Path(torch.__file__).parents[1]
    dirs = [str(p) for p in site.glob("nvidia/*/lib")] + [str(site / "nvidia" / "cu13" / "lib"),
                                                          "/usr/local/cuda/lib64"]
    return {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(dirs + [os.environ.get("LD_LIBRARY_PATH", "")])}


def test_cpp_program_runs_the_model_without_python(tmp_path):
    include = os.environ["ORT_INCLUDE_DIR"]
    import onnxruntime

    capi = Path(onnxruntime.__file__).parent / "capi"
    libort = next(capi.glob("libonnxruntime.so*"))
    exe = tmp_path / "run_model"
    for lib in capi.glob("*.so*"):  # next to our soname link, where ORT looks for its EP libraries
        (tmp_path / lib.name).symlink_to(lib)
    (tmp_path / "libonnxruntime.so.1").symlink_to(libort)  # the wheel ships only the versioned name
    subprocess.run(["g++", "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{include}",
                    str(ROOT / "examples" / "cpp" / "run_model.cpp"), str(libort),
                    f"-Wl,-rpath,{tmp_path}", "-o", str(exe)], check=True)
    module = load_module(MODELS["llama_block"])
    examples = [t.cuda() for t in module.example_inputs]
    out_dir = tmp_path / "llama"
    compiled = kl.compile(_cuda_model(module), examples, dynamic_shapes=module.dynamic_shapes,
                          targets=["ort"], output_dir=out_dir)
    x = torch.randn(1, 37, examples[0].shape[-1])
    x.numpy().tofile(tmp_path / "x.bin")
    proc = subprocess.run([str(exe), str(compiled.artifacts["ort.onnx"]),
                           str(compiled.artifacts["ort.library"]), str(tmp_path / "y.bin"),
                           f"{tmp_path / 'x.bin'}:f32:1x37x{x.shape[-1]}"],
                          capture_output=True, text=True, env=_cuda_lib_env())
    assert proc.returncode == 0, proc.stderr
    expected = compiled.run(x.cuda()).cpu()
    got = torch.from_file(str(tmp_path / "y.bin"), size=expected.numel(), dtype=torch.float32)
    assert torch.equal(got.view_as(expected), expected)


def test_onnxruntime_cuda_graph_mode_captures_the_custom_ops(tmp_path):
    """No device sync, no cudaMalloc inside Compute: ORT's CUDA-graph mode captures and replays."""
    import onnxruntime as ort

    module = load_module(MODELS["toy_two_kernels"])
    x, y = (t.cuda() for t in module.example_inputs)
    compiled = kl.compile(_cuda_model(module), [x, y], dynamic_shapes=module.dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path)
    so = ort.SessionOptions()
    so.register_custom_ops_library(str(compiled.artifacts["ort.library"]))
    sess = ort.InferenceSession(str(compiled.artifacts["ort.onnx"]), so,
                                providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    out = torch.empty_like(x)
    binding = sess.io_binding()
    for name, t in (("x", x), ("y", y)):
        binding.bind_input(name, "cuda", 0, np.float32, tuple(t.shape), t.data_ptr())
    binding.bind_output("output_0", "cuda", 0, np.float32, tuple(out.shape), out.data_ptr())
    for step in range(3):  # the first run captures the graph, later runs replay it
        x.copy_(torch.randn_like(x))
        torch.cuda.synchronize()  # ORT runs on its own stream: the copy must land first
        sess.run_with_iobinding(binding)
        torch.cuda.synchronize()
        assert torch.equal(out, _cuda_model(module)(x, y)), step
