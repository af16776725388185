"""Symbolic trace: torch.export (non-strict) with every Triton launch recorded symbolically.

While torch.export runs the forward on fake tensors with symbolic sizes, each
``kernel[grid](...)`` call is intercepted: its grid and shape-derived scalars are read off as
sympy expressions, and a ``kernel_lens::launch`` node marks it in the exported graph so the
launch keeps its place among the torch ops and its tensor arguments bind to graph values.
``kernel.warmup(...)`` hands back the eager forward's handles, and launches through them are
traced like the others.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import re
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, List

import sympy
import torch
from torch.fx.experimental import symbolic_shapes
from torch.utils._sympy.numbers import int_oo

from ..._gc import paused_then_frozen
from ...errors import (DynamicConstexprError, KernelLensError, SizeBranchError, SymbolicError, TraceError,
                      UnsupportedKernelError)
from .. import arguments
from ..capture import data_values, launchers, tensor_likes
from ..capture.interpreter_bounds import users_file
from . import size_functions
from .. import triton_compat as tc
from ..capture.recorder import (CapturedLaunch, _normalize_grid, _patched, check_arguments, handle_info,
                      innermost_jit, kernel_name, launch_handle, patched_handles)

log = logging.getLogger(__name__)


with paused_then_frozen():  # torch.export pulls in torch._dynamo: see kernel_lens._gc
    import torch.export._trace  # noqa: F401

    @torch.library.custom_op("kernel_lens::launch", mutates_args=("tensors",))
    def _launch_marker(launch_id: int, tensors: List[torch.Tensor], sizes: List[int]) -> None:
        """Marks a Triton launch in an exported graph; it is never executed. ``sizes``: the
        sizes from tensor values its scalars and grid use, so the graph keeps what makes them
        (an ``.item()`` only a kernel scalar reads would be dead code to torch.export)."""
        raise RuntimeError("kernel_lens::launch is a trace-only marker and cannot run")

    @_launch_marker.register_fake
    def _(launch_id: int, tensors: List[torch.Tensor], sizes: List[int]) -> None:
        return None


LAUNCH_OP = torch.ops.kernel_lens.launch.default


@dataclass
class TracedLaunch:
    """A launch seen during the symbolic trace: torch sympy expressions, not yet canonical."""

    grid: tuple
    args: dict[str, Any]  # param name -> SymInt/int/float/bool/None/FakeTensor
    guards: dict[str, Any]  # constexpr name -> SymBool/SymInt it was computed as from sizes
    domains: dict[str, list] = field(default_factory=dict)  # SymInt guards: the values it takes


class _Tracer:
    def __init__(self, captured: list[CapturedLaunch]) -> None:
        self.captured = captured
        self.warmups = getattr(captured, "warmups", [])
        self.launches: list[TracedLaunch] = []
        self.warmed = 0
        self.tokens = tensor_likes.Tokens()  # fake tensors' data_ptr() under torch.export
        self.replay = data_values.Replay()  # sizes and branches from tensor values

    def warmup(self, jit_fn: Any) -> Any:
        """``kernel.warmup(...)`` under torch.export: the handle the eager forward's next warmup
        of this kernel got (fake tensors cannot be compiled for; its binary attributes stay
        readable)."""
        jit = innermost_jit(jit_fn)
        index = next((i for i in range(self.warmed, len(self.warmups))
                      if self.warmups[i].jit is jit), None)
        if index is None:
            raise TraceError(
                f"kernel {kernel_name(jit_fn)} is warmed up under torch.export more often than in "
                f"the eager forward ({sum(w.jit is jit for w in self.warmups)} times): warm up "
                f"the same kernels for every input")
        self.warmed = index + 1
        return self.warmups[index].handle

    def handle_run(self, handle: Any, grid_0: Any, grid_1: Any, grid_2: Any, *rest: Any) -> None:
        launch_handle(handle_info(handle, self.warmups), (grid_0, grid_1, grid_2), rest[6:])

    def _expect(self, jit_fn: Any) -> CapturedLaunch:
        index = len(self.launches)
        kernel = kernel_name(jit_fn)
        jit_fn = innermost_jit(jit_fn)
        if index >= len(self.captured) or self.captured[index].jit is not jit_fn:
            seen = kernel_name(self.captured[index].jit) if index < len(self.captured) else "none"
            raise TraceError(
                f"launch #{index} is kernel {kernel} under torch.export but was {seen} in the eager "
                f"forward: the sequence of launches depends on tensor values or on sizes; make "
                f"the forward launch the same kernels for every input in the declared ranges"
            )
        return self.captured[index]

    def run(self, jit_fn: Any, args: tuple, grid: Any, kwargs: dict) -> None:
        captured = self._expect(jit_fn)
        kernel = kernel_name(jit_fn)
        args, kwargs = tensor_likes.replace(
            [p.name for p in innermost_jit(jit_fn).params], args, kwargs,
            lambda obj, name: self.tokens.view(obj, kernel, name))
        try:
            params = tc.bind_params(jit_fn, args, kwargs)
        except TypeError as exc:
            raise TraceError(f"kernel {kernel}: its launch under torch.export does not bind to "
                             f"its parameters ({exc}); a launcher between the call and the "
                             f"kernel supplies them, and kernel_lens found none that does "
                             f"(autotuners and heuristics are followed through .fn)") from None
        check_arguments(jit_fn, params)
        guards, domains = {}, {}
        for p in jit_fn.params:
            value = params[p.name]
            if p.is_constexpr:
                if isinstance(value, torch.SymBool) and value.node.hint == captured.params[p.name]:
                    # e.g. @triton.heuristics({"EVEN_N": lambda a: a["n"] % BLOCK == 0}) over a
                    # dynamic n: one binary per truth value, chosen at run time.
                    guards[p.name] = value
                    continue
                if isinstance(value, torch.SymBool) and _pin_bool_to_example(
                        kernel, p.name, value, captured.params[p.name]):
                    params[p.name] = captured.params[p.name]  # the example's binary, checked
                    continue
                if isinstance(value, torch.SymInt):
                    _pin_to_value_step(kernel, p.name, value, captured.params[p.name])
                    values = _constexpr_values(kernel, p.name, value, captured.params[p.name])
                    if len(values) > 1:  # one binary per value, chosen at run time
                        guards[p.name], domains[p.name] = value, values
                    continue
                if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                    dims = _input_dims(value)
                    where = ", ".join(f"{n}.shape[{d}]" for n, d in dims) or "a dynamic dimension"
                    raise DynamicConstexprError(
                        f"kernel {kernel}: constexpr {p.name!r} = {_short(value)} depends on "
                        f"{where}; a constexpr is baked into the binary, so compute it from "
                        f"static sizes or mark that dimension static", dims)
                if value != captured.params[p.name]:
                    raise TraceError(f"kernel {kernel}: constexpr {p.name!r} differs between eager "
                                     f"({captured.params[p.name]}) and trace ({value})")
        jit = innermost_jit(jit_fn)
        annotated = {p.name for p in jit.params if p.is_constexpr}
        for name, value, _ in arguments.walk_values(jit, params):
            if name not in annotated and isinstance(value, (torch.SymFloat, torch.SymBool)):
                raise UnsupportedKernelError(
                    f"kernel {kernel}: scalar {name!r} is a symbolic float/bool ({value}); only "
                    f"integer scalars may depend on dynamic dimensions"
                )
        try:
            grid_value = grid(params) if callable(grid) else grid
        except KernelLensError:
            raise
        except Exception as exc:  # torch raises several kinds for data-dependent grids
            raise TraceError(f"kernel {kernel}: its grid cannot be traced symbolically: "
                             f"{_first_line(exc)}; grids must depend on sizes only, not on "
                             f"tensor values") from exc
        sym_grid = _normalize_grid(grid_value, kernel, lambda g: _grid_entry(g, kernel))
        tensors = arguments.tensors_of(jit, params)
        self.launches.append(TracedLaunch(sym_grid, params, guards, domains))
        from_values = [v for _, v, _ in arguments.walk_values(jit, params)] + list(sym_grid)
        LAUNCH_OP(len(self.launches) - 1, tensors,
                  [v for v in from_values if isinstance(v, torch.SymInt) and symbolic_shapes.free_unbacked_symbols(v)])

    def autotune_run(self, tuner: Any, args: tuple, kwargs: dict) -> Any:
        captured = self._expect(tuner)
        config = captured.autotune_config
        if config is None:
            # a library's autotuner (FlagGems' LibTuner) chose the config itself in the eager
            # forward without Triton's Autotuner.run: launch with what it launched with
            jit = innermost_jit(tuner)
            given = set(tc.bind_partial_names(jit, args, kwargs))
            chosen = {p.name: captured.params[p.name] for p in jit.params
                      if p.is_constexpr and p.name not in given}
            return tuner.fn.run(*args, **kwargs, **chosen, **captured.options)
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(tuner.arg_names, args)), **kwargs, **config.all_kwargs()})
        return tuner.fn.run(*args, **kwargs, **config.all_kwargs())


MAX_CONSTEXPR_VALUES = 64  # binaries one constexpr computed from sizes may need


def _finite(bound: Any) -> bool:
    return bound not in (int_oo, -int_oo) and bool(getattr(bound, "is_finite", False))


def _pin_to_value_step(kernel: str, name: str, value: Any, captured: Any) -> None:
    """A constexpr computed from one size that comes from tensor values (``BLOCK =
    triton.next_power_of_2(max_len)`` of an ``.item()``), which has no range to enumerate
    binaries over: the binary is the example's, and the size is checked at run time to lie in
    the step of its range where the constexpr keeps the example's value (``u0`` in [33, 64] for
    64); a call outside is refused, naming the launch's line (``extra_examples`` with other
    values trace other steps)."""
    env = value.node.shape_env
    expr = env.replace(value.node.expr)
    free = list(expr.free_symbols)
    if len(free) != 1 or not free[0].name.startswith("u") or not isinstance(captured, int):
        return
    u = free[0]
    known = env.var_to_range.get(u)
    if known is not None and _finite(known.upper):
        return  # a range the model's code bounds: enumerated as for any size
    example = getattr(env, "real_tensor_prop_unbacked_vals", {}).get(u)
    if example is None:
        return
    example = int(example)
    lo = int(known.lower) if known is not None and _finite(known.lower) else min(example, 0)
    step = (example, example)
    try:  # the step holding the example, exact over a window around it (its ends checked)
        window = {**env.var_to_range, u: symbolic_shapes.ValueRanges(lo, max(4 * example, example + 1024))}
        step = next((a, b) for v, a, b in size_functions.pieces(expr, window, MAX_CONSTEXPR_VALUES)
                    if a <= example <= b and v == captured)
    except (SymbolicError, StopIteration):
        pass  # one value: the example's own
    site = data_values.model_line(sys._getframe(2))
    why = (f"{site} (kernel {kernel}: constexpr {name!r} = {captured} is computed from a tensor "
           f"value, {u} = {example}; the binary serves {u} in [{step[0]}, {step[1]}]: give "
           f"extra_examples with other values)")
    size = env.create_symintnode(u, hint=example)
    with data_values.asserting_for(why):
        torch._check(size >= step[0])
        torch._check(size <= step[1])


def _pin_bool_to_example(kernel: str, name: str, value: Any, captured: Any) -> bool:
    """A constexpr truth value computed from tensor values (``IS_DECODE = T == 1`` of an
    ``.item()``): the binary is the example's, and the condition is checked at run time to have
    the example's truth value; a call where it differs is refused, naming the launch's line
    (``extra_examples`` taking the other side trace it). False when it reads no value."""
    if not isinstance(captured, bool) or not symbolic_shapes.free_unbacked_symbols(value):
        return False
    site = data_values.model_line(sys._getframe(2))
    why = (f"{site} (kernel {kernel}: constexpr {name!r} = {captured} is computed from tensor "
           f"values, {value.node.expr}; the binary serves calls where it is {captured}: give "
           f"extra_examples where it is {not captured})")
    with data_values.asserting_for(why):
        torch._check(value if captured else torch.sym_not(value))
    return True


def _constexpr_values(kernel: str, name: str, value: Any, captured: Any) -> list[int]:
    """The values constexpr ``name`` (computed from dynamic sizes) takes over the declared
    ranges: one when interval evaluation proves it constant, else one per piece of the range,
    at most MAX_CONSTEXPR_VALUES; beyond that a DynamicConstexprError naming sub-ranges."""
    env = value.node.shape_env
    expr = env.replace(value.node.expr)
    dims = _input_dims(value)
    where = ", ".join(f"{n}.shape[{d}]" for n, d in dims) or "a dynamic dimension"
    try:
        parts = size_functions.constexpr_values(expr, env.var_to_range, MAX_CONSTEXPR_VALUES)
    except SymbolicError as exc:
        hint = ""
        try:
            many = size_functions.pieces(expr, env.var_to_range, 64)
            hint = " Ranges with one binary each: " + ", ".join(
                f"[{a}, {b}] -> {v}" for v, a, b in many[:12]) + (" ..." if len(many) > 12 else "")
        except SymbolicError:
            try:  # several sizes: say which values the declared box spans
                lo, hi = size_functions.value_range(expr, env.var_to_range)
                hint = (f" Over the declared ranges it takes values in [{lo}, {hi}] (at "
                        f"{captured} for the example inputs); choose Dim ranges over which it "
                        f"takes at most {MAX_CONSTEXPR_VALUES} values.")
            except SymbolicError:
                pass
        raise DynamicConstexprError(
            f"kernel {kernel}: constexpr {name!r} = {_short(value)} depends on {where} and "
            f"cannot be compiled for the whole declared range ({exc}; at most "
            f"{MAX_CONSTEXPR_VALUES} binaries per constexpr): narrow the Dim range or mark that "
            f"dimension static.{hint}", dims) from None
    values = sorted({v for v, _, _ in parts})
    if captured not in values:
        raise TraceError(f"kernel {kernel}: constexpr {name!r} was {captured} in the eager forward "
                         f"but takes {values} over the declared range")
    if len(values) > 1:
        log.info("kernel %s: constexpr %s takes %d values over the declared range (%s): one "
                 "binary each", kernel, name, len(values),
                 ", ".join(f"[{a}, {b}] -> {v}" if a is not None else str(v) for v, a, b in parts))
    return values


def _grid_entry(value: Any, kernel: str) -> Any:
    if isinstance(value, torch.Tensor):
        raise UnsupportedKernelError(f"kernel {kernel}: the grid contains a tensor; grids must be "
                                     f"ints computed from shapes, not from tensor values")
    if isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
        return value
    raise UnsupportedKernelError(f"kernel {kernel}: grid entry {value!r} is not an int")


def _short(value: Any, limit: int = 120) -> str:
    text = str(value)
    return text if len(text) <= limit else text[:limit] + " ..."


def _input_dims(value: Any) -> list[tuple[str, int]]:
    """The (forward argument name, dim) pairs a symbolic size is computed from."""
    dims: list[tuple[str, int]] = []
    for sym in sorted(value.node.expr.free_symbols, key=str):
        dims += [d for d in _sources(value.node.shape_env, sym) if d not in dims]
    return dims


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


@contextlib.contextmanager
def _tracing(tracer: _Tracer) -> Iterator[None]:
    def run(self, *args, grid, warmup, **kwargs):
        if warmup:
            return tracer.warmup(self)
        return tracer.run(self, args, grid, kwargs)

    def tune(self, *args, **kwargs):
        return tracer.autotune_run(self, args, kwargs)

    log_ = getattr(tracer.captured, "launchers", None) or launchers.LauncherLog()
    with _patched(tc.JITFunction, "run", run), _patched(tc.Autotuner, "run", tune), \
            patched_handles(lambda: True, tracer.handle_run), launchers.tracing(log_), \
            tracer.tokens.active():
        yield


class _Wrapper(torch.nn.Module):
    def __init__(self, fn: Callable) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


@dataclass
class SizeBranch:
    """A condition on one size that the traced forward needs (a Python branch on that size),
    which does not hold over the whole declared range: ``pieces`` says where it holds. The size
    is dim ``dim`` of the forward's argument ``label`` (``x``, or ``args[0]``)."""

    label: str
    dim: int
    condition: str
    pieces: list[tuple[bool, int, int]]


