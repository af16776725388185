"""TensorRT targets: an ONNX graph whose kernel nodes TensorRT's ONNX parser maps onto plugins,
and one plugin library, both from the launch plan (``codegen.plan``).

- ``trt-v3``: ``IPluginV3`` (OneCore/OneBuild/OneRuntime) with ``IPluginCreatorV3One``
  creators; builds against TensorRT 10.x and 11.x headers.
- ``trt-v2``: ``IPluginV2DynamicExt`` with ``IPluginCreator``; TensorRT 10.x only (11 removed it).
- ``trt``: ``trt-v3`` (every TensorRT with IPluginV3, i.e. >= 10).

One plugin per kernel, named ``kl_<model>_<kernel>_<digest>`` (namespace ``kernel_lens``, version
``1``; see :func:`plugin_names`): TensorRT's plugin registry is process-global, so two compiled
models coexist. The ONNX node's
``op_type`` is that name, with ``plugin_version``/``plugin_namespace`` attributes and the
``launch`` attribute the plugin is created with. Stages: ``lower`` (ONNX) -> ``emit`` (C++) ->
``build`` (the library). The library links no TensorRT library and dlopens the CUDA driver.
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import sympy
from onnx import helper

from ...codegen.cxx import to_cxx
from ...codegen.plan import ModelPlan, SymbolRead, build_plan
from ...codegen.trt_expr import TrtExprPrinter
from ...errors import KernelLensError, UnsupportedKernelError
from ...fileio import atomic_copy, ensure_folder, inside
from ...ir import DType, GraphIR, parse, symbol
from ...onnx.lower import DOMAIN, MIN_OPSET, all_nodes, lower_to_onnx_cached, save_onnx
from ...toolchain.build import build_shared_library
from ...toolchain.compilers import find_cxx
from ...toolchain.headers import find_cuda_include, find_tensorrt_include, tensorrt_version
from ..base import BuildState, Stage, StagedTarget
from ..common.emit import c_quote, common_headers, cxx_name, render_launches, templates

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
# Opset of the TensorRT ONNX graph: the lowest the lowering emits, which TensorRT 10's parser
# reads; attention stays MatMul/Softmax/MatMul there (TensorRT fuses that pattern itself).
OPSET = MIN_OPSET
PLUGIN_VERSION = "1"

_TRT_DTYPES = {DType.fp32: "kFLOAT", DType.fp16: "kHALF", DType.bf16: "kBF16", DType.i8: "kINT8",
               DType.i32: "kINT32", DType.i64: "kINT64", DType.u8: "kUINT8", DType.i1: "kBOOL",
               DType.fp8e4nv: "kFP8"}


def plugin_names(ir: GraphIR, plan: ModelPlan | None = None) -> dict[str, str]:
    """Kernel id -> plugin name ``kl_<model>_<kernel>_<8 hex digits>``. The digits hash the
    model's launch plan and kernels, so two models of the same class name coexist in TensorRT's
    process-global plugin registry, while the same compiled model always gets the same names."""
    plan = plan or build_plan(ir)
    digest = hashlib.sha256(plan.model_dump_json().encode())
    kernels = ir.all_kernels()
    for name in sorted(kernels):
        digest.update(kernels[name].model_dump_json().encode())
    tag = digest.hexdigest()[:8]
    return {k: f"kl_{ir.name}_{k}_{tag}" for k in sorted({p.kernel for p in plan.launches})}


def trt_dtype(dtype: DType) -> str:
    if dtype not in _TRT_DTYPES:
        raise UnsupportedKernelError(
            f"TensorRT has no tensor type for {dtype.value} (it has fp32, fp16, bf16, int8, uint8, "
            f"int32, int64, bool and fp8 e4m3); a kernel node reads or writes a {dtype.value} tensor")
    return f"nvinfer1::DataType::{_TRT_DTYPES[dtype]}"


def _printers(plan: ModelPlan):
    names = plan.symbols
    locals_ = {symbol(n): cxx_name(n) for n in names}

    def trt_expr(text: str) -> str:
        return TrtExprPrinter(locals_).print(parse(text, names))

    def trt_read(read: SymbolRead) -> str:
        x = sympy.Symbol("kl_dim", integer=True, nonnegative=True)
        source = sympy.floor((x - read.offset) / read.scale) if (read.scale != 1 or read.offset) else x
        return TrtExprPrinter({x: f"inputs[{read.input}].d[{read.dim}]"}).print(source)

    def cxx_int(text: str) -> str:
        return to_cxx(parse(text, names), locals_)

    return {"trt_expr": trt_expr, "trt_read": trt_read, "cxx_int": cxx_int, "cxx_name": cxx_name,
            "trt_dtype": trt_dtype, "c_quote": c_quote}


def trt_sources(ir: GraphIR, kind: str, plan: ModelPlan | None = None) -> dict[str, str]:
    """Every C++ file of the plugin library (``kind``: ``"v3"`` or ``"v2"``), by file name."""
    plan = plan or build_plan(ir)
    env = templates(HERE)
    env.filters.update(_printers(plan))
    plugins = [(name, k) for k, name in plugin_names(ir, plan).items()]
    return {
        **common_headers(),
        "kl_trt.h": (HERE / "kl_trt.h").read_text(),
        "kl_launches.cpp": render_launches(ir, plan),
        "kl_trt_plan.cpp": env.get_template("kl_trt_plan.cpp.j2").render(plan=plan),
        f"kl_trt_{kind}.cpp": env.get_template(f"kl_trt_{kind}.cpp.j2").render(plan=plan, plugins=plugins),
    }


def trt_onnx(ir: GraphIR, plan: ModelPlan | None = None) -> onnx.ModelProto:
    """The lowered graph with each kernel node named after its plugin, for TensorRT's parser."""
    model = onnx.ModelProto.FromString(lower_to_onnx_cached(ir, opset=OPSET).SerializeToString())
    names = plugin_names(ir, plan)
    for node in all_nodes(model.graph):  # If branches too (a model split by size)
        if node.domain == DOMAIN:
            node.op_type = names[node.op_type]
            node.attribute.extend([helper.make_attribute("plugin_version", PLUGIN_VERSION),
                                   helper.make_attribute("plugin_namespace", DOMAIN)])
    return model


