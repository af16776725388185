"""Per-launch comparison for ``kernel_lens verify`` (on a GPU, ORT artifacts): what each Triton
launch wrote, eager against compiled, as Polygraphy's ``--onnx-outputs mark all`` does for
TensorRT.

Eager: the model runs once more under the capture, and each launch's written tensors are copied
right after it ran. Compiled: the folder's ONNX graph with every launch node's outputs added as
graph outputs, run by ONNX Runtime's CUDA EP with the folder's plugin library. Launch ``i`` of
the IR is the ``i``-th launch of the eager run (the capture made the IR in that order); a node's
output is the whole root tensor its kernel wrote, which is viewed as the kernel's argument was
(shape, strides, offset) before comparing.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
import torch

from .codegen.launch_io import LaunchIO, launch_io
from .frontends.capture.recorder import CapturedLaunch, capture
from .ir import GraphIR
from .ir.symbolic import evaluate, parse
from .onnx.context import DOMAIN, onnx_dtype
from .runtime.signature import CallSignature, torch_dtype


@dataclass
class WrittenCheck:
    param: str
    exact: bool | None = None
    max_abs: float | None = None
    problem: str = ""


@dataclass
class LaunchCheck:
    index: int
    kernel: str
    written: list[WrittenCheck] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return all(w.exact for w in self.written)


def _written(io: LaunchIO) -> list[tuple[str, int]]:
    """(kernel parameter, node output index) of each tensor a launch writes."""
    return [(p, j) for p, (kind, j) in io.bindings.items() if kind == "out"]


def eager_launch_results(model: Any, inputs: tuple, ir: GraphIR,
                         ios: list[LaunchIO]) -> list[dict[str, torch.Tensor]]:
    """Per launch of the eager run, a copy of each tensor the IR's launch of that index writes
    (``ios``: each launch's node), taken right after it ran."""
    copies: list[dict[str, torch.Tensor]] = []

    def after(launch: CapturedLaunch) -> None:
        params = dict(_written(ios[len(copies)])) if len(copies) < len(ios) else {}
        copies.append({p: launch.params[p].clone() for p in params
                       if isinstance(launch.params.get(p), torch.Tensor)})

    capture(model, inputs, ir.arch, after_launch=after)
    return copies


def compiled_launch_results(ir: GraphIR, ios: list[LaunchIO], onnx_path: Path, library: Path,
                            inputs: tuple, device: int) -> list[list[torch.Tensor]]:
    """Per launch, its node's outputs (the written roots), from ORT's CUDA EP."""
    import onnxruntime as ort  # lazy: only a GPU run with ORT artifacts needs it

    model = onnx.load(str(onnx_path))
    graph = model.graph
    nodes: dict[int, list[str]] = {}
    for node in graph.node:
        if node.domain == DOMAIN:
            nodes[next(a.i for a in node.attribute if a.name == "launch")] = list(node.output)
    names = list(ir.symbols)
    sizes = dict(zip(names, CallSignature(ir).symbol_values(list(inputs))))
    have = {o.name for o in graph.output}
    marked: dict[str, tuple[torch.Tensor, int]] = {}  # node output -> (buffer, ONNX type)
    for i, io in enumerate(ios):
        for (value, _), name in zip(io.outputs, nodes.get(i, [])):
            info = ir.values[value]
            if name not in have:
                graph.output.append(onnx.helper.make_tensor_value_info(name, onnx_dtype(info.dtype), None))
                have.add(name)
            shape = [evaluate(parse(d, names), sizes) for d in info.shape]
            marked[name] = (torch.empty(shape, dtype=torch_dtype(info.dtype), device=f"cuda:{device}"),
                            onnx_dtype(info.dtype))
    with tempfile.TemporaryDirectory(prefix="kl_verify_") as tmp:
        path = Path(tmp) / "marked.onnx"
        onnx.save(model, str(path), save_as_external_data=True, location="marked.data")
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.register_custom_ops_library(str(library))
        session = ort.InferenceSession(str(path), so, providers=[
            ("CUDAExecutionProvider", {"device_id": str(device)})])
        binding = session.io_binding()
        for name, t in zip(ir.inputs, inputs):
            t = t.contiguous()
            binding.bind_input(name, "cuda", device, onnx_dtype(ir.values[name].dtype),
                               tuple(t.shape), t.data_ptr())
        for out in session.get_outputs():
            if out.name not in marked:
                binding.bind_output(out.name, "cuda", device)  # ORT allocates the model's outputs
            else:
                t, code = marked[out.name]
                binding.bind_output(out.name, "cuda", device, code, tuple(t.shape), t.data_ptr())
        torch.cuda.synchronize(device)
        session.run_with_iobinding(binding)
    return [[marked[n][0] for n in nodes.get(i, [])] for i in range(len(ios))]


def compare_written(param: str, root: torch.Tensor | None, want: torch.Tensor | None) -> WrittenCheck:
    """The compiled node's output ``root`` (the whole tensor the kernel wrote into, dense)
    viewed as eager's argument ``want`` was (shape, strides, storage offset), against it."""
    check = WrittenCheck(param)
    if want is None or root is None:
        check.problem = "not compared (not a plain tensor argument)"
        return check
    flat = root.to(want.device).reshape(-1)
    extent = want.storage_offset() + sum((s - 1) * st for s, st in zip(want.shape, want.stride())) + 1
    if flat.dtype != want.dtype or (want.numel() and extent > flat.numel()):
        check.problem = "not compared (the node's output is laid out unlike the argument)"
        return check
    view = flat.as_strided(want.shape, want.stride(), want.storage_offset()) if want.numel() else want
    check.exact = same_bytes(view, want)
    diff, _ = differences(view, want)
    check.max_abs = float(diff.max()) if diff.numel() else 0.0
    return check


def differences(got: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Absolute and relative differences, element by element (float64, on ``got``'s device: no
    copy to the host): 0 where the values are equal (NaN where both are NaN, the same infinity),
    inf for a NaN against a number."""
    g, w = got.detach().double(), want.detach().to(got.device).double()
    same = (g == w) | (g.isnan() & w.isnan())
    diff = torch.where(same, 0.0, (g - w).abs().nan_to_num(nan=float("inf")))
    rel = torch.where(same, 0.0, (diff / w.abs().clamp_min(1e-12)).nan_to_num(nan=float("inf")))
    return diff, rel


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` hold the same bytes, element by element (bit-exact, NaNs included)."""
    return bool(torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                            b.contiguous().reshape(-1).view(torch.uint8)))


def compare_launches(model: Any, inputs: tuple, ir: GraphIR, onnx_path: Path, library: Path,
                     device: int) -> tuple[list[LaunchCheck], str]:
    """Each launch's written tensors, eager against compiled; the second item says why no
    comparison was made (empty when it was)."""
    if ir.pieces or ir.branches:
        what = "split by size" if ir.pieces else "traced from several examples (value branches)"
        return [], f"per-launch results of a model {what} (its launches are in If branches)"
    ios = [launch_io(ir, launch, f"__{launch.order}") for launch in ir.launches]
    eager = eager_launch_results(model, tuple(t.clone() for t in inputs), ir, ios)
    if len(eager) != len(ir.launches):
        return [], (f"per-launch results: the eager run made {len(eager)} launches, the IR has "
                    f"{len(ir.launches)} (a launch the trace folded or split)")
    compiled = compiled_launch_results(ir, ios, onnx_path, library, inputs, device)
    checks = []
    for i, (launch, io, want, got) in enumerate(zip(ir.launches, ios, eager, compiled)):
        check = LaunchCheck(i, ir.kernels[launch.kernel].name)
        for param, j in _written(io):
            check.written.append(compare_written(param, got[j] if j < len(got) else None,
                                                 want.get(param)))
        checks.append(check)
    return checks, ""
