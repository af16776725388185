"""The ``kernel_lens`` command line."""

from __future__ import annotations

import argparse
import ctypes
import errno
import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from contextlib import contextmanager
from typing import Iterator

from . import _gc, progress
from .archs import parse_archs
from .errors import ArchError, InputError, KernelLensError, OutputPathError, printable
from .fileio import check_folder
from .model_file import load_model_file
from .serving.backends import BACKENDS as TRITON_BACKENDS
from .toolchain import fetch_headers
from .version import __version__


class _Parser(argparse.ArgumentParser):
    """argparse, with errors in kernel_lens's own form (``kernel_lens: error: ...``, exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"kernel_lens: error: {message} (see {self.prog} --help)\n")


def _arch(text: str) -> tuple[int, ...]:
    try:
        return parse_archs(text)
    except ArchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


#: The longest run of user text an error message repeats (the rest is elided).
_ECHO = 80
#: The longest one-line error the CLI prints without --debug.
_LINE = 1000


def _clip(text: str, limit: int = _ECHO) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def _json_option(flag: str, text: str | None, leaf: tuple[type, ...], shape: str) -> dict | None:
    """``--roles`` / ``--autotune``: a JSON object of objects of scalars, or an InputError.

    Checked here, before any work, so a malformed value is one short line that names the flag
    (a deeply nested value once escaped as a RecursionError from the JSON parser)."""
    if text is None:
        return None
    fix = f"pass {flag} '{shape}'"
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(f"{flag} is not valid JSON ({exc}): {_clip(text)}; {fix}") from None
    except RecursionError:
        raise InputError(f"{flag} is nested too deeply to be {shape}; {fix}") from None
    if not isinstance(value, dict):
        raise InputError(f"{flag} must be a JSON object, got {type(value).__name__}; {fix}")
    for kernel, mapping in value.items():
        if not isinstance(mapping, dict):
            raise InputError(f"{flag}[{_clip(repr(kernel))}] must be a JSON object, got "
                             f"{type(mapping).__name__}; {fix}")
        for name, item in mapping.items():
            if not isinstance(item, leaf):
                raise InputError(f"{flag}[{_clip(repr(kernel))}][{_clip(repr(name))}] must be a "
                                 f"{' or '.join(t.__name__ for t in leaf)}, got "
                                 f"{type(item).__name__}; {fix}")
    return value


def _parse_json_options(args: argparse.Namespace) -> None:
    """Replace the raw ``--roles`` / ``--autotune`` text by the checked dicts."""
    args.roles = _json_option("--roles", args.roles, (str,), '{"kernel": {"param": "input"}}')
    args.autotune = _json_option("--autotune", args.autotune, (bool, int, float, str),
                                 '{"kernel": {"BLOCK": 128}}')


def _check_output(flag: str, text: str) -> None:
    """An empty ``-o`` would mean the current folder; refuse it before any work."""
    if not text.strip():
        raise OutputPathError(f"{flag} is empty, which would write into the current folder; "
                              f"pass {flag} with a folder name (it is created if missing)")


def _front_half_args(p: argparse.ArgumentParser) -> None:
    """Options shared by every command that lifts a model file."""
    p.add_argument("--arch", type=_arch, default=None,
                   help="GPU arch(s) to compile for, e.g. sm_90 or sm_80,sm_90 (one artifact set "
                        "with a binary per arch; the device's is picked at run time). "
                        "Default: the local GPU's, else sm_90")
    p.add_argument("--roles", default=None,
                   help='override tensor roles: \'{"kernel": {"param": "input"}}\'')
    p.add_argument("--autotune", default=None,
                   help='pick autotune configs: \'{"kernel": {"BLOCK": 128}}\'')
    p.add_argument("--dynamic", action="store_true",
                   help="make every input dim that can vary dynamic (torch.export Dim.AUTO) "
                        "instead of the file's dynamic_shapes; prints the ranges settled on")
    p.add_argument("--opt-level", type=int, default=None, metavar="N",
                   help="optimizations of the lowered ONNX graph: 0 none, 1 (default) fused "
                        "sibling GEMMs and grouped-query attention without expanded K/V, 2 also "
                        "kernel_lens's own skinny GEMM for nn.Linear with <= 16 rows and its own "
                        "split-KV decode attention for one-position SDPA (fp16/bf16; not "
                        "bit-identical to cuBLAS or ORT's attention); the user's Triton launches "
                        "are never changed")
    p.add_argument("--ptx-version", default=None, help="lower PTX to this ISA version (e.g. 8.4)")
    p.add_argument("--cuda-version", default=None,
                   help="lower PTX to what this CUDA driver version accepts (e.g. 12.4)")


def _verbosity(p: argparse.ArgumentParser, default) -> None:
    """-v/-q/--debug, accepted before or after the subcommand (on a subcommand they default to
    SUPPRESS, so one given before it is kept)."""
    p.add_argument("-v", "--verbose", action="store_true", default=default,
                   help="also log details (what each stage did, pass timings)")
    p.add_argument("-q", "--quiet", action="store_true", default=default,
                   help="no progress lines: only results and errors")
    p.add_argument("--debug", action="store_true", default=default,
                   help="on an error, show the full message, the traceback and what "
                        "torch printed (without it: one line)")


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="kernel_lens",
        description="Compile PyTorch models with custom Triton kernels for ONNX Runtime and TensorRT.")
    parser.add_argument("--version", action="version", version=f"kernel_lens {__version__}")
    _verbosity(parser, argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    sub.add_parser = _with_verbosity(sub.add_parser)  # type: ignore[method-assign]

    dump = sub.add_parser("dump-ir", help="print the IR of a model file (human-readable or JSON)")
    dump.add_argument("file", nargs="?", help="model file (not needed with --schema)")
    dump.add_argument("--after", metavar="PASS", default=None,
                      help="stop after this pass (default: run the whole pipeline); "
                           "'none' prints the IR straight from the front-ends")
    dump.add_argument("--json", action="store_true", help="print the IR as JSON")
    dump.add_argument("--schema", action="store_true", help="print the IR's JSON schema and exit")
    _front_half_args(dump)

    sub.add_parser("passes", help="list the pass pipeline in run order")
    sub.add_parser("targets", help="list the installed targets (entry-point group kernel_lens.targets)")

    comp = sub.add_parser("compile", help="compile a model file and write the artifacts")
    comp.add_argument("file", help="Python file defining `model`, `example_inputs` "
                                   "(and optionally `dynamic_shapes`, `roles`, `autotune`)")
    _front_half_args(comp)
    comp.add_argument("-o", "--output", default="kl_out", help="output directory (default: kl_out)")
    comp.add_argument("--target", action="append", default=[], metavar="NAME",
                      help="build this target too (e.g. ort); repeatable; see `kernel_lens targets`")
    comp.add_argument("--stop-after", metavar="STAGE", default=None,
                      help="stop each target after this stage (see `kernel_lens targets`; "
                           "e.g. emit: write the C++ sources into OUT/src and build nothing)")
    comp.add_argument("--dump-after", metavar="PASS", action="append", default=[],
                      help="also write the IR after this pass into the output directory")

    fetch = sub.add_parser(
        "fetch-headers", help="download the ONNX Runtime / TensorRT headers plugins build against",
        description="Download the ONNX Runtime and TensorRT C/C++ headers from the npm registry / "
                    "PyPI (pinned versions, checked against pinned sha256 digests) into the cache "
                    "kernel_lens looks in. Neither --ort nor --trt: both.")
    fetch_headers.add_arguments(fetch)
    sub.add_parser("doctor", help="report the environment (versions, GPUs, compilers, headers) "
                                  "for a bug report; exit status 0 when the ort target can be built")

    _add_verify(sub)

    triton = sub.add_parser(
        "export-triton", help="export a compiled folder as a model of a Triton Inference Server "
                              "model repository (REPO/NAME/config.pbtxt, REPO/NAME/1/...)",
        description="Export DIR (made by `kernel_lens compile FILE.py --target ort -o DIR`, or "
                    "--target trt for the tensorrt backend) as REPO/NAME for Triton's onnxruntime, "
                    "python or tensorrt backend; see docs/serving.md.")
    triton.add_argument("directory", metavar="DIR", help="compile output folder (--target ort; "
                                                         "--target trt for --backend tensorrt)")
    triton.add_argument("-o", "--output", required=True, metavar="REPO",
                        help="model repository folder (created if missing; other models are kept)")
    triton.add_argument("--name", default=None, help="model name (default: the compiled model's)")
    triton.add_argument("--backend", default="onnxruntime", choices=list(TRITON_BACKENDS),
                        help="onnxruntime: Triton's ONNX Runtime backend (NVIDIA's containers); "
                             "python: model.py with onnxruntime-gpu (any tritonserver); tensorrt: "
                             "a TensorRT engine built here (needs the tensorrt package) + plugins")
    triton.add_argument("--instances", type=int, default=1, metavar="N",
                        help="model instances per GPU (default 1)")
    triton.add_argument("--max-batch-size", type=int, default=0, metavar="B",
                        help="make the leading dynamic dim Triton's batch dim, up to B (default 0: "
                             "no batching, full dims)")
    return parser


def _with_verbosity(add_parser):
    def add(*args, **kwargs):
        p = add_parser(*args, **kwargs)
        _verbosity(p, argparse.SUPPRESS)
        return p
    return add


def _add_verify(sub) -> None:
    check = sub.add_parser(
        "verify", help="run the compiled model against the model run eagerly at the example and "
                       "at sizes from the declared ranges (values; on a GPU, timings too)",
        description="Compare the compiled model with the eager forward at the example sizes, at "
                    "each dynamic size's minimum, an odd size inside and its maximum (capped), and "
                    "at both ends of every size piece: per output max abs/rel difference and "
                    "bit-exactness, and timings, on a CUDA GPU; on a host without one, the values "
                    "of the compiled graph evaluated on the CPU (ONNX's reference evaluator, each "
                    "launch in Triton's interpreter) against the eager run through the interpreter, "
                    "and what could not be checked. Exit status 0 when every size set passes.")
    check.add_argument("file", help="the model file")
    check.add_argument("artifacts", nargs="?", default=None,
                       help="a compiled folder (default: compile the file now, into the cache)")
    check.add_argument("--max-size", type=int, default=4096, metavar="N",
                       help="cap on every size verify makes inputs for, besides the model file's "
                            "example (default 4096); a range or piece starting above it is "
                            "reported as not checked")
    check.add_argument("--rtol", type=float, default=None, help="accept outputs within this relative difference")
    check.add_argument("--atol", type=float, default=None, help="accept outputs within this absolute difference")


@contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """While a model file is imported and run, what it (a library it imports, C code) writes to
    stdout goes to stderr: stdout carries only kernel_lens's results (JSON, artifact paths).
    Python's ``sys.stdout`` and file descriptor 1 are both redirected; buffered text is flushed
    (to stderr) before they are restored."""
    _flush(sys.stdout)
    saved_fd = None
    try:
        saved_fd = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # fd 1 or 2 closed: nothing to keep clean, or nowhere else to write
        if saved_fd is not None:
            os.close(saved_fd)
            saved_fd = None
    saved, sys.stdout = sys.stdout, sys.stderr
    try:
        yield
    finally:
        _flush(sys.stdout)  # maybe replaced by the model file meanwhile
        _flush(saved)  # sys.__stdout__, written to directly
        try:
            ctypes.CDLL(None).fflush(None)  # C stdio's buffered stdout
        except (OSError, AttributeError):
            pass
        sys.stdout = saved
        if saved_fd is not None:
            os.dup2(saved_fd, 1)
            os.close(saved_fd)


def _flush(stream) -> None:
    try:
        if stream is not None:
            stream.flush()
    except (OSError, ValueError):  # closed: nothing of ours to keep
        pass


def _options(args: argparse.Namespace) -> dict:
    return {k: v for k, v in (("ptx_version", args.ptx_version), ("cuda_version", args.cuda_version)) if v}


def _compile(args: argparse.Namespace, **kwargs):
    from .compiler import compile  # lazy: torch and triton (seconds to import) stay out of --version/--help

    with progress.stage(f"load model {args.file}"):
        mf = load_model_file(args.file)
    compiled = compile(mf.model, mf.example_inputs, arch=args.arch, **_shapes(args, mf),
                       roles=args.roles or mf.roles, autotune=args.autotune or mf.autotune,
                       options=_options(args), optimize=args.opt_level,
                       extra_examples=mf.extra_examples, **kwargs)  # an override naming no autotuned kernel: InputError
    _report_dims(args, compiled.ir)
    return compiled


def _shapes(args: argparse.Namespace, mf) -> dict:
    """--dynamic replaces the file's dynamic_shapes (its own Dims are then not used)."""
    return {"dynamic": True} if args.dynamic else {"dynamic_shapes": mf.dynamic_shapes}


