"""``kernel_lens verify``: the compiled model against the model run eagerly, at the example and at
sizes drawn from the declared ranges (each dynamic size at its minimum, an odd size inside, and
its maximum, capped), as Polygraphy does for TensorRT.

On a CUDA GPU, per size set and output: max abs and max rel difference, bit-exactness, and the
median time of eager and of the compiled model side by side. On a host without one the plugins
cannot run (they launch Triton's cubins): the check is then what can be done there, and the report
says what was not: the call signature is evaluated at every size set (input checks, the size
piece chosen, each output's shape and dtype) against the eager run through Triton's interpreter.
With ORT artifacts on a GPU, each Triton launch's written tensors are compared too
(:mod:`kernel_lens.verify_launches`): the first launch that differs is where to look. Those
comparisons are reported, not judged (whole buffers are compared, and the parts a kernel never
writes hold whatever the allocator left); the outputs decide the result.
"""

from __future__ import annotations

import copy
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from . import progress
from .compiler import CompiledModel, compile, load
from .errors import InputError, KernelLensError
from .frontends.capture.recorder import capture
from .frontends.lift import input_names
from .frontends.trace.size_pieces import inputs_at, piece_ends
from .ir import GraphIR
from .kernels import is_own_kernel
from .model_file import load_model_file
from .runtime.signature import CallSignature, torch_dtype
from .verify_launches import LaunchCheck, compare_launches, differences, same_bytes

MAX_SIZE = 4096  # the largest size verify runs by default (a declared max of 2**20 is capped)


@dataclass
class OutputCheck:
    name: str
    shape: tuple[int, ...]
    dtype: str
    max_abs: float | None = None  # None: values not compared (no GPU)
    max_rel: float | None = None
    exact: bool | None = None
    problem: str = ""


@dataclass
class SizeCheck:
    sizes: dict[str, int]
    piece: int | None = None
    outputs: list[OutputCheck] = field(default_factory=list)
    eager_ms: float | None = None
    compiled_ms: float | None = None
    problem: str = ""  # the size set could not be checked, or the compiled model failed it
    skipped: bool = False  # eager itself refuses these sizes: nothing to compare against
    launches: list[LaunchCheck] = field(default_factory=list)  # per Triton launch (GPU, ORT)
    launch_note: str = ""  # why launches were not compared

    @property
    def ok(self) -> bool:
        # per-launch results point at where outputs diverge; they do not decide: a buffer's
        # parts a kernel never writes (scratch, padding) hold whatever the allocator left there
        return self.skipped or (not self.problem and not any(o.problem for o in self.outputs))


@dataclass
class Report:
    model: str
    device: str
    sets: list[SizeCheck]
    not_checked: list[str]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.sets)

    def text(self) -> str:
        lines = [f"verify {self.model} on {self.device}:"]
        for s in self.sets:
            sizes = ", ".join(f"{k}={v}" for k, v in s.sizes.items()) or "static"
            piece = f" (piece {s.piece})" if s.piece is not None else ""
            times = (f"  eager {s.eager_ms:.3f} ms, compiled {s.compiled_ms:.3f} ms"
                     if s.eager_ms is not None and s.compiled_ms is not None else "")
            status = "skip" if s.skipped else "ok" if s.ok else "FAIL"
            lines.append(f"  [{status}] {sizes}{piece}{times}")
            if s.problem:
                lines.append(f"      {s.problem}")
            for o in s.outputs:
                values = ("values not compared" if o.max_abs is None else
                          f"max abs {o.max_abs:.3g}, max rel {o.max_rel:.3g}, "
                          f"{'bit-exact' if o.exact else 'not bit-exact'}")
                lines.append(f"      {o.name} {list(o.shape)} {o.dtype}: {values}"
                             + (f"  -- {o.problem}" if o.problem else ""))
            if s.launches:
                exact = sum(c.exact for c in s.launches)
                lines.append(f"      launches: {exact} of {len(s.launches)} bit-exact")
                for c in s.launches:
                    for w in c.written:
                        if not w.exact:
                            detail = w.problem or f"max abs {w.max_abs:.3g}, not bit-exact"
                            lines.append(f"        launch {c.index} ({c.kernel}) {w.param}: {detail}")
            elif s.launch_note:
                lines.append(f"      launches not compared: {s.launch_note}")
        for note in self.not_checked:
            lines.append(f"  not checked: {note}")
        lines.append("result: " + ("ok" if self.ok else "FAILED"))
        return "\n".join(lines)