def trace(model: Callable, example_inputs: tuple, dynamic_shapes: Any,
          captured: list[CapturedLaunch]) -> tuple[torch.export.ExportedProgram, list[TracedLaunch]]:
    """Export ``model`` with the user's dynamic dims; returns the program and the launches (a
    list whose ``replay`` says what the trace learned of sizes from tensor values: see
    :mod:`..capture.data_values`).

    When the model's Python code branches on a size inside a declared range (torch refuses the
    range with a guard on that one size), :class:`SizeBranchError` lists each such condition
    and where it holds (:func:`~.size_functions.truth_pieces`, exactly), so the caller can split
    the range (:mod:`.size_pieces`).

    When torch.export cannot prove a guard over the declared range (e.g. transformers' CUDA
    mask code guards ``seq*(8 + seq - seq % 8) > 1``, true for every size but beyond torch's
    range analysis), the export is retried with the guards deferred to runtime asserts, as
    torch.onnx.export does, and every deferred assert is then checked here over the declared
    range: a condition on one bounded size exactly (:func:`~.size_functions.truth_pieces`); one
    on several sizes, or on an unbounded one, at sampled sizes. One that fails for some size is
    an error naming it.
    """
    module = model if isinstance(model, torch.nn.Module) else _Wrapper(model)
    _fixed_at.clear()
    try:
        program, tracer = _export(module, example_inputs, dynamic_shapes, captured, deferred=False)
    except KernelLensError:
        raise
    except Exception as exc:
        if "Constraints violated" not in str(exc):
            raise TraceError(_explain(exc)) from exc
        guarded = _size_branches(*_violations[-1]) if _violations else []
        if guarded:
            raise SizeBranchError(_explain(exc), guarded) from exc
        try:
            program, tracer = _export(module, example_inputs, dynamic_shapes, captured, deferred=True)
        except KernelLensError:
            raise
        except Exception:
            raise TraceError(_explain(exc)) from exc
        _check_deferred_asserts(program, exc)
    if len(tracer.launches) != len(captured):
        raise TraceError(_missing_launches(captured, tracer.launches, program))
    _refuse_pointer_tables(program, tracer.tokens)
    launches = TracedLaunches(tracer.launches)
    launches.replay = tracer.replay
    return program, launches