def _report_dims(args: argparse.Namespace, ir) -> None:
    if args.dynamic:
        from .frontends.lift import describe_dims  # lazy: torch and triton

        print("dynamic dims (--dynamic):\n  " + describe_dims(ir).replace("\n", "\n  "),
              file=sys.stderr)


def cmd_dump_ir(args: argparse.Namespace) -> int:
    if args.schema:
        from .ir import json_schema  # lazy: pydantic, sympy (~0.5 s)
        print(json.dumps(json_schema(), indent=1))
        return 0
    if not args.file:
        raise KernelLensError("dump-ir needs a model file (or --schema)")
    _parse_json_options(args)
    if args.after == "none":
        # lazy: torch and triton (compiler), pydantic and sympy (summary)
        from .compiler import lift
        from .summary import summarize

        with _stdout_to_stderr():
            with progress.stage(f"load model {args.file}"):
                mf = load_model_file(args.file)
            ir = lift(mf.model, mf.example_inputs, arch=args.arch, **_shapes(args, mf),
                      roles=args.roles or mf.roles, autotune=args.autotune or mf.autotune,
                      extra_examples=mf.extra_examples)
            _report_dims(args, ir)
        print(ir.to_json() if args.json else summarize(ir), end="\n" if args.json else "")
        return 0
    with _stdout_to_stderr():
        compiled = _compile(args, stop_after=args.after)
    print(compiled.ir.to_json() if args.json else compiled.summary(), end="\n" if args.json else "")
    return 0


