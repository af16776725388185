"""Run a kernel_lens ONNX model with ONNX Runtime's CUDA EP on torch tensors, zero-copy.

Inputs and outputs are bound with IOBinding to torch's memory; the session runs on torch's
current CUDA stream (ORT's ``user_compute_stream``), so no synchronization is added and the
custom ops launch on the same stream torch uses.

The call path is lean: everything that does not depend on the call's tensors (dtype codes,
rank and dim checks, output-shape evaluators as exact integer closures: the model's
:class:`~kernel_lens.runtime.signature.CallSignature`) is computed once; what depends only on
the tensors' layout (symbol values, output shapes, the checks' verdict) once per layout
(:meth:`CallSignature.checked`). A few IOBindings are kept per session, each holding the pointers
and shapes of an earlier call, and a call with the same ones binds nothing. Outputs made while the
caller still holds the last call's alternate between two buffers, so a call with new output
buffers gets a binding of its own (up to KEPT_BINDINGS); any other call re-binds only the names
that differ in the closest kept binding. On torch's legacy default stream the ordering with
ORT's own stream uses two events made once.

Inputs the model writes in place (a KV cache) come back as ONNX outputs ``mutated_<input>``;
where the graph allows it (:func:`kernel_lens.onnx.aliasing.in_place_inputs`) that output is
bound to the input's own buffer, so nothing is allocated or copied back; otherwise the new
contents are copied into the caller's tensor after the run.

CUDA graphs: per distinct input shape the runtime owns static input and output buffers bound
once, captures one graph for them on the first call and replays it on later calls. Inputs are
copied into the static buffers and outputs out of them on torch's stream, unless the caller
passes the static buffers themselves (:meth:`OrtModel.cuda_graph_buffers`), which makes a call
copy nothing. Two ways to capture (``cuda_graph=``):

* ``"torch"`` (what ``True`` means): a torch CUDA graph around ORT's ``Run`` on a stream the
  session owns; a replay is one graph launch (:mod:`kernel_lens.runtime.cuda_graph` says what is
  checked to keep it exact);
* ``"ort"``: ORT's own CUDA-graph mode (run option ``gpu_graph_id``), each call going through
  ``Run``.

A plain ``run()`` may also be captured by the caller's own ``torch.cuda.graph`` once the session of
that stream is open (one ``run()`` on it before): ORT synchronizes the device while it opens one.
"""

from __future__ import annotations

import functools
import os
import stat
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import onnx
import torch

from ..errors import ArtifactError, InputError, KernelLensError, UntracedBranchError
from ..ir import GraphIR
from ..onnx.aliasing import MUTATED_PREFIX, in_place_inputs
from ..onnx.context import onnx_dtype
from .cuda_graph import host_dependencies
from .signature import CallSignature, Shape, check_device

GRAPH_MODES = ("torch", "ort")
DEFAULT_GRAPH_MODE = "torch"  # what cuda_graph=True picks (benchmarks/bench_decode.py measured both)
KEPT_BINDINGS = 4  # IOBindings kept per session for plain runs, each for one set of pointers


def graph_mode(cuda_graph: object) -> str | None:
    """``cuda_graph=`` as a capture mode: None (no graph), "torch" or "ort"."""
    if cuda_graph is None or cuda_graph is False:
        return None
    if cuda_graph is True:
        return DEFAULT_GRAPH_MODE
    if isinstance(cuda_graph, str) and cuda_graph in GRAPH_MODES:
        return cuda_graph
    raise InputError(f"cuda_graph={cuda_graph!r}: pass True, False, or one of {GRAPH_MODES}")


@dataclass
class _Input:
    name: str
    dtype: torch.dtype
    code: int                                  # ONNX element type, for IOBinding


@dataclass
class _Output:
    name: str                                  # the ONNX graph's output name
    dtype: torch.dtype
    code: int


@dataclass
class _Mutation:
    output: str                                # mutated_<input>
    input: int                                 # the input's position
    in_place: bool                             # bound to the input's own buffer


