#!/usr/bin/env python
"""Conformance run of kernel_lens over real third-party Triton libraries (``tests/libraries``).

Every case file is run in fresh subprocesses (one per phase, so a crash or a hang in one case or
phase does not take the others down; ``--timeout`` seconds each, 300 by default):

* ``compile``: ``kernel_lens.compile(model, example_inputs, dynamic_shapes=..., arch=90,
  extra_examples=...)``, the front half only (no targets) on a CPU-only host. Recorded as
  ``compiled`` (plus the launch count and, where the file has ``reference``, whether the
  captured forward's outputs match it and whether ``compiled.run`` on the CPU (ONNX's evaluator
  and Triton's interpreter) matches it at the example, each extra example and two other sizes),
  the typed error (``KernelLensError`` subclass and the first line of its message), ``TRACEBACK``
  (any other exception: its type, first line and the last frames inside ``src/kernel_lens`` or
  the library), ``CRASH`` (the subprocess died: signal or exit code) or ``TIMEOUT``.
* ``export``: ``torch.export.export(model, example_inputs, dynamic_shapes=..., strict=True)``,
  ok or the first line of the error: what stock torch.export makes of the same model.

With ``--device cuda`` (a GPU host) inputs and model are moved to the GPU and the compile phase
also builds the ORT target (``targets=["ort"]``), runs ``compiled.run(*inputs)`` and compares it
with the eager forward under the case's ``tolerance``.

A case file may define, besides the corpus names (``model``, ``example_inputs``,
``dynamic_shapes``, ``reference``, ``tolerance``, ``_make_inputs``):

* ``library``: the PyPI name of the library the case exercises,
* ``library_module``: its top-level import name (for picking traceback frames),
* ``library_env``: a literal ``{name: value}`` dict of environment variables the library needs
  before it is imported. The runner reads it with ``ast`` (without importing the file) and sets
  it in the subprocess before the import.

Usage::

    python scripts/library_conformance.py                       # every case
    python scripts/library_conformance.py fla_l2norm flag_gems_add --json out.json
    python scripts/library_conformance.py --device cuda --json gpu.json
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ROOT / "tests" / "libraries"
PHASES = ("compile", "export")


# --------------------------------------------------------------------------------------------
# case discovery and metadata (read without importing the file)


def case_files(names: list[str]) -> list[Path]:
    if not names:
        return sorted(p for p in CASES.glob("*.py") if not p.name.startswith("_"))
    out = []
    for name in names:
        path = Path(name)
        if not path.suffix:
            path = CASES / f"{name}.py"
        elif not path.is_absolute() and not path.exists():
            path = CASES / path.name
        if not path.exists():
            sys.exit(f"library_conformance: no case file {path}")
        out.append(path.resolve())
    return out


def literal(path: Path, name: str, default=None):
    """The value of a module-level ``name = <literal>`` in ``path``, without importing it."""
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) and node.value is not None else [])
        for target in targets:
            if isinstance(target, ast.Name) and target.id == name:
                return ast.literal_eval(node.value)
    return default


# --------------------------------------------------------------------------------------------
# worker side (runs in the subprocess)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:2000] if text else ""


def _frames(exc: BaseException, roots: list[str], keep: int = 4) -> list[str]:
    """The last ``keep`` traceback frames whose file lies under one of ``roots``."""
    picked = []
    for frame in traceback.extract_tb(exc.__traceback__):
        if any(frame.filename.startswith(r) for r in roots):
            short = frame.filename
            for r in roots:
                if short.startswith(r):
                    short = os.path.join(os.path.basename(r.rstrip("/")), short[len(r):].lstrip("/"))
                    break
            picked.append(f"{short}:{frame.lineno} in {frame.name}: {(frame.line or '').strip()[:160]}")
    picked = picked[-keep:]
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:  # where it was raised, wherever that is (torch, triton, ...)
        last = frames[-1]
        site = f"raised at {last.filename}:{last.lineno} in {last.name}: {(last.line or '').strip()[:160]}"
        if not picked or not picked[-1].endswith((last.line or '').strip()[:160]) or \
                not any(last.filename.startswith(r) for r in roots):
            picked.append(site)
    return picked


def _roots(library_module: str | None) -> list[str]:
    roots = []
    import kernel_lens

    roots.append(str(Path(kernel_lens.__file__).resolve().parent) + "/")
    if library_module:
        spec = importlib.util.find_spec(library_module)
        if spec is not None and spec.origin:
            roots.append(str(Path(spec.origin).resolve().parent) + "/")
    return roots


def _describe(exc: BaseException, roots: list[str]) -> dict:
    from kernel_lens.errors import KernelLensError

    # the innermost KernelLensError wins when kernel_lens wrapped it in something else
    chain, seen = exc, set()
    while chain is not None and id(chain) not in seen:
        seen.add(id(chain))
        if isinstance(chain, KernelLensError):
            return {"status": "error", "type": type(chain).__name__, "message": _first_line(chain),
                    "frames": _frames(exc, roots)}
        chain = chain.__cause__ or chain.__context__
    return {"status": "TRACEBACK", "type": type(exc).__name__, "message": _first_line(exc),
            "frames": _frames(exc, roots)}


def _full(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    return text[-12000:]


def _to(obj, device):
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.to(device)
    if isinstance(obj, (list, tuple)):
        return type(obj)(_to(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: _to(v, device) for k, v in obj.items()}
    return obj


def _compare(got, want, tol) -> tuple[bool, float]:
    import torch

    got = got if isinstance(got, (list, tuple)) else (got,)
    want = want if isinstance(want, (list, tuple)) else (want,)
    if len(got) != len(want):
        return False, float("inf")
    rtol, atol = tol
    ok, worst = True, 0.0
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            continue
        g = g.detach().cpu().float()
        w = w.detach().cpu().float()
        if g.shape != w.shape:
            return False, float("inf")
        diff = (g - w).abs()
        finite = torch.isfinite(w)
        worst = max(worst, float(diff[finite].max()) if finite.any() else 0.0)
        ok = ok and torch.allclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
    return ok, worst


def install_cpu_shims() -> list[str]:
    """``--cpu-shims``: diagnostic only. Emulate, outside the libraries, two things a CPU-only
    capture would have to provide, so a run shows what fails *after* them:
    ``torch.cuda.device(d)`` is a no-op for a CPU device or a ``None`` index (flag_gems enters it
    around every launch), ``torch.utils._triton.has_triton()`` is True (torchao defines its
    kernels only then) and, without CUDA, ``torch.cuda.current_device()`` is 0 (flag_gems'
    ``LibEntry.run`` keys its kernel cache by it)."""
    import contextlib

    import torch
    import torch.utils._triton as tu

    real = torch.cuda.device

    def device(d):
        if d is None or (isinstance(d, int) and d < 0) or \
                (isinstance(d, (torch.device, str)) and torch.device(d).type != "cuda"):
            return contextlib.nullcontext()
        return real(d)

    torch.cuda.device = device
    tu.has_triton = lambda *a, **k: True
    shims = ["torch.cuda.device", "torch.utils._triton.has_triton"]
    if not torch.cuda.is_available():  # flag_gems' LibEntry.run keys its kernel cache by device
        torch.cuda.current_device = lambda: 0
        shims.append("torch.cuda.current_device")
    return shims


def worker(path: Path, phase: str, device: str, result_file: Path) -> None:
    result: dict = {"phase": phase}
    if os.environ.get("KL_CONFORMANCE_CPU_SHIMS") == "1":
        result["shims"] = install_cpu_shims()

    def dump():
        result_file.write_text(json.dumps(result))

    library_module = literal(path, "library_module")
    for key, value in (literal(path, "library_env") or {}).items():
        os.environ.setdefault(key, str(value))
    try:
        import torch

        import kernel_lens as kl  # noqa: F401  (imported before the case, as a user would)

        spec = importlib.util.spec_from_file_location(f"kl_case_{path.stem}", path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = mod
        spec.loader.exec_module(mod)
    except BaseException as exc:  # noqa: BLE001
        result.update({"status": "IMPORT", "type": type(exc).__name__, "message": _first_line(exc),
                       "frames": _frames(exc, _roots(None) + [str(Path(sys.prefix))])})
        dump()
        return
    roots = _roots(library_module)
    model = getattr(mod, "model", None) or getattr(mod, "Model")()
    inputs = tuple(mod.example_inputs)
    dynamic_shapes = getattr(mod, "dynamic_shapes", None)
    tol = tuple(getattr(mod, "tolerance", (1e-4, 1e-4)))
    if device != "cpu":
        if isinstance(model, torch.nn.Module):
            model = model.to(device)
        inputs = _to(inputs, device)
    start = time.perf_counter()
    try:
        if phase == "export":
            torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True)
            result["status"] = "ok"
        else:
            import kernel_lens as kl

            kwargs = dict(dynamic_shapes=dynamic_shapes, arch=90)
            if getattr(mod, "roles", None):
                kwargs["roles"] = mod.roles
            if getattr(mod, "autotune", None):
                kwargs["autotune"] = mod.autotune
            extra = [_to(tuple(e), device) for e in getattr(mod, "extra_examples", None) or []]
            if extra:
                kwargs["extra_examples"] = extra
            if device != "cpu":
                out_dir = tempfile.mkdtemp(prefix=f"kl_{path.stem}_")
                kwargs.update(targets=["ort"], output_dir=out_dir)
            compiled = kl.compile(model, inputs, **kwargs)
            result["status"] = "compiled"
            launches = [launch for graph in compiled.ir.graphs() for launch in graph.launches]
            result["launches"] = len(launches)  # every size piece's (a split model has no top-level ones)
            result["kernels"] = sorted({launch.kernel for launch in launches})
            result["pieces"] = len(compiled.ir.pieces)
            reference = getattr(mod, "reference", None)
            if reference is not None and device == "cpu":
                want = reference(*_to(tuple(mod.example_inputs), device))
                ok, worst = _compare(compiled.example_outputs, want, tol)
                result["matches_reference"] = ok
                result["max_abs_diff"] = worst
                # the compiled model itself on the CPU (graph by ONNX's evaluator, launches by
                # Triton's interpreter) at the example, the extra examples and two other sizes
                runs = []
                for sizes, args in [({}, inputs), *(({"extra_example": i}, e) for i, e in enumerate(extra)),
                                    *_other_sizes(mod, dynamic_shapes, device)]:
                    try:
                        want = reference(*args)
                    except Exception:  # noqa: BLE001 - the reference itself fails at this size
                        continue
                    ok, worst = _compare(compiled.run(*args), want, tol)
                    runs.append({"sizes": sizes, "ok": ok, "max_abs_diff": worst})
                result["runs"] = runs
                result["compiled_matches_reference"] = all(r["ok"] for r in runs)
            if device != "cpu":
                # the captured size and two others in the declared range: ORT vs eager
                runs = []
                for sizes, args in [({}, inputs), *_other_sizes(mod, dynamic_shapes, device)]:
                    eager = model(*args)
                    got = compiled.run(*args)
                    ok, worst = _compare(got, eager, tol)
                    exact = all(torch.equal(a, b) for a, b in zip(_flat(got), _flat(eager)))
                    # eager again: a kernel whose results vary run to run (atomics, autotuning
                    # afresh) cannot be bit-exact against any one eager run
                    again = model(*args)
                    repeatable = all(torch.equal(a, b) for a, b in zip(_flat(again), _flat(eager)))
                    runs.append({"sizes": sizes, "ok": ok, "exact": exact, "max_abs_diff": worst,
                                 "eager_repeatable": repeatable})
                result["runs"] = runs
                result["eager_repeatable"] = all(r["eager_repeatable"] for r in runs)
                result["ort_matches_eager"] = all(r["ok"] for r in runs)
                result["bit_exact"] = all(r["exact"] for r in runs)
                result["max_abs_diff"] = max(r["max_abs_diff"] for r in runs)
    except BaseException as exc:  # noqa: BLE001
        result.update(_describe(exc, roots))
        result["traceback"] = _full(exc)
    result["seconds"] = round(time.perf_counter() - start, 2)
    dump()


def _flat(x):
    import torch

    if isinstance(x, torch.Tensor):
        return [x]
    return [t for item in x for t in _flat(item)] if isinstance(x, (tuple, list)) else []


def _other_sizes(mod, dynamic_shapes, device) -> list:
    """Two more size sets in the declared range for ``_make_inputs``: each keyword that names a
    dynamic Dim at a ragged larger size (3x+1) and near the range's minimum (min+1)."""
    import inspect

    import torch

    make = getattr(mod, "_make_inputs", None)
    if make is None or not dynamic_shapes:
        return []
    dims = {}

    def walk(spec):
        if isinstance(spec, torch.export.dynamic_shapes._Dim):
            dims[spec.__name__] = (spec.min, spec.max)
        elif isinstance(spec, dict):
            for v in spec.values():
                walk(v)
        elif isinstance(spec, (tuple, list)):
            for v in spec:
                walk(v)
    walk(dynamic_shapes)
    defaults = {k: v.default for k, v in inspect.signature(make).parameters.items()
                if isinstance(v.default, int) and k in dims}
    if not defaults:
        return []
    out = []
    for pick in (lambda v, lo, hi: min(hi, 3 * v + 1), lambda v, lo, hi: min(hi, lo + 1)):
        sizes = {k: pick(v, *dims[k]) for k, v in defaults.items()}
        try:
            made = make(**sizes)
        except Exception:  # noqa: BLE001 - the case's own input maker does not reach this size
            continue
        out.append((sizes, _to(tuple(made), device)))
    return out


