"""GPU host only: the TensorRT plugins' runtime path, launch by launch, against the same Triton
kernels launched natively.

For every corpus model and example, at the captured sizes and at the ragged sweep of
test_gpu_ort (sizes off 16 and off the block), the eager forward runs natively with each Triton
launch observed: the bytes of every tensor argument's storage before and after the launch. Per
launch, the node's inputs are cut out of the "before" bytes (where the launch plan says each
pointer points into its node tensor) and the expected outputs out of the "after" bytes. The C++
harness (tests/trt/harness.cpp, GPU mode) then does what TensorRT does with each plugin (V3: from
its serialized fields, attached, onShapeChange; V2: deserialized, configured, initialized), with
output shapes from its own IExprBuilder, a workspace of getWorkspaceSize bytes and exact-size
device buffers, enqueues on a stream of its own and writes the outputs back. They must be
bit-identical to the native launch's (kernels with float atomics: within 1e-4, their order is
not deterministic). With compute-sanitizer available, the harness runs under its memcheck tool
and must report no error. No TensorRT library is involved: none exists for this GPU here.

Shard with KL_GPU_SHARD=K/N (models K, K+N, ... of the sorted list) to spread models over
processes."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

import kernel_lens as kl
from kernel_lens.codegen.plan import build_plan
from kernel_lens.frontends import arguments
from kernel_lens.frontends.capture import recorder as cap
from kernel_lens.frontends import triton_compat as tc
from kernel_lens.ir import DType, evaluate, parse
from kernel_lens.targets.trt.target import plugin_names, trt_sources
from kernel_lens.toolchain import compilers
from kernel_lens.toolchain.build import build_shared_library

from conftest import ROOT, load_module
from test_gpu_ort import MODELS, _cuda_model, _inputs_at, _sizes
from test_trt_plugins import TRT_TYPES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HARNESS = ROOT / "tests" / "trt"
NUMPY = {DType.fp32: np.float32, DType.fp16: np.float16, DType.i8: np.int8, DType.i32: np.int32,
         DType.u8: np.uint8, DType.i64: np.int64, DType.i1: np.bool_}


def _shard(names):
    k, n = map(int, os.environ.get("KL_GPU_SHARD", "0/1").split("/"))
    return [name for i, name in enumerate(sorted(names)) if i % n == k]


def _sanitizer():
    found = shutil.which("compute-sanitizer")
    nvcc = shutil.which("nvcc")
    if found is None and nvcc is not None:
        candidate = Path(nvcc).resolve().parent / "compute-sanitizer"
        found = str(candidate) if candidate.exists() else None
    return found


@pytest.fixture(scope="module")
def harness(tmp_path_factory, trt_headers):
    exe = tmp_path_factory.mktemp("harness") / "harness"
    trt, cuda = trt_headers
    subprocess.run([compilers.find_cxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1", "-g",
                    "-isystem", str(trt), "-isystem", str(cuda), f"-I{HARNESS}",
                    str(HARNESS / "harness.cpp"), "-o", str(exe), "-ldl"],
                   check=True, capture_output=True, text=True)
    return exe


def _storage_bytes(t: torch.Tensor) -> bytes:
    """The bytes of the whole storage under ``t`` (views included), copied to the host."""
    storage = t.untyped_storage()
    u8 = torch.empty(0, dtype=torch.uint8, device=t.device)
    u8.set_(storage, 0, (storage.nbytes(),), (1,))
    return u8.cpu().numpy().tobytes()


class _Observer(cap._Recorder):
    """A native capture recorder that also keeps, per launch, each tensor argument (its byte
    offset in its storage) and its storage's bytes before and after the launch."""

    def __init__(self) -> None:
        super().__init__(90, True, None)
        self.seen: list[tuple[str, dict, dict, dict]] = []

    def run(self, orig, jit_fn, args, grid, warmup, kwargs):
        if self.benchmarking or warmup:
            return super().run(orig, jit_fn, args, grid, warmup, kwargs)
        params = tc.bind_params(jit_fn, args, kwargs)
        tensors = {}  # by IR leaf name: tuple elements too, and a tensor descriptor's base
        for leaf, value, _ in arguments.walk_values(cap.innermost_jit(jit_fn), params):
            base = getattr(value, "base", None) if not isinstance(value, torch.Tensor) else value
            if isinstance(base, torch.Tensor):
                tensors[leaf] = base
        torch.cuda.synchronize()
        before = {k: _storage_bytes(v) for k, v in tensors.items()}
        result = super().run(orig, jit_fn, args, grid, warmup, kwargs)
        torch.cuda.synchronize()
        after = {k: _storage_bytes(v) for k, v in tensors.items()}
        starts = {k: v.storage_offset() * v.element_size() for k, v in tensors.items()}
        self.seen.append((cap.kernel_name(jit_fn), starts, before, after))
        return result