def size_sets(ir: GraphIR, cap: int = MAX_SIZE, example: dict[str, int] | None = None) -> list[dict[str, int]]:
    """The example's sizes (``example``, else the IR's), then every size at its minimum, at an odd
    size inside its range and at its maximum, then both ends of every size piece (the other sizes
    at the example's); duplicates dropped. No size but the example's is above ``cap``, whatever
    the IR says: a range or piece starting above it gets no point (see :func:`above_cap`)."""
    example = example if example is not None else {s: info.example for s, info in ir.symbols.items()}
    sets = [example]
    for pick in ("min", "odd", "max"):
        point = {}
        for s, info in ir.symbols.items():
            hi = min(cap, info.max if info.max is not None else cap)
            value = {"min": info.min, "max": hi, "odd": (info.min + hi) // 2 | 1}[pick]
            point[s] = max(info.min, min(value, hi))
        if point not in sets and all(v <= cap for v in point.values()):
            sets.append(point)
    for piece in ir.pieces:  # both ends of every piece: where a piece's graph is least proven
        for box in piece.when:
            for end in (0, 1):
                point = dict(example)
                point.update({s: max(r[0], min(r[end], cap)) for s, r in box.ranges.items()})
                if point not in sets and all(point[s] <= cap for s in box.ranges):
                    sets.append(point)
    return sets


def above_cap(ir: GraphIR, cap: int) -> list[str]:
    """What :func:`size_sets` cannot check under ``cap``: ranges and pieces starting above it."""
    notes = [f"sizes of {s}: its range starts at {info.min}, above the cap {cap} (--max-size)"
             for s, info in ir.symbols.items() if info.min > cap]
    notes += [f"size piece {k}: it starts at {s}={r[0]}, above the cap {cap} (--max-size)"
              for k, piece in enumerate(ir.pieces) for box in piece.when
              for s, r in box.ranges.items() if r[0] > cap and ir.symbols[s].min <= cap]
    return notes


def example_sizes(ir: GraphIR, inputs: Any) -> dict[str, int]:
    """The sizes of the example inputs the model file gives (symbol -> value): what the verify
    of a folder starts from, never the folder's own word for them."""
    flat = _flat(inputs)
    sizes = {}
    for s, info in ir.symbols.items():
        shape = flat[info.input].shape if info.input < len(flat) else ()
        if info.dim >= len(shape):
            raise InputError(f"the artifacts read size {s} from input {info.input} dim {info.dim}, "
                             f"which the model file's example inputs lack: not this model's artifacts")
        sizes[s] = (shape[info.dim] - info.offset) // info.scale
    return sizes


def cpu_points(ir: GraphIR, example_inputs: tuple, spec: Any, budget: int) -> list[dict[str, int]]:
    """The example's sizes and both ends of every piece, each within ``budget`` input elements."""
    points = [{s: info.example for s, info in ir.symbols.items()}]
    for _, point in piece_ends(ir, budget):
        if point not in points:
            points.append(point)
    return points


def _flat(x: Any) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for item in x for t in _flat(item)]
    if isinstance(x, dict):
        return [t for item in x.values() for t in _flat(item)]
    return []


def _median_ms(fn, repeats: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _compare(name: str, got: torch.Tensor, want: torch.Tensor) -> OutputCheck:
    check = OutputCheck(name, tuple(got.shape), str(got.dtype).replace("torch.", ""))
    if got.shape != want.shape or got.dtype != want.dtype:
        check.problem = f"eager gives {list(want.shape)} {want.dtype}"
        return check
    diff, rel = differences(got, want)
    check.max_abs = float(diff.max()) if diff.numel() else 0.0
    check.max_rel = float(rel.max()) if rel.numel() else 0.0
    check.exact = same_bytes(got, want)
    return check


def own_kernels_note(ir: GraphIR) -> str:
    """What a value difference may come from when the model runs kernel_lens's own kernels
    (``optimize=2``) in place of torch ops: '' when it runs none."""
    names = sorted({k.name for g in ir.graphs() for k in g.kernels.values()
                    if is_own_kernel(k.source.qualname)})
    if not names:
        return ""
    return (f"; the compiled model runs kernel_lens's own kernels ({', '.join(names)}: optimize=2) "
            f"where eager runs torch's, which add in another order: compare with --rtol/--atol, or "
            f"compile with --opt-level 1 for the same bits as eager")


def cpu_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol) of the CPU evaluation against eager on the CPU: the Triton launches run in the
    same interpreter on both sides (exact), the torch ops as ONNX's reference evaluator (numpy)
    computes them against torch's own CPU kernels, which may round differently."""
    if dtype in (torch.float16, torch.bfloat16):
        return (2e-2, 2e-2) if dtype == torch.bfloat16 else (5e-3, 5e-3)
    if dtype.is_floating_point and dtype.itemsize == 1:  # fp8
        return (0.125, 0.125)
    return (1e-5, 1e-5) if dtype.is_floating_point else (0.0, 0.0)