@dataclass
class TrtBuildState(BuildState):
    """What the TensorRT targets' stages hand on: the launch plan, headers, version, sources."""

    plan: ModelPlan | None = None
    include: Path | None = None
    version: str = ""
    sources: dict[str, str] = field(default_factory=dict)


class _TrtTarget(StagedTarget):
    kind = "v3"
    aliases = ("tensorrt",)

    def check_version(self, version: str) -> None:
        major = int(version.split(".")[0])
        if major < 10:
            raise KernelLensError(f"TensorRT {version} headers: kernel_lens's TensorRT plugins need "
                                  f"TensorRT 10 or newer (IPluginV3); set TENSORRT_INCLUDE_DIR")

    def requirements(self, stop_after: str | None = None) -> list:
        needs = []
        if stop_after in (None, "build"):
            needs.append(("C++ compiler", find_cxx))
        if stop_after != "lower":  # emit reads the TensorRT version; build needs the CUDA headers too
            needs.append(("TensorRT headers", lambda: self.check_version(tensorrt_version(find_tensorrt_include()))))
        if stop_after in (None, "build"):
            needs.append(("CUDA runtime headers", find_cuda_include))
        return needs

    state_type = TrtBuildState

    def stage_lower(self, ir: GraphIR, out_dir: Path, state: TrtBuildState) -> dict[str, Path]:
        from_values = [g for g in ir.graphs() if g.runtime_symbols or g.checks]
        if from_values:
            g = from_values[0]
            what = (f"sizes computed from tensor values ({', '.join(g.runtime_symbols)})"
                    if g.runtime_symbols else "run-time checks of branches on tensor values")
            raise UnsupportedKernelError(
                f"{ir.name}: {self.name} cannot express {what}: its plugins take shapes from "
                f"input shapes only; build --target ort for this model")
        ensure_folder(out_dir)
        path = inside(out_dir, f"{ir.name}.trt.onnx")
        state.plan = build_plan(ir)  # the emit stage prints from the same plan
        save_onnx(trt_onnx(ir, state.plan), path)
        return {"onnx": path}

    def stage_emit(self, ir: GraphIR, out_dir: Path, state: TrtBuildState) -> dict[str, Path]:
        state.include = find_tensorrt_include()
        state.version = tensorrt_version(state.include)
        self.check_version(state.version)
        state.sources = trt_sources(ir, self.kind, state.plan)
        return self.write_sources(out_dir, f"src_trt_{self.kind}", state.sources) if state.final else {}

    def stage_build(self, ir: GraphIR, out_dir: Path, state: TrtBuildState) -> dict[str, Path]:
        name = f"kl_{ir.name}_trt_{self.kind}"
        library = build_shared_library(name, state.sources,
                                       include_dirs=[state.include, find_cuda_include()],
                                       key_extra=f"tensorrt-{state.version}")
        path = atomic_copy(library, inside(out_dir, f"lib{name}.so"))
        log.info("%s: wrote %s", self.name, path)
        return {"library": path}

    stage_table = (Stage("lower", stage_lower), Stage("emit", stage_emit), Stage("build", stage_build))


    def runner(self, ir: GraphIR, artifacts: dict[str, Path], *, cuda_graph: bool = False,
               package: str | None = None, **options):
        """A TensorRT engine over the artifacts (``package``: ``tensorrt`` or ``tensorrt_rtx``;
        default, the first that imports). Built at the first run, cached per GPU and version."""
        from ...runtime.trt import TrtModel  # lazy: imports torch; emit and build run without it

        if cuda_graph:
            raise KernelLensError(f"{self.name} runner: cuda_graph=True is ONNX Runtime's CUDA-graph "
                                  f"mode; the TensorRT runner has none (run with backend='ort' for it)")
        onnx_path, library = self.runner_inputs(artifacts, options, "package")
        return TrtModel(ir, onnx_path, library, package=package)


class TrtV3Target(_TrtTarget):
    name = "trt-v3"
    description = "TensorRT IPluginV3 plugins + ONNX graph (TensorRT >= 10)"
    kind = "v3"


class TrtV2Target(_TrtTarget):
    name = "trt-v2"
    description = "TensorRT IPluginV2DynamicExt plugins + ONNX graph (TensorRT 10.x)"
    kind = "v2"

    def check_version(self, version: str) -> None:
        super().check_version(version)
        if int(version.split(".")[0]) >= 11:
            raise KernelLensError(f"trt-v2: TensorRT {version} removed IPluginV2DynamicExt; build "
                                  f"--target trt-v3 (or trt) instead")


class TrtTarget(TrtV3Target):
    name = "trt"
    description = "TensorRT plugins + ONNX graph: IPluginV3 (trt-v3)"
