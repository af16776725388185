"""TensorRT plugin libraries on a CPU-only host, for every corpus model and example: both plugin
kinds (IPluginV3, IPluginV2DynamicExt) compile warning-free (-Wall -Wextra -Werror) against the
real TensorRT 10.14 headers, and a C++ harness (tests/trt/harness.cpp) drives each library's
build-time API the way TensorRT does: the exported creator table, creation from fields or a
serialized blob, output dtypes, output shapes through an evaluating IExprBuilder, format
support (exact dtype, linear layout only), workspace size, serialization round trips and clone.
Expected shapes and workspace come from the IR, evaluated at the captured sizes and at other
sizes in the declared ranges. enqueue needs a GPU: see tests/gpu."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

import kernel_lens as kl
from kernel_lens.codegen.plan import build_plan
from kernel_lens.errors import UnsupportedKernelError
from kernel_lens.ir import DType, evaluate, parse
from kernel_lens.targets.trt.target import plugin_names, trt_onnx, trt_sources
from kernel_lens.toolchain import compilers
from kernel_lens.toolchain.build import build_shared_library

from conftest import corpus_files, example_files, load_module

HERE = Path(__file__).parent / "trt"
MODELS = {p.stem: p for p in [*corpus_files(), *example_files()]}
TRT_TYPES = {DType.fp32: 0, DType.fp16: 1, DType.i8: 2, DType.i32: 3, DType.i1: 4, DType.u8: 5,
             DType.fp8e4nv: 6, DType.bf16: 7, DType.i64: 8}


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
    """The captured sizes, and each dynamic symbol moved inside its range (odd, off the block)."""
    example = {n: s.example for n, s in ir.symbols.items()}
    other = {}
    for n, s in ir.symbols.items():
        hi = s.max if s.max is not None else s.example * 4 + 16
        other[n] = max(s.min, min(hi, s.example * 2 + 1))
    return [example] + ([other] if other != example else [])


def _cases(ir, plan, values):
    lines, expected = [], []
    names = plugin_names(ir, plan)
    for launch in plan.launches:
        fields = [names[launch.kernel], str(launch.index), str(len(launch.inputs)),
                  str(len(launch.outputs))]
        for value in launch.inputs:
            dims = [evaluate(parse(s, plan.symbols), values) for s in ir.values[value.value].shape]
            fields += [str(TRT_TYPES[value.dtype]), str(len(dims)), *map(str, dims)]
        fields += [str(TRT_TYPES[o.dtype]) for o in launch.outputs]
        lines.append(" ".join(fields))
        outs = []
        for o in launch.outputs:
            dims = [evaluate(parse(s, plan.symbols), values) for s in o.shape]
            outs += [str(len(dims)), *map(str, dims)]
        workspace = evaluate(parse(launch.workspace, plan.symbols), values)
        expected.append(" ".join(["ok", str(launch.index), str(workspace), *outs]))
    return "\n".join(lines) + "\n", expected


@pytest.mark.parametrize("stem", sorted(MODELS))
def test_plugins_build_and_answer_like_the_ir(stem, harness, trt_headers, tmp_path):
    ir = _ir(stem)
    plan = build_plan(ir)
    dtypes = {v.dtype for p in plan.launches for v in [*p.inputs, *p.outputs]}
    if not dtypes <= set(TRT_TYPES):
        with pytest.raises(UnsupportedKernelError, match="TensorRT has no tensor type"):
            trt_sources(ir, "v3", plan)
        return
    trt, cuda = trt_headers
    model = trt_onnx(ir)
    plugin_nodes = [n for n in model.graph.node if n.domain == "kernel_lens"]
    assert len(plugin_nodes) == len(plan.launches)
    for node in plugin_nodes:
        attrs = {a.name: a for a in node.attribute}
        assert node.op_type in plugin_names(ir, plan).values()
        assert re.fullmatch(rf"kl_{ir.name}_\w+_[0-9a-f]{{8}}", node.op_type)
        assert attrs["plugin_version"].s == b"1" and attrs["plugin_namespace"].s == b"kernel_lens"
    kernels = sorted({p.kernel for p in plan.launches})
    for kind in ("v3", "v2"):
        lib = build_shared_library(f"kl_{stem}_trt_{kind}", trt_sources(ir, kind, plan),
                                   include_dirs=[trt, cuda], cache_dir=tmp_path)
        for values in _size_sets(ir):
            cases, expected = _cases(ir, plan, values)
            out = subprocess.run([str(harness), kind, str(lib)], input=cases, capture_output=True,
                                 text=True, timeout=120, check=True).stdout.splitlines()
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
