"""TensorRT plugin libraries on a CPU-only host, for every corpus model and example: both plugin
kinds (IPluginV3, IPluginV2DynamicExt) compile warning-free (-Wall -Wextra -Werror) against the
real TensorRT 10.14 headers, and a C++ harness (tests/trt/harness.cpp) drives each library's
build-time API the way TensorRT does: the exported creator table, creation from fields or a
serialized blob, output dtypes, output shapes through an evaluating IExprBuilder, format
support (exact dtype, linear layout only), workspace size, serialization round trips and clone.
Expected shapes and workspace come from the IR, evaluated at the captured sizes and at other
sizes in the declared ranges. Then each plugin made from its serialized fields is enqueued on
host buffers through the fake CUDA driver (tests/fake_cuda): one launch with the IR's grid,
in-place outputs first filled with their input's bytes. Running kernels needs a GPU."""

from __future__ import annotations

import math
import os
import re
import subprocess
from pathlib import Path

import pytest

import kernel_lens as kl
from kernel_lens.codegen.plan import build_plan
from kernel_lens.errors import UnsupportedKernelError
from kernel_lens.ir import DType, evaluate, parse
from kernel_lens.onnx.lower import all_nodes
from kernel_lens.targets.trt.target import plugin_names, trt_onnx, trt_sources
from kernel_lens.toolchain import compilers
from kernel_lens.toolchain.build import build_shared_library

from conftest import corpus_files, example_files, load_module

HERE = Path(__file__).parent / "trt"
FAKE = Path(__file__).parent / "fake_cuda" / "fake_cuda.c"
MODELS = {p.stem: p for p in [*corpus_files(), *example_files()]}
TRT_TYPES = {DType.fp32: 0, DType.fp16: 1, DType.i8: 2, DType.i32: 3, DType.i1: 4, DType.u8: 5,
             DType.fp8e4nv: 6, DType.bf16: 7, DType.i64: 8}


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """The fake CUDA driver (tests/fake_cuda): the plugins' enqueue runs on host buffers."""
    out = tmp_path_factory.mktemp("fake_cuda_trt") / "libfake_cuda.so"
    subprocess.run(["cc", "-std=c11", "-O1", "-shared", "-fPIC", str(FAKE), "-o", str(out)],
                   check=True, capture_output=True, text=True)
    return out


@pytest.fixture(scope="module")
def harness(tmp_path_factory, trt_headers):
    exe = tmp_path_factory.mktemp("harness") / "harness"
    trt, cuda = trt_headers
    subprocess.run([compilers.find_cxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1",
                    "-isystem", str(trt), "-isystem", str(cuda), f"-I{HERE}", str(HERE / "harness.cpp"),
                    "-o", str(exe), "-ldl"], check=True, capture_output=True, text=True)
    return exe


def _ir(stem):
    module = load_module(MODELS[stem])
    inputs = tuple(t.clone() for t in module.example_inputs)
    return kl.compile(module.model, inputs, dynamic_shapes=getattr(module, "dynamic_shapes", None),
                      arch=90, roles=getattr(module, "roles", None)).ir