@dataclass
class _Graph:
    """One CUDA graph: its static buffers, binding and run options, and (mode "torch") the
    captured torch graph, made on the first call."""

    inputs: list[torch.Tensor]
    outputs: list[torch.Tensor]
    mutated: list[torch.Tensor]                # the input's static buffer itself when in place
    binding: object
    run_options: object
    captured: torch.cuda.CUDAGraph | None = None

    def __post_init__(self) -> None:
        self.frozen = _layout([*self.inputs, *self.outputs])  # the buffers' pointers and shapes, as bound
        # The graph's own views of that memory: the buffers handed to the caller
        # (cuda_graph_buffers) may be re-pointed (set_) or resized (resize_) in place, which
        # changes those tensor objects but not what the binding and the captured graph use.
        self.own_inputs = [t.view(t.shape) for t in self.inputs]
        self.own_outputs = [t.view(t.shape) for t in self.outputs]
        mine = {id(t): own for t, own in zip(self.inputs, self.own_inputs)}
        self.own_mutated = [mine[id(t)] if id(t) in mine else t.view(t.shape) for t in self.mutated]


@dataclass
class _Session:
    session: object
    names: tuple[str, ...]                     # the bound names, in the order of a call's tensors
    # plain runs: the (pointer, shape) of each name -> the IOBinding holding them, last used last
    bindings: dict[tuple, object] = field(default_factory=dict)
    graphs: dict[tuple, _Graph] = field(default_factory=dict)

    @property
    def binding(self) -> object | None:
        """The IOBinding the last plain run used."""
        return next(reversed(self.bindings.values()), None)

    @property
    def bound(self) -> dict[str, tuple[int, Shape]]:
        """What that binding holds: name -> (pointer, shape)."""
        held = next(reversed(self.bindings), ())
        return {name: (pointer, tuple(shape)) for name, (pointer, shape) in zip(self.names, held)}


@dataclass
class _SideStream:
    """Where ORT runs while the caller is on the legacy default stream (which ORT cannot be
    given): a stream of its own, ordered after the caller's work and before its later work by
    two events made once (recording an event again leaves the waits already queued on it as
    they were)."""

    stream: torch.cuda.Stream
    raw: int
    caller: torch.cuda.Stream                  # the device's default stream
    ready: torch.cuda.Event = field(default_factory=torch.cuda.Event)
    done: torch.cuda.Event = field(default_factory=torch.cuda.Event)