def _judged(name: str, got: torch.Tensor, want: torch.Tensor,
            tolerance: tuple[float, float] | None) -> OutputCheck:
    """:func:`_compare`, with a problem when not bit-exact and not within ``tolerance``."""
    out = _compare(name, got, want)
    if out.max_abs is not None and not out.exact and not out.problem:
        rtol, atol = tolerance or (0.0, 0.0)
        if not torch.allclose(got.double().cpu(), want.double().cpu(), rtol=rtol, atol=atol,
                              equal_nan=True):
            out.problem = (f"not within the tolerance rtol={rtol}, atol={atol}" if tolerance
                           else "not bit-exact (give --rtol/--atol to accept a difference)")
    return out


def verify(model: Any, example_inputs: tuple, dynamic_shapes: Any, compiled: CompiledModel,
           input_names: list[str], *, cap: int = MAX_SIZE, repeats: int = 10,
           tolerance: tuple[float, float] | None = None, extra_examples: Any = None) -> Report:
    """Check ``compiled`` against ``model`` at :func:`size_sets` (see the module docstring), then
    at each of ``extra_examples`` as given (the inputs that took other branches on values).
    ``tolerance`` (rtol, atol): outputs not bit-exact pass when within it; None: bit-exact only."""
    ir = compiled.ir
    own = own_kernels_note(ir)
    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "CPU (no CUDA GPU)"
    signature = CallSignature(ir, device_type="cuda" if gpu else "cpu")
    sets = []
    not_checked = []
    if not gpu:
        not_checked += ["the compiled kernels (cubins) and timings: values were compared by "
                        "evaluating the compiled graph on the CPU, each launch in Triton's "
                        "interpreter; run verify on a GPU for the binaries themselves",
                        "per-launch results (on a GPU, with ORT artifacts)"]
    elif "ort.onnx" not in compiled.artifacts or "ort.library" not in compiled.artifacts:
        not_checked.append("per-launch results: they are read through the ORT artifacts, which "
                           "this folder lacks (compile with --target ort)")
    not_checked += above_cap(ir, cap)
    eager_model = copy.deepcopy(model).cuda() if gpu and isinstance(model, torch.nn.Module) else model
    points: list[tuple[dict[str, int], Any]] = [
        (sizes, None) for sizes in size_sets(ir, cap, example_sizes(ir, example_inputs))]
    points += [(example_sizes(ir, e), tuple(e)) for e in extra_examples or []]
    for k, (sizes, given) in enumerate(points, 1):
        check = SizeCheck(sizes)
        sets.append(check)
        extra = k - 1 - (len(points) - len(extra_examples or []))  # its index in extra_examples
        which = f"extra_examples[{extra}]" if given is not None else f"size set {k} of {len(points)}"
        with progress.stage(f"{which}: {', '.join(f'{s}={v}' for s, v in sizes.items())}"):
            try:
                inputs = given if given is not None else inputs_at(ir, example_inputs, dynamic_shapes,
                                                                   input_names, sizes)
            except Exception as exc:  # noqa: BLE001 - reported, not raised: the other sets still run
                check.problem = f"inputs of these sizes could not be made: {exc}"
                continue
            if gpu:
                inputs = tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in inputs)
            try:
                values = signature.symbol_values([t for t in _flat(inputs)])
                check.piece = getattr(values, "piece", None)
                shapes = signature.output_shapes(values)
            except InputError as exc:
                check.problem = f"the compiled model refuses these sizes: {exc}"
                continue
            try:
                with torch.no_grad():
                    if gpu:
                        want = _flat(eager_model(*[t.clone() for t in inputs]))
                    else:  # Triton's interpreter runs the kernels on the CPU
                        want = _flat(capture(model, tuple(t.clone() for t in inputs), ir.arch,
                                             launches_needed=False).outputs)
            except Exception as exc:  # noqa: BLE001
                check.problem = (f"skipped: the model run eagerly refuses these sizes "
                                 f"({type(exc).__name__}: {str(exc)[:200]}); narrow the declared range?")
                check.skipped = True
                continue
            try:
                got = _flat(compiled.run(*[t.clone() for t in inputs]))
            except KernelLensError as exc:
                check.problem = f"the compiled model failed: {exc}"
                continue
            for spec, g, w in zip(signature.outputs, got, want):
                out = _judged(spec.name, g, w, tolerance if gpu else tolerance or cpu_tolerance(spec.dtype))
                if out.problem and out.max_abs is not None and own:
                    out.problem += own
                check.outputs.append(out)
            if not gpu:
                continue
            if "ort.onnx" in compiled.artifacts and "ort.library" in compiled.artifacts:
                _check_launches(check, eager_model, inputs, compiled)
            copies = [tuple(t.clone() for t in inputs) for _ in range(2)]
            check.eager_ms = _median_ms(lambda: eager_model(*copies[0]), repeats)
            check.compiled_ms = _median_ms(lambda: compiled.run(*copies[1]), repeats)
    return Report(ir.name, device, sets, not_checked)