class TracedLaunches(list):
    """The traced launches, with ``replay`` (:class:`~..capture.data_values.Replay`)."""

    replay: data_values.Replay


def _refuse_pointer_tables(program: torch.export.ExportedProgram, tokens: Any) -> None:
    """A tensor the forward built from tensor addresses (``data_ptr()``: a table of pointers the
    kernel loads and dereferences, as vLLM-style copy_blocks does) holds, under torch.export, the
    fake tensors' address tokens: a deployed model's buffers have addresses unknown when it is
    compiled, so such a model would read garbage. Refused, naming the constant."""
    for name, value in {**program.constants, **program.state_dict}.items():
        if not isinstance(value, torch.Tensor) or value.dtype not in (torch.int64, torch.uint64) \
                or not value.numel() or not tokens.roots:
            continue
        root = value.detach().cpu().reshape(-1).to(torch.int64) >> 40
        if bool(((root >= 1) & (root <= len(tokens.roots))).any()):
            raise UnsupportedKernelError(
                f"the forward stores tensor addresses (data_ptr()) in tensor {name!r}, a table of "
                f"pointers for a kernel to dereference; a deployed model's buffers have addresses "
                f"unknown at compile time, so kernel_lens cannot compile it: pass the tensors to "
                f"the kernel as arguments (a tuple of tensors works) instead of their addresses")