# --------------------------------------------------------------------------------------------
# driver side


def run_worker(cmd: list[str], timeout: float) -> subprocess.CompletedProcess | None:
    """Run a worker in a process group of its own; past ``timeout`` s the whole group is killed
    (the worker and whatever it started: compilers, ptxas, a server), and None is returned."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        return None
    finally:
        if proc.poll() is None:  # interrupted: leave nothing running
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    try:  # children the worker left behind when it ended
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_phase(path: Path, phase: str, device: str, timeout: float) -> dict:
    with tempfile.TemporaryDirectory(prefix="kl_conf_") as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--_worker", str(path),
               "--_phase", phase, "--_result", str(result_file), "--device", device]
        start = time.perf_counter()
        proc = run_worker(cmd, timeout)
        if proc is None:
            return {"phase": phase, "status": "TIMEOUT", "type": "", "message": f"over {timeout:.0f} s",
                    "seconds": round(time.perf_counter() - start, 1)}
        if result_file.exists():
            result = json.loads(result_file.read_text())
            result["wall_seconds"] = round(time.perf_counter() - start, 1)
            return result
        rc = proc.returncode
        how = f"signal {signal.Signals(-rc).name}" if rc < 0 else f"exit code {rc}"
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-8:]
        return {"phase": phase, "status": "CRASH", "type": how, "message": tail[-1][:300] if tail else "",
                "stderr_tail": tail, "seconds": round(time.perf_counter() - start, 1)}


def cell(result: dict) -> str:
    status = result.get("status")
    if status == "compiled":
        pieces = f" in {result['pieces']} size pieces" if result.get("pieces") else ""
        text = f"compiled ({result.get('launches')} launches{pieces}"
        if "matches_reference" in result:
            text += ", matches reference" if result["matches_reference"] else \
                f", MISMATCH vs reference (max abs {result.get('max_abs_diff'):.3g})"
        if "compiled_matches_reference" in result:
            runs = result["runs"]
            text += (f", compiled == reference on the CPU at {len(runs)} inputs"
                     if result["compiled_matches_reference"] else
                     f", COMPILED != reference on the CPU (max abs "
                     f"{max(r['max_abs_diff'] for r in runs):.3g})")
        if "ort_matches_eager" in result:
            sizes = len(result.get("runs", [])) or 1
            varies = "" if result.get("eager_repeatable", True) else "; eager run twice differs too"
            text += (f", ORT bit-exact at {sizes} sizes" if result.get("bit_exact") else
                     f", ORT == eager at {sizes} sizes (max abs {result.get('max_abs_diff'):.3g}{varies})")\
                if result["ort_matches_eager"] else \
                f", ORT != eager (max abs {result.get('max_abs_diff'):.3g})"
        return text + ")"
    if status == "ok":
        return "ok"
    kind = "error" if status == "error" else status
    text = f"{kind}: {result.get('type', '')}: {result.get('message', '')[:300]}"
    return text.replace("|", "\\|").replace("\n", " ")[:220]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("cases", nargs="*", help="case names or files (default: all of tests/libraries)")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--device", default="cpu", help="cpu (capture through the interpreter) or cuda")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case and phase")
    parser.add_argument("--phases", default=",".join(PHASES), help="compile,export (default both)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra environment for the case subprocesses (repeatable)")
    parser.add_argument("--cpu-shims", action="store_true",
                        help="diagnostic: no-op torch.cuda.device for CPU tensors and has_triton()=True "
                             "in the subprocesses, to see what fails after those")
    parser.add_argument("--jobs", type=int, default=1, help="case subprocesses run at once")
    parser.add_argument("--_worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--_phase", help=argparse.SUPPRESS)
    parser.add_argument("--_result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args._worker:
        worker(args._worker, args._phase, args.device, args._result)
        return 0

    phases = [p for p in args.phases.split(",") if p]
    for item in args.env:
        name, _, value = item.partition("=")
        os.environ[name] = value
    if args.cpu_shims:
        os.environ["KL_CONFORMANCE_CPU_SHIMS"] = "1"

    def one(path: Path) -> dict:
        entry = {"case": path.stem, "library": literal(path, "library"),
                 "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)}
        for phase in phases:
            entry[phase] = run_phase(path, phase, args.device, args.timeout)
            print(f"[{path.stem}] {phase}: {cell(entry[phase])}", file=sys.stderr, flush=True)
        return entry

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        results = list(pool.map(one, case_files(args.cases)))
    if args.json:
        versions = {}
        for dist in ("torch", "triton", "numpy", "fla-core", "flag_gems", "torchao", "kernel_lens"):
            try:
                from importlib.metadata import version

                versions[dist] = version(dist)
            except Exception:  # noqa: BLE001
                pass
        args.json.write_text(json.dumps({"device": args.device, "versions": versions,
                                         "cpu_shims": args.cpu_shims, "env": args.env,
                                         "results": results}, indent=1))
    header = "| case | library | " + " | ".join(f"kernel_lens {p}" if p == "compile" else
                                                 "torch.export strict" for p in phases) + " |"
    print(header)
    print("|" + "---|" * (2 + len(phases)))
    for entry in results:
        print(f"| {entry['case']} | {entry['library']} | "
              + " | ".join(cell(entry[p]) for p in phases) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