def cmd_passes(args: argparse.Namespace) -> int:
    from .passes import default_pipeline  # lazy: the IR (pydantic, sympy: ~0.5 s)

    for i, p in enumerate(default_pipeline().order(), 1):
        req = ", ".join(sorted(p.requires)) or "-"
        prov = ", ".join(sorted(p.provides)) or "-"
        print(f"{i}. {p.name:22s} requires: {req:20s} provides: {prov:20s} {p.description}")
    return 0


def cmd_targets(args: argparse.Namespace) -> int:
    from .targets.base import available_targets, get_target  # lazy: the IR (pydantic, sympy)

    for name, origin in available_targets().items():
        target = get_target(name)
        print(f"{name:12s} {target.description}   [{origin}]\n"
              f"{'':12s} stages: {' -> '.join(target.stages)}")
    return 0


def cmd_compile(args: argparse.Namespace) -> int:
    # lazy: the IR (pydantic, sympy) stays out of --version/--help
    from .passes import dump_to_dir

    _parse_json_options(args)
    _check_output("-o/--output", args.output)
    out = check_folder(args.output)  # a file there is refused before any work starts
    if args.stop_after is not None and not args.target:
        raise KernelLensError("--stop-after names a target stage: give --target too")
    # target and stage names are checked once, by compile(), before the capture
    with _stdout_to_stderr():
        compiled = _compile(args, targets=args.target, output_dir=out, stop_after=args.stop_after,
                            dump_after=args.dump_after,
                            dump=dump_to_dir(out / "dumps") if args.dump_after else None)
    for kind, path in compiled.artifacts.items():
        print(f"{kind}: {path}")
    if args.dump_after:
        print(f"dumps: {out / 'dumps'}")
    progress.log.info("next: check it with kernel_lens verify %s %s; run it with "
                      "kernel_lens.load(%r).run(...)%s", args.file, out, str(out),
                      f"; serve it with kernel_lens export-triton {out} -o REPO" if "ort" in args.target
                      else "; build a runtime with --target ort (see kernel_lens targets)"
                      if not args.target else "")
    trt = next((t for t in args.target or [] if f"{t}.onnx" in compiled.artifacts
                and f"{t}.library" in compiled.artifacts and t.startswith("trt")), None)
    if trt is not None:  # an engine is the serving GPU's and TensorRT's: built there
        from .serving.backends import trtexec_command  # lazy: the serving package

        progress.log.info("next: build a TensorRT engine on the GPU that will run it (its TensorRT): %s",
                          trtexec_command(compiled.ir, compiled.artifacts[f"{trt}.onnx"],
                                          compiled.artifacts[f"{trt}.library"], out / f"{compiled.ir.name}.plan"))
    return 0