def _missing_launches(captured: list[CapturedLaunch], seen: list, program: Any) -> str:
    """Which eager launches torch.export did not see, and the likely reason."""
    missing = [f"#{i} {kernel_name(c.jit)}" for i, c in enumerate(captured)][len(seen):]
    opaque = sorted({str(n.target) for n in program.graph.nodes if n.op == "call_function"
                     and not str(n.target).startswith(("aten.", "<built-in", "kernel_lens."))
                     and "." in str(n.target) and getattr(n.target, "namespace", "aten")
                     not in ("aten", "prims", "kernel_lens", "higher_order")})
    where = (f"; the exported graph holds ops whose bodies torch.export does not trace into: "
             f"{', '.join(opaque)} (kernel_lens inlines torch.library.custom_op/triton_op bodies; "
             f"an op registered another way, e.g. Library.impl or a C++ extension, stays opaque: "
             f"define it with torch.library.custom_op or call its Python body directly)"
             if opaque else
             "; no opaque op was found, so the launch was skipped under torch.export: a branch "
             "on tensor values, or code that runs only outside tracing (e.g. behind "
             "torch.compiler.is_compiling() or is_exporting())")
    return (f"the eager forward launched {len(captured)} kernels but torch.export saw "
            f"{len(seen)}: not seen {', '.join(missing[:8])}{' ...' if len(missing) > 8 else ''}"
            f"{where}")