def _observe(module, inputs):
    observer = _Observer()
    with cap.recording(observer), torch.no_grad():
        _cuda_model(module)(*inputs)
    return observer.seen


def _node_io(ir, plan, launch, seen, values):
    """One launch's node inputs (bytes before the native launch) and outputs (after), cut out of
    the storages where the plan's pointers point into the node tensors."""
    _, starts, before, after = seen

    def cut(snapshot, pointer, size):
        start = starts[pointer.param] - evaluate(parse(pointer.offset, plan.symbols), values) * pointer.itemsize
        assert 0 <= start and start + size <= len(snapshot[pointer.param]), (launch.kernel, pointer.param)
        return snapshot[pointer.param][start:start + size]

    def size(shape, dtype):
        return math.prod(evaluate(parse(s, plan.symbols), values) for s in shape) * dtype.itemsize

    ins = []
    for i, value in enumerate(launch.inputs):
        n = size(ir.values[value.value].shape, value.dtype)
        reads = [p for p in launch.pointers if p.slot == "in" and p.index == i]
        in_place = [p for p in launch.pointers if p.slot == "out"
                    and launch.outputs[p.index].copy_from == i]
        ins.append(cut(before, (reads or in_place)[0], n) if reads or in_place else bytes(n))
    outs = []
    for j, out in enumerate(launch.outputs):
        writes = [p for p in launch.pointers if p.slot == "out" and p.index == j]
        assert writes, f"{launch.kernel}: output {j} has no pointer"
        outs.append(cut(after, writes[0], size(out.shape, out.dtype)))
    return ins, outs