class OrtModel:
    """An ONNX Runtime session over a compiled model, called with torch CUDA tensors."""

    def __init__(self, ir: GraphIR, onnx_path: str | Path, library_path: str | Path, *,
                 cuda_graph: bool | str = False) -> None:
        mode = graph_mode(cuda_graph)  # the one check of the mode's name, before any work
        # Checked before anything else: a relative library name reaches dlopen's search path.
        onnx_path, library_path = _pinned(onnx_path, "ONNX model"), _pinned(library_path, "plugin library")
        try:
            import onnxruntime as ort  # lazy: onnxruntime-gpu is optional (the [ort] extra)
        except ImportError:
            raise KernelLensError("running needs onnxruntime-gpu: pip install 'kernel_lens[ort]'") from None
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise KernelLensError(
                f"onnxruntime {ort.__version__} has no CUDAExecutionProvider "
                f"({ort.get_available_providers()}); install onnxruntime-gpu")
        self._ort = ort
        self.ir = ir
        self.graph_mode = mode
        self.cuda_graph = self.graph_mode is not None
        self.onnx_path, self.library_path = onnx_path, library_path
        self.signature = CallSignature(ir)
        if self.cuda_graph and any(g.runtime_symbols or g.checks for g in ir.graphs()):
            raise KernelLensError(
                f"{ir.name}: cuda_graph={cuda_graph!r}, but the model reads tensor values on the "
                f"host (run-time sizes or branch checks), which a CUDA graph cannot replay: run "
                f"without cuda_graph")
        self._inputs = [_Input(spec.name, spec.dtype, onnx_dtype(spec.ir_dtype))
                        for spec in self.signature.inputs]
        self._outputs = [_Output(f"output_{i}", o.dtype, onnx_dtype(o.ir_dtype))
                         for i, o in enumerate(self.signature.outputs)]
        model = onnx.load(self.onnx_path, load_external_data=False)
        in_place = in_place_inputs(model)
        self._mutated = [_Mutation(o.name, ir.inputs.index(name), name in in_place)
                         for o in model.graph.output if o.name.startswith(MUTATED_PREFIX)
                         for name in [o.name.removeprefix(MUTATED_PREFIX)]]
        self._written = tuple(m.input for m in self._mutated)
        # What a call binds, in the order of its tensors (inputs, outputs, mutated inputs):
        # (an input?, name, ONNX element type).
        self._slots = ([(True, spec.name, spec.code) for spec in self._inputs]
                       + [(False, o.name, o.code) for o in self._outputs]
                       + [(False, m.output, self._inputs[m.input].code) for m in self._mutated])
        self._output_slots = slice(len(self._inputs), len(self._inputs) + len(self._outputs))
        self._sessions: dict[tuple[int, int], _Session] = {}
        self._side_streams: dict[int, _SideStream] = {}
        self._capture_streams: dict[int, torch.cuda.Stream] = {}
        self._last: _Graph | None = None  # the torch graph the last call replayed (fast path)
        self._lock = threading.Lock()  # a session's IOBindings: bind + run must not interleave
        self._run_options = self._make_run_options(-1)  # plain runs: never capture

    def _make_run_options(self, graph_id: int):
        options = self._ort.RunOptions()
        # Work stays queued on torch's stream: no device synchronization at the end of Run.
        options.add_run_config_entry("disable_synchronize_execution_providers", "1")
        # Always an explicit graph id (-1: never capture): without one, ORT's Python wrapper
        # looks the key up and catches a C++ exception on every call, ~30 us of host time.
        options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return options

    @property
    def in_place(self) -> list[str]:
        """The inputs the model writes that are updated in the caller's own buffer."""
        return [self.ir.inputs[m.input] for m in self._mutated if m.in_place]

    def _stream(self, index: int) -> tuple[int, _SideStream | None]:
        """The raw stream ORT runs on: torch's current one; when that is the legacy default
        stream (which ORT cannot be given), a side stream ordered against it with events,
        returned as the second item (None when no ordering is needed)."""
        raw = torch._C._cuda_getCurrentRawStream(index)  # no Stream object: ~0.2 us
        if raw:
            return raw, None
        side = self._side_streams.get(index)
        if side is None:
            stream = torch.cuda.Stream(index)
            side = self._side_streams[index] = _SideStream(stream, stream.cuda_stream,
                                                           torch.cuda.default_stream(index))
        return side.raw, side

    def session(self, index: int, stream: int) -> _Session:
        key = (index, stream)
        state = self._sessions.get(key)
        if state is None:
            if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
                raise KernelLensError(
                    f"cannot open an ONNX Runtime session for {self.onnx_path} inside a CUDA graph "
                    f"capture (ORT synchronizes the device while it opens one): call run() once on "
                    f"this stream before capturing, or use cuda_graph=True")
            so = self._ort.SessionOptions()
            so.log_severity_level = 3  # errors only
            _unchanged(self.library_path, "plugin library")
            _unchanged(self.onnx_path, "ONNX model")
            so.register_custom_ops_library(self.library_path)
            # fp32 matmuls in ORT use TF32 by default; follow torch's setting instead.
            options = {"device_id": str(index),
                       "use_tf32": str(int(torch.backends.cuda.matmul.allow_tf32)),
                       "has_user_compute_stream": "1", "user_compute_stream": str(stream)}
            if self.graph_mode == "ort":
                options["enable_cuda_graph"] = "1"
            check_device(self.ir, index)  # no binary for this GPU's arch: one line, before ORT
            try:
                session = self._ort.InferenceSession(
                    self.onnx_path, so, providers=[("CUDAExecutionProvider", options)])
            except Exception as exc:  # ORT raises its own exception types
                hint = (" (CUDA-graph mode needs every node on the CUDA EP and no host "
                        "synchronization; run without cuda_graph=True)" if self.cuda_graph else "")
                raise KernelLensError(f"ONNX Runtime cannot open {self.onnx_path}: {exc}{hint}") from None
            state = self._sessions[key] = _Session(session, tuple(name for _, name, _ in self._slots))
        return state

    # --- validation (the model's call signature, shared by every runner) --------------------
    def symbol_values(self, tensors: Sequence[torch.Tensor]) -> list[int]:
        return self.signature.symbol_values(tensors)

    def output_shapes(self, values: Sequence[int]) -> list[Shape]:
        return self.signature.output_shapes(values)

    # --- running -----------------------------------------------------------------------------
    def run(self, *tensors: torch.Tensor, out: Sequence[torch.Tensor] | None = None):
        last = self._last
        if last is not None and out is not None and len(tensors) == len(last.inputs) \
                and len(out) == len(last.outputs) \
                and all(a is b for a, b in zip((*tensors, *out), (*last.inputs, *last.outputs))) \
                and _layout([*tensors, *out]) == last.frozen:
            # The static buffers of the graph the last call replayed, unchanged (the very same
            # tensors, pointers and shapes, all checked when that graph was made): replay only.
            with self._lock:
                last.captured.replay()
                self._copy_back(tensors, last)
            return out[0] if len(out) == 1 else tuple(out)
        call = self.signature.checked(tensors, out, self._written)
        device, shapes = call.device, call.shapes
        with self._lock:
            if self.cuda_graph:
                outputs = self._run_graph(tensors, shapes, out, device)
            elif any(s is None for s in shapes):  # sizes computed from values: ORT allocates
                outputs = self._run_allocated(tensors, shapes, device)
            else:
                outputs = list(out) if out is not None else \
                    [torch.empty(s, dtype=o.dtype, device=device) for s, o in zip(shapes, self._outputs)]
                self._run_bound(tensors, outputs, device)
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _bind(self, binding, index: int, held: tuple, now: tuple) -> None:
        """Bind the tensors whose (pointer, shape) are ``now`` (in the order of ``_slots``) where
        ``binding`` holds other ones than ``held`` (empty: a new binding; ORT replaces the
        binding of a name bound again)."""
        for i, ((is_input, name, code), (pointer, shape)) in enumerate(zip(self._slots, now)):
            if not held or held[i] != now[i]:
                bind = binding.bind_input if is_input else binding.bind_output
                bind(name, "cuda", index, code, tuple(shape), pointer)

    def _binding(self, state: _Session, index: int, tensors) -> object:
        """An IOBinding of ``state``'s session holding ``tensors`` (inputs, outputs, mutated
        inputs): the one kept for these pointers and shapes; else the kept one differing in the
        fewest names (the least recently used of those), re-bound where it differs, unless the
        outputs differ from its own and fewer than KEPT_BINDINGS are kept: then a new one."""
        now = _layout(tensors)
        bindings = state.bindings
        binding = bindings.pop(now, None)
        if binding is None:
            held = min(bindings, default=(), key=lambda kept: sum(a != b for a, b in zip(kept, now)))
            outputs = self._output_slots
            if not held or (len(bindings) < KEPT_BINDINGS and held[outputs] != now[outputs]):
                binding, held = state.session.io_binding(), ()
            else:
                binding = bindings.pop(held)
            self._bind(binding, index, held, now)  # kept again only once bound in full
        bindings[now] = binding
        return binding

    @staticmethod
    def _run_ordered(side: _SideStream | None, session, binding, options) -> None:
        """ORT's Run; on a side stream, ordered after and before the caller's stream's work."""
        if side is not None:  # inputs and outputs are ready on the caller's stream
            side.ready.record(side.caller)
            side.stream.wait_event(side.ready)
        try:
            session.run_with_iobinding(binding, options)
        except Exception as exc:  # a run-time check of a branch on tensor values
            marker = "UntracedBranchError: "
            if marker in str(exc):
                raise UntracedBranchError(str(exc).split(marker, 1)[1].strip()) from None
            raise
        if side is not None:  # the caller's later work sees the results
            side.done.record(side.stream)
            side.caller.wait_event(side.done)

    def _run_bound(self, tensors, outputs, device) -> None:
        index = device.index
        stream, side = self._stream(index)
        state = self.session(index, stream)
        mutated = [tensors[m.input] if m.in_place else torch.empty_like(tensors[m.input])
                   for m in self._mutated]
        binding = self._binding(state, index, (*tensors, *outputs, *mutated))
        self._run_ordered(side, state.session, binding, self._run_options)
        for m, new in zip(self._mutated, mutated):  # the model mutates these inputs: so does the
            if not m.in_place:                      # compiled model
                tensors[m.input].copy_(new)

    def _run_allocated(self, tensors, shapes, device) -> list[torch.Tensor]:
        """A call of a model whose output shapes follow tensor values (``shapes``: None for
        those): ORT allocates those outputs on the device (a binding of their own, made per call)
        and each is copied into a torch tensor on the same stream before the binding goes."""
        index = device.index
        stream, side = self._stream(index)
        state = self.session(index, stream)
        mutated = [tensors[m.input] if m.in_place else torch.empty_like(tensors[m.input])
                   for m in self._mutated]
        outputs = [None if s is None else torch.empty(s, dtype=o.dtype, device=device)
                   for s, o in zip(shapes, self._outputs)]
        binding = state.session.io_binding()
        for (is_input, name, code), t in zip(self._slots, (*tensors, *outputs, *mutated)):
            if t is None:
                binding.bind_output(name, "cuda", index)
            else:
                (binding.bind_input if is_input else binding.bind_output)(
                    name, "cuda", index, code, tuple(t.shape), t.data_ptr())
        self._run_ordered(side, state.session, binding, self._run_options)
        made = binding.get_outputs()[:len(outputs)]  # in the order bound: the model's outputs first
        outputs = [t if t is not None else _from_ort(v, o.dtype, device)
                   for t, v, o in zip(outputs, made, self._outputs)]
        for m, new in zip(self._mutated, mutated):
            if not m.in_place:
                tensors[m.input].copy_(new)
        return outputs

    # --- CUDA graphs ---------------------------------------------------------------------------
    def _capture_stream(self, index: int) -> torch.cuda.Stream:
        if index not in self._capture_streams:
            self._capture_streams[index] = torch.cuda.Stream(index)
        return self._capture_streams[index]

    def _graph(self, tensors, shapes, device) -> tuple[_Graph, _Session, torch.cuda.Stream | None]:
        if self.graph_mode == "torch":  # a session of its own, on a stream of its own
            stream, side = self._capture_stream(device.index).cuda_stream, None
        else:
            stream, side = self._stream(device.index)
        state = self.session(device.index, stream)
        key = tuple(tuple(t.shape) for t in tensors)
        graph = state.graphs.get(key)
        if graph is None:
            inputs = [torch.empty(tuple(t.shape), dtype=s.dtype, device=device)
                      for t, s in zip(tensors, self._inputs)]
            outputs = [torch.empty(shape, dtype=o.dtype, device=device)
                       for shape, o in zip(shapes, self._outputs)]
            # ORT's own graph mode runs the model more than once on a call that captures:
            # an input updated in place would advance twice, so it gets a buffer of its own.
            own = self.graph_mode == "ort"
            mutated = [inputs[m.input] if m.in_place and not own else torch.empty_like(inputs[m.input])
                       for m in self._mutated]
            binding = state.session.io_binding()
            self._bind(binding, device.index, (), _layout([*inputs, *outputs, *mutated]))
            graph = state.graphs[key] = _Graph(inputs, outputs, mutated, binding,
                                               self._make_run_options(len(state.graphs) + 1))
        return graph, state, side

    def cuda_graph_buffers(self, *tensors: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """The static input and output buffers of the CUDA graph for these inputs' shapes.

        Fill the inputs in place and call ``run(*inputs, out=outputs)``: nothing is copied, and
        the outputs are overwritten by the next call with the same shapes."""
        if not self.cuda_graph:
            raise KernelLensError("cuda_graph_buffers needs a model run with cuda_graph=True")
        values = self.symbol_values(tensors)
        with self._lock:
            graph, _, _ = self._graph(tensors, self.output_shapes(values), tensors[0].device)
        return list(graph.inputs), list(graph.outputs)

    def _run_graph(self, tensors, shapes, out, device) -> list[torch.Tensor]:
        graph, state, side = self._graph(tensors, shapes, device)
        for static, t in zip(graph.own_inputs, tensors):
            if static.data_ptr() != t.data_ptr() or static.shape != t.shape:
                static.copy_(t)
        if graph.captured is not None:
            graph.captured.replay()  # on the caller's stream
        elif self.graph_mode == "torch":
            self._capture(graph, state, device)
        if graph.captured is not None:
            self._last = graph
        if self.graph_mode == "ort":
            try:
                self._run_ordered(side, state.session, graph.binding, graph.run_options)
            except Exception as exc:  # ORT's own exception types
                raise KernelLensError(f"ONNX Runtime failed in CUDA-graph mode: {exc}; models that "
                                      f"synchronize with the host or place nodes on the CPU cannot "
                                      f"be captured (run without cuda_graph=True)") from None
        self._copy_back(tensors, graph)
        if out is None:
            return [t.clone() for t in graph.own_outputs]
        for dst, static in zip(out, graph.own_outputs):
            if dst.data_ptr() != static.data_ptr() or dst.shape != static.shape:
                dst.copy_(static)
        return list(out)

    def _copy_back(self, tensors, graph: _Graph) -> None:
        """The inputs the model wrote, from the graph's buffers into the caller's tensors
        (nothing when the caller passed the static buffers of inputs updated in place)."""
        for m, static in zip(self._mutated, graph.own_mutated):
            if tensors[m.input].data_ptr() != static.data_ptr() or tensors[m.input].shape != static.shape:
                tensors[m.input].copy_(static)

    def _capture(self, graph: _Graph, state: _Session, device: torch.device) -> None:
        """Capture ORT's Run on the session's own stream into a torch CUDA graph, then run the
        call by replaying it, checked bit for bit against a plain run on the same inputs."""
        index = device.index
        stream, caller = self._capture_stream(index), torch.cuda.current_stream(index)
        state_buffers = [graph.own_inputs[m.input] for m in self._mutated if m.in_place]
        results = graph.own_outputs + [t for m, t in zip(self._mutated, graph.own_mutated) if not m.in_place]
        results += state_buffers
        run = functools.partial(state.session.run_with_iobinding, graph.binding, graph.run_options)
        stream.wait_stream(caller)  # the static inputs are filled on the caller's stream
        try:
            with torch.cuda.device(index), torch.cuda.stream(stream):
                saved = [t.clone() for t in state_buffers]  # warm runs must not advance the state

                def restore() -> None:
                    for t, s in zip(state_buffers, saved):
                        t.copy_(s)

                for _ in range(3):  # the arena, cuBLAS workspaces, kernel modules: all made now
                    run()
                    restore()
                run()
                expected = [t.clone() for t in results]
                restore()
                captured = torch.cuda.CUDAGraph(keep_graph=True)
                with torch.cuda.graph(captured, stream=stream, capture_error_mode="thread_local"):
                    run()
        except Exception as exc:  # ORT's and torch's own exception types
            raise KernelLensError(f"cannot capture ONNX Runtime's Run of {self.onnx_path} in a CUDA "
                                  f"graph: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}; "
                                  f"models that synchronize with the host or place nodes on the "
                                  f"CPU cannot be captured (run without cuda_graph)") from None
        host = host_dependencies(captured.raw_cuda_graph())
        if host:
            raise KernelLensError(f"ONNX Runtime's Run of {self.onnx_path} does {len(host)} thing(s) "
                                  f"on the host inside the captured graph ({', '.join(sorted(set(host)))}), "
                                  f"which a replay would repeat on memory that is gone: use "
                                  f"cuda_graph='ort' (ORT's own graph mode) or no CUDA graph")
        captured.instantiate()
        caller.wait_stream(stream)
        captured.replay()
        names = [o.name for o in self._outputs]
        names += [m.output for m in self._mutated if not m.in_place]
        names += [m.output for m in self._mutated if m.in_place]
        for name, got, want in zip(names, results, expected):
            if not torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                raise KernelLensError(f"the CUDA graph of ONNX Runtime's Run of {self.onnx_path} gives "
                                      f"{name} different from a plain run on the same inputs; use "
                                      f"cuda_graph='ort' or no CUDA graph")
        graph.captured = captured


class _DeviceBytes:
    """Device memory ONNX Runtime owns, seen by torch as bytes (``__cuda_array_interface__``)."""

    def __init__(self, pointer: int, size: int) -> None:
        self.__cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (pointer, False),
                                         "version": 2}