def _check_launches(check: SizeCheck, model: Any, inputs: tuple, compiled: CompiledModel) -> None:
    """Each launch's written tensors, eager against compiled (see :mod:`.verify_launches`);
    reported, not judged (see :attr:`SizeCheck.ok`)."""
    try:
        check.launches, check.launch_note = compare_launches(
            model, inputs, compiled.ir, compiled.artifacts["ort.onnx"],
            compiled.artifacts["ort.library"], inputs[0].device.index or 0)
    except Exception as exc:  # noqa: BLE001 - the outputs' verdict stands; say why not compared
        check.launch_note = f"{type(exc).__name__}: {str(exc)[:300]}"


def _on_cuda(examples: Any) -> Any:
    """``examples`` (extra example inputs) with each tensor moved to the GPU."""
    if not isinstance(examples, (list, tuple)):
        return examples  # compile() says what is wrong with it
    return [e.cuda() if isinstance(e, torch.Tensor) else
            tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in e)
            if isinstance(e, (list, tuple)) else e for e in examples]


def verify_file(path: str, artifacts: str | None = None, *, cap: int = MAX_SIZE,
                tolerance: tuple[float, float] | None = None) -> Report:
    """:func:`verify` for a model file and a compiled folder (``None``: compile it now, for the
    ORT target on a GPU host, the IR alone on a CPU host)."""
    with progress.stage(f"load model {path}"):
        mf = load_model_file(path)
    model = mf.model
    names = input_names(model, len(mf.example_inputs))
    if artifacts is not None:
        compiled = load(artifacts)
    elif torch.cuda.is_available():  # captured natively, as the user's own compile on a GPU would
        compiled = compile(copy.deepcopy(model).cuda() if isinstance(model, torch.nn.Module) else model,
                           tuple(t.cuda() if isinstance(t, torch.Tensor) else t for t in mf.example_inputs),
                           dynamic_shapes=mf.dynamic_shapes, roles=mf.roles, autotune=mf.autotune,
                           extra_examples=_on_cuda(mf.extra_examples),
                           targets=["ort"])
    else:
        compiled = compile(model, mf.example_inputs, dynamic_shapes=mf.dynamic_shapes,
                           roles=mf.roles, autotune=mf.autotune, extra_examples=mf.extra_examples)
    for name, t in zip(compiled.ir.inputs, mf.example_inputs):
        if isinstance(t, torch.Tensor) and t.dtype != torch_dtype(compiled.ir.values[name].dtype):
            raise InputError(f"{path}'s example input {name!r} is {t.dtype}, but the artifacts "
                             f"were compiled for {compiled.ir.values[name].dtype}: not this model's")
    return verify(model, mf.example_inputs, mf.dynamic_shapes, compiled, names, cap=cap,
                  tolerance=tolerance, extra_examples=mf.extra_examples)