def _compare(name, launch, j, dtype, ours, native, exact):
    a = np.frombuffer(ours, dtype=NUMPY.get(dtype, np.uint8)).astype(np.float64)
    b = np.frombuffer(native, dtype=NUMPY.get(dtype, np.uint8)).astype(np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    diff = float(np.abs(a - b)[finite].max()) if finite.any() else 0.0
    print(f"{name} launch {launch.index} {launch.kernel} out {j} {len(ours)} bytes max_abs_diff={diff!r} "
          f"exact_required={exact}")
    if exact:
        assert ours == native, f"{name} launch {launch.index} ({launch.kernel}) output {j}: max abs diff {diff}"
    else:  # float atomics: the order of accumulation differs from run to run (as in test_gpu_ort)
        assert len(ours) == len(native) and np.allclose(a, b, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("name", _shard(MODELS))
def test_trt_plugins_enqueue_bit_identical_to_native_triton(name, harness, trt_headers, tmp_path):
    module = load_module(MODELS[name])
    examples = [t.cuda() for t in module.example_inputs]
    ir = kl.compile(_cuda_model(module), [t.clone() for t in examples],
                    dynamic_shapes=module.dynamic_shapes).ir
    plan = build_plan(ir)
    if not {v.dtype for p in plan.launches for v in [*p.inputs, *p.outputs]} <= set(TRT_TYPES):
        pytest.skip(f"{name}: a tensor type TensorRT does not have (refused at build, tested on the CPU)")
    trt, cuda = trt_headers
    with ThreadPoolExecutor(2) as pool:
        libs = dict(zip(("v3", "v2"), pool.map(
            lambda kind: build_shared_library(f"kl_{name}_trt_{kind}", trt_sources(ir, kind, plan),
                                              include_dirs=[trt, cuda]), ("v3", "v2"))))
    names = plugin_names(ir, plan)
    size_sets = [({n: s.example for n, s in ir.symbols.items()}, [t.clone() for t in examples])]
    if ir.symbols:
        size_sets += [(values, _inputs_at(ir, examples, values, seed))
                      for seed, values in enumerate(_sizes(ir))]
    lines, expected = [], []
    kernels = ir.all_kernels()
    for values, inputs in size_sets:
        seen = _observe(module, inputs)
        graph = ir.piece_for(values)  # a model split by size runs the piece of these sizes
        first = sum(len(g.launches) for g in ir.graphs()[:ir.graphs().index(graph)])
        launches = plan.launches[first:first + len(graph.launches)]
        assert [s[0] for s in seen] == [kernels[p.kernel].name for p in launches], name
        for launch, observed in zip(launches, seen):
            ins, outs = _node_io(graph, plan, launch, observed, values)
            case = len(lines)
            fields = [names[launch.kernel], str(launch.index), str(len(launch.inputs)), str(len(launch.outputs))]
            for i, (value, data) in enumerate(zip(launch.inputs, ins)):
                dims = [evaluate(parse(s, plan.symbols), values) for s in graph.values[value.value].shape]
                fields += [str(TRT_TYPES[value.dtype]), str(len(dims)), *map(str, dims)]
                (tmp_path / f"{case}.in{i}").write_bytes(data)
            fields += [str(TRT_TYPES[o.dtype]) for o in launch.outputs]
            lines.append(" ".join(fields))
            expected.append((launch, outs))
    sanitizer = _sanitizer()
    exact = not any("atomic_" in k.source.text for k in kernels.values())
    for kind, lib in libs.items():
        command = [str(harness), kind, str(lib)]
        if sanitizer:
            command = [sanitizer, "--tool", "memcheck", "--error-exitcode", "99", "--print-limit", "20",
                       *command]
        run = subprocess.run(command, input="\n".join(lines) + "\n", capture_output=True, text=True,
                             timeout=300, env={**os.environ, "KERNEL_LENS_TRT_GPU_IO": str(tmp_path)})
        assert run.returncode == 0, (kind, run.stdout[-3000:], run.stderr[-3000:])
        if sanitizer:
            assert "ERROR SUMMARY: 0 errors" in run.stdout + run.stderr, run.stdout[-3000:]
        out = [line for line in run.stdout.splitlines() if not line.startswith("=")]
        assert out[0] == f"creators {len(set(names.values()))}", out[:3]
        results = out[1:]
        assert len(results) == 2 * len(lines), (kind, results[-4:])
        for case, (launch, native) in enumerate(expected):
            assert results[2 * case].startswith(f"ok {launch.index} "), (kind, results[2 * case])
            assert results[2 * case + 1] == "gpu 0", (kind, launch.kernel, results[2 * case + 1])
            for j, want in enumerate(native):
                got = (tmp_path / f"{case}.{kind}.out{j}").read_bytes()
                _compare(f"{name} [{kind}{' memcheck' if sanitizer else ''}]", launch, j,
                         launch.outputs[j].dtype, got, want, exact)


def _tensorrt_importable():
    from kernel_lens.errors import KernelLensError
    from kernel_lens.runtime.trt import import_tensorrt

    try:
        import_tensorrt()
        return True
    except KernelLensError:
        return False


@pytest.mark.skipif(not _tensorrt_importable(),
                    reason="needs TensorRT's Python package (tensorrt or tensorrt_rtx); none installs "
                           "for the H200 in this environment")
@pytest.mark.parametrize("name", ["toy_two_kernels", "llama_block", "inplace_input"])
def test_run_backend_tensorrt_matches_native(name, tmp_path):
    """Where a TensorRT runs: the engine through run(backend="tensorrt") against eager."""
    from test_gpu_ort import _check

    module = load_module(MODELS[name])
    examples = [t.cuda() for t in module.example_inputs]
    compiled = kl.compile(_cuda_model(module), [t.clone() for t in examples],
                          dynamic_shapes=module.dynamic_shapes, targets=["trt"], output_dir=tmp_path)

    class Tensorrt:  # _check calls compiled.run(*inputs) and reads compiled.ir
        ir = compiled.ir

        @staticmethod
        def run(*inputs):
            return compiled.run(*inputs, backend="tensorrt")

    _check(Tensorrt, module, [t.clone() for t in examples])
    if compiled.ir.symbols:
        for seed, values in enumerate(_sizes(compiled.ir)):
            _check(Tensorrt, module, _inputs_at(compiled.ir, examples, values, seed))