def _size_sets(ir):
    """The captured sizes, and each dynamic symbol moved inside its range (odd, off the block);
    for a model split by size, a point in each piece (the middle of its first box)."""
    if ir.pieces:
        example = {n: s.example for n, s in ir.symbols.items()}
        return [{**example, **{n: (lo + hi) // 2 for n, (lo, hi) in p.when[0].ranges.items()}}
                for p in ir.pieces]
    example = {n: s.example for n, s in ir.symbols.items()}
    other = {}
    for n, s in ir.symbols.items():
        hi = s.max if s.max is not None else s.example * 4 + 16
        other[n] = max(s.min, min(hi, s.example * 2 + 1))
    return [example] + ([other] if other != example else [])


def _cases(ir, plan, values):
    """The harness's input, and per launch what it must print: the build-time answers, then the
    enqueue through the fake driver (status 0, one launch with the IR's grid, in-place outputs
    holding their input's bytes, other outputs untouched: the fake runs no kernel)."""
    lines, expected = [], []
    names = plugin_names(ir, plan)
    graph, first = ir, 0
    if ir.pieces:  # the launches of the piece these sizes select (the others refuse them)
        graph = ir.piece_for(values)
        first = sum(len(p.graph.launches) for p in ir.pieces[:[p.graph for p in ir.pieces].index(graph)])
    for launch in plan.launches[first:first + len(graph.launches)]:
        fields = [names[launch.kernel], str(launch.index), str(len(launch.inputs)),
                  str(len(launch.outputs))]
        in_bytes = []
        for i, value in enumerate(launch.inputs):
            dims = [evaluate(parse(s, plan.symbols), values) for s in graph.values[value.value].shape]
            fields += [str(TRT_TYPES[value.dtype]), str(len(dims)), *map(str, dims)]
            in_bytes.append(_pattern(i, math.prod(dims) * value.dtype.itemsize))
        fields += [str(TRT_TYPES[o.dtype]) for o in launch.outputs]
        lines.append(" ".join(fields))
        outs, out_bytes = [], []
        for o in launch.outputs:
            dims = [evaluate(parse(s, plan.symbols), values) for s in o.shape]
            outs += [str(len(dims)), *map(str, dims)]
            size = math.prod(dims) * o.dtype.itemsize
            out_bytes.append(in_bytes[o.copy_from][:size] if o.copy_from is not None else bytes(size))
        workspace = evaluate(parse(launch.workspace, plan.symbols), values)
        grid = [evaluate(parse(g, plan.symbols), values) for g in launch.grid]
        launched = int(all(grid))
        copies = sum(o.copy_from is not None for o in launch.outputs)
        expected.append(" ".join(["ok", str(launch.index), str(workspace), *outs]))
        expected.append(" ".join(["enqueue", "0", str(launched), *(map(str, grid) if launched else ["0"] * 3),
                                  str(copies), *map(_fnv, in_bytes), "/", *map(_fnv, out_bytes)]))
    return "\n".join(lines) + "\n", expected


def _pattern(i: int, size: int) -> bytes:  # what the harness writes into input i
    return bytes((k * 7 + 3 + i * 31) & 0xFF for k in range(size))


def _fnv(data: bytes) -> str:
    h = 1469598103934665603
    for c in data:
        h = ((h ^ c) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return str(h)


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_plugins_build_and_answer_like_the_ir(stem, harness, trt_headers, fake_driver, tmp_path):
    ir = _ir(stem)
    plan = build_plan(ir)
    dtypes = {v.dtype for p in plan.launches for v in [*p.inputs, *p.outputs]}
    if not dtypes <= set(TRT_TYPES):
        with pytest.raises(UnsupportedKernelError, match="TensorRT has no tensor type"):
            trt_sources(ir, "v3", plan)
        return
    trt, cuda = trt_headers
    model = trt_onnx(ir)
    plugin_nodes = [n for n in all_nodes(model.graph) if n.domain == "kernel_lens"]  # in If branches too
    assert len(plugin_nodes) == len(plan.launches)
    for node in plugin_nodes:
        attrs = {a.name: a for a in node.attribute}
        assert node.op_type in plugin_names(ir, plan).values()
        assert re.fullmatch(rf"kl_{ir.name}_\w+_[0-9a-f]{{8}}", node.op_type)
        assert attrs["plugin_version"].s == b"1" and attrs["plugin_namespace"].s == b"kernel_lens"
    kernels = sorted({p.kernel for p in plan.launches})
    for kind in ("v3", "v2"):
        lib = build_shared_library(f"kl_{stem}_trt_{kind}", trt_sources(ir, kind, plan),
                                   include_dirs=[trt, cuda])  # the session's cache: test_trt_rtx reuses it
        for values in _size_sets(ir):
            cases, expected = _cases(ir, plan, values)
            env = {**os.environ, "KERNEL_LENS_TEST_CUDA_DRIVER": str(fake_driver)}
            out = subprocess.run([str(harness), kind, str(lib)], input=cases, capture_output=True,
                                 text=True, timeout=120, check=True, env=env).stdout.splitlines()
            assert out[0] == f"creators {len(kernels)}", (stem, kind)
            assert out[1:] == expected, (stem, kind, values)


def test_v2_refuses_tensorrt_11_headers(monkeypatch):
    from kernel_lens.errors import KernelLensError
    from kernel_lens.targets.trt.target import TrtV2Target, TrtV3Target

    with pytest.raises(KernelLensError, match="removed IPluginV2DynamicExt; build --target trt-v3"):
        TrtV2Target().check_version("11.4.0")
    TrtV3Target().check_version("11.4.0")  # V3 builds against 10.x and 11.x
    with pytest.raises(KernelLensError, match="TensorRT 10 or newer"):
        TrtV3Target().check_version("8.6.1")


def test_plugin_names_are_unique_per_model_and_stable():
    first, second = _ir("vector_add"), _ir("scalar_kinds")
    first_named = first.model_copy(update={"name": "Model"})
    second_named = second.model_copy(update={"name": "Model"})
    a, b = plugin_names(first_named), plugin_names(second_named)
    assert set(a.values()).isdisjoint(b.values())  # same class name, other model: other names
    assert plugin_names(_ir("vector_add").model_copy(update={"name": "Model"})) == a  # recompiled: same
