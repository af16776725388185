"""ONNX Runtime target: an ONNX graph with kernel_lens custom nodes + one custom-op library."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from ...fileio import atomic_copy, ensure_folder, inside
from ...ir import GraphIR
from ...onnx.context import CHECK_OP
from ...onnx.lower import lower_to_onnx_cached, save_onnx
from ...onnx.rewrites import for_onnxruntime
from ...toolchain.build import build_shared_library
from ...toolchain.compilers import find_cxx
from ...toolchain.headers import find_ort_include, ort_api_version
from ..base import BuildState, Stage, StagedTarget
from ..common.emit import common_headers, render_launches, templates

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
# The ONNX opset of the ORT target's graph: 23, where torch's exporter lowers
# scaled_dot_product_attention to ONNX Attention, which ORT's CUDA EP runs as one fused kernel
# (flash / memory-efficient attention) instead of materializing the score matrix; fp16 attention
# without a mask becomes com.microsoft.MultiHeadAttention (cuDNN's fused kernel, see
# onnx/rewrites.py's for_onnxruntime).
OPSET = 23


def onnx_graph(ir: GraphIR):
    """The ORT target's ONNX graph of ``ir`` (what its ``lower`` stage writes)."""
    return for_onnxruntime(lower_to_onnx_cached(ir, opset=OPSET))


def op_types(ir: GraphIR) -> list[str]:
    return sorted({launch.kernel for graph in ir.graphs() for launch in graph.launches})


def ort_sources(ir: GraphIR, api_version: int) -> dict[str, str]:
    """Every C++ file of the custom-op library, by file name."""
    env = templates(HERE)
    return {
        **common_headers(),
        "kl_launches.cpp": render_launches(ir),
        "kl_ort.cpp": env.get_template("kl_ort.cpp.j2").render(
            ir=ir, op_types=op_types(ir), api_version=api_version, check_op=CHECK_OP),
    }


@dataclass
class OrtBuildState(BuildState):
    """What the ORT target's stages hand on: the ORT API version, include folder and sources."""

    api: int = 0
    include: Path | None = None
    sources: dict[str, str] = field(default_factory=dict)


class OrtTarget(StagedTarget):
    """Stages: ``lower`` (the ONNX graph), ``emit`` (the library's C++ sources, written to
    ``src/`` only when stopping there), ``build`` (the custom-op library)."""

    name = "ort"
    aliases = ("onnxruntime",)
    description = "ONNX Runtime (CUDA EP): ONNX graph + OrtCustomOp library"

    def requirements(self, stop_after: str | None = None) -> list:
        needs = []
        if stop_after in (None, "build"):
            needs.append(("C++ compiler", find_cxx))
        if stop_after != "lower":  # emit reads the ORT API version from the headers
            needs.append(("ONNX Runtime headers", find_ort_include))
        return needs

    state_type = OrtBuildState

    def stage_lower(self, ir: GraphIR, out_dir: Path, state: OrtBuildState) -> dict[str, Path]:
        ensure_folder(out_dir)
        model_path = inside(out_dir, f"{ir.name}.onnx")
        save_onnx(onnx_graph(ir), model_path)
        return {"onnx": model_path}

    def stage_emit(self, ir: GraphIR, out_dir: Path, state: OrtBuildState) -> dict[str, Path]:
        state.include = find_ort_include()
        state.api = ort_api_version(state.include)
        state.sources = ort_sources(ir, state.api)
        return self.write_sources(out_dir, "src", state.sources) if state.final else {}

    def stage_build(self, ir: GraphIR, out_dir: Path, state: OrtBuildState) -> dict[str, Path]:
        library = build_shared_library(f"kl_{ir.name}_ort", state.sources,
                                       include_dirs=[state.include], key_extra=f"ort-api-{state.api}")
        lib_path = atomic_copy(library, inside(out_dir, f"libkl_{ir.name}_ort.so"))
        log.info("ort: wrote %s", lib_path)
        return {"library": lib_path}

    stage_table = (Stage("lower", stage_lower), Stage("emit", stage_emit), Stage("build", stage_build))

    def runner(self, ir: GraphIR, artifacts: dict[str, Path], *, cuda_graph: bool | str = False,
               **options):
        from ...runtime.ort import OrtModel  # lazy: torch and onnxruntime; emit and build run without them

        onnx_path, library = self.runner_inputs(artifacts, options, "cuda_graph")
        return OrtModel(ir, onnx_path, library, cuda_graph=cuda_graph)