def _from_ort(value, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A copy, owned by torch, of an output ONNX Runtime allocated on ``device``."""
    shape = tuple(value.shape())
    out = torch.empty(shape, dtype=dtype, device=device)
    if out.numel():
        out.view(-1).view(torch.uint8).copy_(
            torch.as_tensor(_DeviceBytes(value.data_ptr(), out.numel() * out.element_size()), device=device))
    return out


def _layout(tensors: Sequence[torch.Tensor]) -> tuple:
    """Pointers and shapes: a static buffer resized or re-pointed in place no longer matches."""
    return tuple([(t.data_ptr(), t.shape) for t in tensors])


def _pinned(path: str | Path, what: str) -> str:
    """``path``'s real location, refused unless ``path`` is absolute and a regular file: ONNX
    Runtime hands a library name without a '/' to dlopen, which searches LD_LIBRARY_PATH."""
    if not Path(path).is_absolute():
        raise ArtifactError(f"{what} path {str(path)!r} is not absolute; a relative name would be "
                            f"searched for by the dynamic loader: pass an absolute path")
    real = os.path.realpath(path)
    if not os.path.isfile(real):
        raise ArtifactError(f"{what} {str(path)!r} is missing or not a regular file")
    return real


def _unchanged(real: str, what: str) -> None:
    """Just before ORT opens ``real`` (pinned by :func:`_pinned`): still a regular file at that
    real path, no link put in its place or in a folder on the way since."""
    try:
        ok = os.path.realpath(real) == real and stat.S_ISREG(os.lstat(real).st_mode)
    except OSError:
        ok = False
    if not ok:
        raise ArtifactError(f"{what} {real!r} changed since the model was loaded (now missing, a "
                            f"link or not a regular file); load the folder again")