def cmd_fetch_headers(args: argparse.Namespace) -> int:
    return fetch_headers.run(args, prog="kernel_lens", error_status=2, log_prefix="kernel_lens fetch-headers")


def cmd_doctor(args: argparse.Namespace) -> int:
    from .doctor import report  # lazy: ctypes, platform, the toolchain probes: doctor only

    text, status = report()
    print(text)
    return status


def cmd_verify(args: argparse.Namespace) -> int:
    with progress.stage("start up (torch, triton)"):  # seconds: said within SLOW, not silent
        from .verify import verify_file  # lazy: torch, the compiler

    tolerance = None
    if args.rtol is not None or args.atol is not None:
        tolerance = (args.rtol or 0.0, args.atol or 0.0)
    with _stdout_to_stderr():
        report = verify_file(args.file, args.artifacts, cap=args.max_size, tolerance=tolerance)
    print(report.text())
    return 0 if report.ok else 1


def cmd_export_triton(args: argparse.Namespace) -> int:
    with progress.stage("start up (onnx, pydantic)"):  # said within SLOW, not silent
        from .serving import export_triton  # lazy: onnx, pydantic, jinja2 (~1 s)

    _check_output("-o/--output", args.output)
    result = export_triton(args.directory, args.output, name=args.name, backend=args.backend,
                           instances=args.instances, max_batch_size=args.max_batch_size)
    print(f"config: {result.config}")
    for name, path in result.files.items():
        print(f"{name}: {path}")
    for note in result.notes:
        print(f"note: {printable(note)}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    _gc.FREEZE = True  # our own process: long-lived imports skip later GC passes (see _gc)
    parser = _parser()
    args = parser.parse_args(argv)
    args.verbose, args.quiet = getattr(args, "verbose", False), getattr(args, "quiet", False)
    args.debug = getattr(args, "debug", False)
    logging.basicConfig(level=logging.INFO if args.verbose or args.debug else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    if args.debug:  # kernel_lens's own debug records, e.g. what torch.export printed
        logging.getLogger("kernel_lens").setLevel(logging.DEBUG)
    shown = None
    if args.command in ("compile", "dump-ir", "verify", "export-triton") and not args.quiet:  # stages, from the first second
        shown = _progress_handler()
    start = time.perf_counter()
    try:
        status = _dispatch(args)
    finally:
        if shown is not None:
            shown.close()
            logging.getLogger(progress.log.name).removeHandler(shown)
    if shown is not None and status == 0:
        print(f"kernel_lens: done in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return status


def _progress_handler() -> logging.Handler:
    handler = _RichProgress() if sys.stderr.isatty() else _PlainProgress()
    logger = logging.getLogger(progress.log.name)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False  # not twice under -v
    return handler


class _PlainProgress(logging.Handler):
    """Progress as plain lines on stderr (a pipe, a CI log): one line per finished stage with its
    time; a stage still running after :attr:`SLOW` seconds (:attr:`FIRST` before any line) is
    announced, and the innermost running stage is named again whenever :attr:`QUIET` seconds
    pass without a line, so a long stage never leaves the log silent."""

    FIRST = 1.0
    SLOW = 2.0
    QUIET = 10.0
    TICK = 0.5  # how often running stages are looked at

    def __init__(self) -> None:
        super().__init__()
        self.running: list[list] = []  # [message, started, announced], outermost first
        self.last = time.monotonic()
        self.printed = False
        self.lock = threading.RLock()
        self.timer: threading.Timer | None = None

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "kl_event", None)
        with self.lock:
            if event == progress.START:
                self.running.append([record.getMessage(), time.monotonic(), False])
                self._schedule()
                return
            if event == progress.DONE and self.running:
                self.running.pop()
            self._print(record.getMessage())

    def _schedule(self) -> None:
        if self.timer is None and self.running:
            self.timer = threading.Timer(self.TICK, self._tick)
            self.timer.daemon = True
            self.timer.start()

    def _tick(self) -> None:
        with self.lock:
            self.timer = None
            now = time.monotonic()
            for stage in self.running:  # the command's first line comes sooner
                if not stage[2] and now - stage[1] >= (self.SLOW if self.printed else self.FIRST):
                    stage[2] = True
                    self._print(stage[0])
            if self.running and now - self.last >= self.QUIET:
                message, started, _ = self.running[-1]
                self._print(f"{message} still running ({now - started:.0f} s)")
            self._schedule()

    def _print(self, text: str) -> None:
        self.last, self.printed = time.monotonic(), True
        try:
            print(f"kernel_lens: {printable(text)}", file=sys.stderr, flush=True)
        except (OSError, ValueError):
            pass  # stderr closed: progress is not worth an error

    def close(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            self.timer = None
            self.running.clear()
        super().close()


class _RichProgress(logging.Handler):
    """Progress on a terminal: a spinner naming the running stage, a line per finished one."""

    def __init__(self) -> None:
        super().__init__()
        from rich.console import Console  # lazy: only on a terminal

        self.console = Console(stderr=True, highlight=False)
        self.running: list[tuple[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        event = getattr(record, "kl_event", None)
        text = printable(record.getMessage())
        if event == progress.START:
            status = self.console.status(text)
            if self.running:
                self.running[-1][1].stop()
            status.start()
            self.running.append((text, status))
            return
        if event == progress.DONE and self.running:
            self.running.pop()[1].stop()
            if self.running:
                self.running[-1][1].start()
        self.console.print(f"[green]✓[/green] {text}" if event == progress.DONE else text,
                           markup=event == progress.DONE, highlight=False)

    def close(self) -> None:
        for _, status in self.running:
            status.stop()
        self.running.clear()
        super().close()


def _dispatch(args: argparse.Namespace) -> int:
    handlers = {"dump-ir": cmd_dump_ir, "passes": cmd_passes, "compile": cmd_compile,
                "targets": cmd_targets, "fetch-headers": cmd_fetch_headers, "doctor": cmd_doctor,
                "export-triton": cmd_export_triton, "verify": cmd_verify}
    try:
        with _sigterm_stops():
            return handlers[args.command](args)
    except KernelLensError as exc:
        return _report_error(exc, args.debug, 2)
    except Terminated:
        print("kernel_lens: terminated (SIGTERM)", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("kernel_lens: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kernel_lens dump-ir m.py | head`: the reader left
        try:
            sys.stdout = open(os.devnull, "w")  # no second error when Python flushes stdout
        except OSError:
            pass
        return 141
    except OSError as exc:  # the system refused: permissions, a full disk, a missing folder
        return _report_error(exc, args.debug, 2, os_error=True)
    except Exception as exc:  # noqa: BLE001 - a bug of ours: one line, the traceback under --debug
        return _report_error(exc, args.debug, 1, internal=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the command is: it stops as Ctrl-C does (a running compiler's
    process group is killed, temporary files are removed), then exits with status 143."""


def _raise_terminated(signum: int, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one does not cut the cleanup short
    raise Terminated()


@contextmanager
def _sigterm_stops() -> Iterator[None]:
    """SIGTERM raises :class:`Terminated` (Python's default would end the process at once and
    leave its children running); the previous handler is restored after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


def _os_fix(exc: OSError) -> str:
    """What to do about an OSError, by its errno."""
    fixes = {errno.EACCES: "check the permissions of that path (or choose another -o)",
             errno.EPERM: "check the permissions of that path (or choose another -o)",
             errno.ENOSPC: "free disk space there (or choose another -o / KERNEL_LENS_CACHE)",
             errno.EDQUOT: "free disk space there (or choose another -o / KERNEL_LENS_CACHE)",
             errno.EROFS: "the file system is read-only: choose another -o",
             errno.ENOENT: "check that the path exists"}
    return fixes.get(exc.errno, "see the message; --debug shows where it happened")


def _report_error(exc: Exception, debug: bool, status: int, internal: bool = False,
                  os_error: bool = False) -> int:
    """One line on stderr: ``kernel_lens: error: <type>: <first line of the message>``; with
    ``--debug``, the whole message and the traceback. Details (compiler output, pydantic's
    list, torch.export's explanation) stay out of the way of the line that names the fix."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
        return status
    lines = [l for l in str(exc).strip().splitlines() if l.strip()] or ["(no message)"]
    first = printable(lines[0].strip())
    more = []
    if len(first) > _LINE:
        first = first[:_LINE] + "..."
        more.append("the message is cut")
    if len(lines) > 1:
        more.append(f"{len(lines) - 1} more line{'s' if len(lines) > 2 else ''}")
    tail = f" [{', '.join(more)}: run again with --debug to see all]" if more else ""
    kind = "internal error" if internal else "error"
    hint = " (a kernel_lens bug: please report it with the --debug output)" if internal else ""
    if os_error:
        hint = f" ({_os_fix(exc)})"
    print(f"kernel_lens: {kind}: {type(exc).__name__}: {first}{tail}{hint}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