# (shape env, declared range per symbol) of exports whose guards violated the declared ranges
_violations: list[tuple[Any, dict]] = []


def _recording_violations(orig: Callable) -> Callable:
    """ShapeEnv.produce_guards_verbose, recording the shape env and the declared range of each
    input dim's symbol (the guards are checked against those) when the guards violate them."""
    def produce_guards_verbose(self, placeholders, sources, *args: Any, **kwargs: Any) -> Any:
        try:
            return orig(self, placeholders, sources, *args, **kwargs)
        except symbolic_shapes.ConstraintViolationError:
            declared = {}
            for fake, context in zip(placeholders, kwargs.get("input_contexts") or []):
                constraints = getattr(context, "constraint_sizes", None) or []
                for size, constraint in zip(getattr(fake, "shape", ()), constraints):
                    vr = getattr(constraint, "vr", None)
                    if isinstance(size, torch.SymInt) and vr is not None and \
                            isinstance(size.node.expr, sympy.Symbol):
                        declared[size.node.expr] = vr
            _violations.append((self, declared))
            _fixed_at.extend(loc for sym in list(self.replacements)  # input sizes made constants
                             if sym in self.var_to_sources and (loc := _where_fixed(self, sym)))
            raise
    return produce_guards_verbose


# where the model's code made a declared dynamic size a constant (file:line), per violation
_fixed_at: list[str] = []


def _where_fixed(env: Any, sym: Any) -> str | None:
    """``file:line`` of the code that turned the dynamic size ``sym`` into a constant, as torch's
    shape env recorded it (``replacements_slocs``), or None."""
    if not getattr(env.replacements.get(sym), "is_number", False):
        return None
    sloc = getattr(env, "replacements_slocs", {}).get(sym)
    frame = getattr(sloc, "framework_loc", None)
    if getattr(frame, "filename", None) and getattr(frame, "lineno", None) and users_file(frame.filename):
        return f"{frame.filename}:{frame.lineno}"
    return getattr(sloc, "maybe_user_loc", None)


@contextlib.contextmanager
def _kept_logs(chatter: io.StringIO):
    """torch's symbolic-shapes warnings while exporting ("Unable to find user code ...") go to
    ``chatter`` with what it prints (logged at debug level), unless the user asked for torch's
    logs (TORCH_LOGS): the error kernel_lens raises says what failed and where."""
    logger = logging.getLogger("torch.fx.experimental.symbolic_shapes")

    def keep(record: logging.LogRecord) -> bool:
        chatter.write(f"{record.levelname} {record.name}: {record.getMessage()}\n")
        return False
    if os.environ.get("TORCH_LOGS"):
        yield
        return
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _export(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes: Any,
            captured: list[CapturedLaunch], deferred: bool):
    """torch.export with the launches recorded; ``int()`` of a tensor value stays a size
    (:func:`.data_values.symbolic_int`), and where the model's module cannot take that ``int``
    (``dtype=int``, ``type(x) is int``) the trace runs again with Python's own."""
    data_log = getattr(captured, "data_log", [])
    if not data_values.int_reads(data_log):
        return _export_once(module, example_inputs, dynamic_shapes, captured, deferred, [])
    try:
        return _export_once(module, example_inputs, dynamic_shapes, captured, deferred, data_log)
    except KernelLensError:
        raise
    except Exception as exc:  # noqa: BLE001 - the plain int's trace says what is wrong, if anything
        result = _export_once(module, example_inputs, dynamic_shapes, captured, deferred, [])
        log.info("int() of tensor values kept as Python's (the trace with sizes failed: %s)",
                 _first_line(exc))
        return result


def _export_once(module: torch.nn.Module, example_inputs: tuple, dynamic_shapes: Any,
                 captured: list[CapturedLaunch], deferred: bool, int_log: list):
    tracer = _Tracer(captured)
    # torch.export prints the whole graph to stderr when it fails; keep it for --debug / logging.
    chatter = io.StringIO()
    _violations.clear()
    env = symbolic_shapes.ShapeEnv
    try:
        with _tracing(tracer), contextlib.redirect_stderr(chatter), _kept_logs(chatter), \
                torch.compiler.set_stance("force_eager"), \
                data_values.symbolic_int(int_log), \
                data_values.replaying(getattr(captured, "data_log", []), tracer.replay), \
                _patched(env, "produce_guards_verbose", _recording_violations(env.produce_guards_verbose)):
            program = torch.export.export(module, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                                          strict=False,
                                          prefer_deferred_runtime_asserts_over_guards=deferred)
    finally:
        if chatter.getvalue().strip():
            log.debug("torch.export printed:\n%s", chatter.getvalue())
    return program, tracer


def _check_deferred_asserts(program: torch.export.ExportedProgram, original: BaseException) -> None:
    """Every runtime assert torch deferred must hold over the declared ranges (kernel_lens drops
    asserts from the graph, so one that could fail would make the compiled model silently wrong)."""
    ranges = {str(k): v for k, v in program.range_constraints.items()}

    def points(sym: sympy.Symbol, many: bool) -> list[int]:
        vr = ranges.get(str(sym))
        lo = int(vr.lower) if vr is not None and vr.lower.is_Integer else 0
        hi = int(vr.upper) if vr is not None and vr.upper.is_Integer else None
        top = hi if hi is not None else lo + (1 << 20)
        picks = set(range(lo, min(top, lo + (512 if many else 8)) + 1)) | {top}
        for k in range(1, 64):
            for v in (2 ** k - 1, 2 ** k, 2 ** k + 1, 3 * 2 ** k):
                if lo <= v <= top:
                    picks.add(v)
        return sorted(picks)

    checked = 0
    for node in program.graph.nodes:
        if node.op != "call_function" or "_assert_scalar" not in str(node.target):
            continue
        cond = node.args[0]
        val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
        if not isinstance(val, torch.SymBool):
            continue
        expr = val.node.expr
        if any(s.name.startswith("u") for s in expr.free_symbols):
            continue  # a size from tensor values: an IR run-time check (lift)
        syms = sorted(expr.free_symbols, key=str)
        vr = ranges.get(str(syms[0])) if len(syms) == 1 else None
        if vr is not None and vr.upper.is_Integer:  # one bounded size: exactly
            try:  # any number of pieces: only whether it ever fails matters here
                parts = size_functions.truth_pieces(expr, {syms[0]: vr}, limit=1 << 20)
            except SymbolicError as exc:
                raise TraceError(f"{_explain(original)} (torch needs {expr}, which kernel_lens "
                                 f"cannot check over the range: {exc})") from original
            checked += 1
            bad = next(((a, b) for holds, a, b in parts if not holds), None)
            if bad is not None:
                raise TraceError(f"{_explain(original)} (torch could not prove {expr}, which "
                                 f"fails at {syms[0]}={bad[0]})") from original
            continue
        grids = [points(s, len(syms) == 1) for s in syms]
        for values in itertools.product(*grids):
            holds = expr.xreplace({s: sympy.Integer(v) for s, v in zip(syms, values)})
            checked += 1
            if holds is not sympy.true:
                at = ", ".join(f"{s}={v}" for s, v in zip(syms, values))
                if _constraint_violation(str(original)) is not None:  # says it in user terms
                    raise TraceError(f"{_explain(original)} (torch could not prove {expr}, which "
                                     f"fails at {at})") from original
                raise TraceError(
                    f"{_explain(original)}\nThe forward needs {expr} (a guard torch.export could "
                    f"not prove), which fails at {at}: narrow the Dim range so it holds, or mark "
                    f"the dim static") from original
    log.info("torch.export deferred guards to runtime asserts; all hold over the declared ranges "
             "(%d checks)", checked)


def _size_branches(env: Any, declared: dict) -> list[SizeBranch]:
    """The guards of a refused export that are conditions on one input dim with a bounded
    declared range and fail somewhere in it, with where each holds (exactly); [] when one
    failing guard is not of that kind (the range cannot be split on it)."""
    out: list[SizeBranch] = []
    for guard in env.guards:
        expr = env.replace(guard.expr)  # in the declared symbols: a guard made before torch
        syms = sorted(expr.free_symbols, key=str)  # learned two dims are one names the other
        vr = declared.get(syms[0]) if len(syms) == 1 else None
        if vr is None or not vr.upper.is_Integer:
            continue
        try:
            parts = size_functions.truth_pieces(expr, {syms[0]: vr})
        except SymbolicError:
            return []
        if all(holds for holds, _, _ in parts):
            continue
        sources = [(label, idx) for label, idx in _sources(env, syms[0])]
        if not sources:
            return []
        label, dim = sources[0]
        out.append(SizeBranch(label, dim, _user_terms(str(expr)), parts))
    return out


def _sources(env: Any, sym: Any) -> list[tuple[str, int]]:
    """(forward argument label, dim) of every input dim that is the symbol ``sym``."""
    out = []
    for source in env.var_to_sources.get(sym, []):
        base, idx = getattr(getattr(source, "base", None), "name", None), getattr(source, "idx", None)
        match = re.search(r"\['([^']+)'\](\[\d+\])?$", base or "")  # L['x'], L['args'][0]
        label = match.group(1) + (match.group(2) or "") if match else None
        if label and isinstance(idx, int) and (label, idx) not in out:
            out.append((label, idx))
    return out


def _user_terms(text: str) -> str:
    """torch's source names (``L['x'].size()[0]``, ``L['args'][0].size()[1]``) as the user writes
    them (``x.shape[0]``)."""
    text = re.sub(r"L\['args'\]\[(\d+)\]\.size\(\)\[(\d+)\]", r"input \1 .shape[\2]", text)
    return re.sub(r"L\['([^']+)'\]\.size\(\)\[(\d+)\]", r"\1.shape[\2]", text).replace(" .shape", ".shape")


def _constraint_violation(text: str) -> str | None:
    """torch.export's "Constraints violated (seq)" in the user's terms: which Dim, what the model
    needs of it (the guards torch generated) and the Dim to declare instead (torch's suggested
    fix). None when ``text`` is not such a message."""
    head = re.search(r"Constraints violated \(([^)]*)\)", text)
    if head is None:
        return None
    dims = [d.strip() for d in head.group(1).split(",") if d.strip()]
    needs, declared = [], {}
    for m in re.finditer(r"Not all values of (\w+) = (\S+) in the specified range (.+?) satisfy "
                         r"the generated guard (.+?)\.?$", text, re.M):
        declared[m.group(1)] = (_user_terms(m.group(2)), m.group(3).strip())
        guard = _user_terms(m.group(4).strip().rstrip("."))
        if guard not in needs:
            needs.append(guard)
    specialized = [f"{m.group(1)} = {m.group(2)}" for m in re.finditer(
        r"You marked (\w+) as dynamic but your code specialized it to be a constant \((\d+)\)",
        text)]
    specialized += [_user_terms(m.group(0).strip().lstrip("- ")) for m in re.finditer(
        r"^.*(?:must be specialized|was inferred to be a constant).*$", text, re.M)]
    fixes = text.split("Suggested fixes:", 1)[1] if "Suggested fixes:" in text else ""
    fix_lines = [ln.strip() for ln in fixes.splitlines() if ln.strip() and "=" in ln
                 and not ln.strip().startswith(("torch.", "Traceback", "File", "During"))][:4]
    parts = []
    for dim in dims:
        where, rng = declared.get(dim, (None, None))
        parts.append(f"Dim {dim!r}" + (f" ({where}, declared {rng})" if where else ""))
    if needs:
        what = f"the model's code only works for sizes where {' and '.join(needs)}"
    elif specialized:
        where = f" at {', '.join(dict.fromkeys(_fixed_at))}" if _fixed_at else ""
        what = (f"the model's code{where} fixes it to the example's size ({'; '.join(specialized)}), "
                f"so it cannot be dynamic: mark it static, or find the code that makes the size "
                f"a constant (a branch, a .item(), an int() of it)")
    else:
        what = "the model's code only works for part of that range"
    message = f"torch.export rejects the declared dynamic range of {', '.join(parts)}: {what}"
    if fix_lines:
        message += f"; declare instead: {'; '.join(fix_lines)}"
    elif needs:
        message += "; narrow the Dim's min/max to where this holds, or mark the dim static"
    return message


def _explain(exc: BaseException) -> str:
    text = str(exc).strip()
    name = type(exc).__name__
    violation = _constraint_violation(text)
    if violation is not None:
        return violation
    if "data-dependent" in text or "DataDependent" in name or "GuardOnDataDependent" in name:
        hint = ("Python control flow, a grid or a scalar depends on tensor values; kernel_lens "
                "can only compile forwards whose launches depend on sizes")
    elif "Constraints violated" in text or "ConstraintViolation" in name or "specialized" in text:
        hint = ("the model cannot be traced over the declared dynamic range; narrow the Dim "
                "min/max (sizes 0 and 1 are specialized by torch.export) or mark the dim static")
    else:
        hint = "torch.export could not trace the forward"
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # torch's first line says what failed; "Caused by: (file:line in fn)" says where. The rest
    # is torch's advice on its own debug flags (shown with --debug).
    where = [ln for ln in lines if ln.startswith("Caused by:") or ln.startswith("User Stack")][:1]
    detail = "\n".join((lines[:1] if where else lines[:8]) + where)
    reason = re.split(r"\s+\((?:unhinted|Size-like symbols):", lines[0])[0].rstrip(". ")[:200] \
        if lines else name
    mine = user_frame(exc)
    at = f" (in the model at {mine})" if mine else ""
    return f"{hint}: {reason}{at}.\n{name}: {detail}"


_LIBRARY_PARTS = ("/torch/", "/triton/", "/kernel_lens/", "<frozen ", "/site-packages/", "<string>")


def is_user_file(filename: str) -> bool:
    """A frame's file is the user's code: not torch, Triton, kernel_lens, an installed package
    or generated source."""
    return not any(part in filename for part in _LIBRARY_PARTS)


def located(filename: str, line: object, code: str | None) -> str:
    """``file:line: code`` as an error names the user's line."""
    return f"{filename}:{line}" + (f": {code.strip()[:120]}" if code else "")


def user_frame(exc: BaseException) -> str | None:
    """The innermost frame of the user's code in ``exc``'s traceback (or a cause's): outside
    torch, Triton, kernel_lens and installed packages, as ``file:line: code``."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if is_user_file(f.filename)]
        if frames:
            return located(frames[-1].filename, frames[-1].lineno, frames[-1].line)
        exc = exc.__cause__ or exc.__context__
    return None
