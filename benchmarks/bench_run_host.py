"""Host cost per call of a plain ``run()`` (no CUDA graph) against ORT's own Run on the same
session (issue 26 item 4: within 15 us of ``run_with_iobinding`` on a pre-built binding).

    PYTHONPATH=src python benchmarks/bench_run_host.py --json OUT.json [--rows 16] [--hidden 4096]

One small RMSNorm model (one Triton kernel, fp32, ``rows`` x ``hidden``; the GPU is idle most
of the time), compiled for the ORT target. For each of two caller streams (torch's legacy
default stream, where the runner orders a side stream with events, and a non-default stream,
which ORT is given as its compute stream), the median host time of one call (perf_counter
around the call, ``--calls`` calls after a warm-up, the GPU synchronized every 100 calls
outside the timed region) of:

  a   ``compiled.run(x)``, the result dropped (its buffer comes back for the next call)
  a2  ``y = compiled.run(x)``, the last result held while the next is made (two buffers)
  b   ``compiled.run(x, out=[y])`` into a preallocated output
  c   ``session.run_with_iobinding(binding, options)``: the runner's own session and run
      options (no EP synchronization at the end, gpu_graph_id -1), a binding built once
  c0  the same with ORT's default run options (``run_with_iobinding(binding)``), which
      synchronizes the stream at the end of Run
  c_raw  ORT's C binding of Run without the Python wrapper (the floor)
  d   c + ``binding.synchronize_outputs()`` (run() does not call it; shown for comparison)
  d0  c0 + ``binding.synchronize_outputs()``

plus a back-to-back loop (one synchronization at the end) for a and c, a breakdown of the
pieces of a call timed alone, and a cProfile of 500 calls of (a), top 25 functions by own time.
Every part records its error and the run goes on: the JSON holds what was measured.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import json
import platform
import pstats
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

import kernel_lens as kl  # noqa: E402

SYNC_EVERY = 100


def _load(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module  # @triton.jit reads the source through the module
    spec.loader.exec_module(module)
    return module


block = _load(ROOT / "examples" / "llama_block.py")


class RMSNorm(torch.nn.Module):
    """benchmarks/bench_runtime.py's RMSNorm row: examples/llama_block.py's kernel."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=g))

    def forward(self, x):
        return block.rms_norm(x, self.w, 1e-6)


def per_call(fn, calls: int, warmup: int = 200) -> dict:
    """Host microseconds of one call: perf_counter around each call; the GPU drained every
    SYNC_EVERY calls outside the timed region, so the launch queue never pushes back."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    clock = time.perf_counter
    for i in range(calls):
        start = clock()
        fn()
        times.append(clock() - start)
        if (i + 1) % SYNC_EVERY == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    times.sort()
    us = [t * 1e6 for t in times]
    return {"median_us": round(statistics.median(us), 2), "p10_us": round(us[len(us) // 10], 2),
            "p90_us": round(us[9 * len(us) // 10], 2), "min_us": round(us[0], 2),
            "mean_us": round(statistics.fmean(us), 2), "calls": calls}


def loop_us(fn, calls: int) -> float:
    """Host microseconds per call of back-to-back calls, one synchronization at the end."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return round(host / calls * 1e6, 2)


def batch_us(fn, batches: int = 30, per: int = 100) -> float:
    """Median over batches of the mean host microseconds of ``per`` calls (for pieces too short
    to time one by one); the GPU drained between batches."""
    for _ in range(per):
        fn()
    torch.cuda.synchronize()
    means = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(per):
            fn()
        means.append((time.perf_counter() - start) / per * 1e6)
        torch.cuda.synchronize()
    return round(statistics.median(means), 3)


def error(exc: BaseException) -> str:
    traceback.print_exc()
    return f"{type(exc).__name__}: {str(exc)[:400]}"


def attempt(into: dict, name: str, make) -> None:
    """``into[name] = make()``, or ``into[name + "_error"]`` with what went wrong."""
    try:
        into[name] = make()
        print(f"  {name}: {into[name]}", flush=True)
    except Exception as exc:  # one failing part must not lose the run
        into[name + "_error"] = error(exc)


def by_hand(runner, session, x, y, index: int):
    """A binding of ``session`` built once: the runner's input and output names on ``x``, ``y``."""
    binding = session.io_binding()
    (inp,), (outp,) = runner._inputs, runner._outputs
    binding.bind_input(inp.name, "cuda", index, inp.code, tuple(x.shape), x.data_ptr())
    binding.bind_output(outp.name, "cuda", index, outp.code, tuple(y.shape), y.data_ptr())
    return binding


def profile_top(fn, calls: int = 500, top: int = 25) -> list[dict]:
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for i in range(calls):
        fn()
        if (i + 1) % SYNC_EVERY == 0:
            torch.cuda.synchronize()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof).stats
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{Path(file).name}:{line}({func})", "ncalls": nc,
             "tottime_us_per_run": round(tt / calls * 1e6, 3), "cumtime_us_per_run": round(ct / calls * 1e6, 3)}
            for (file, line, func), (cc, nc, tt, ct, _) in rows]


def measure(compiled, x, calls: int, label: str) -> dict:
    """Every column on the caller's current stream."""
    out: dict = {}
    index = x.device.index
    runner = compiled.runner()
    compiled.run(x)  # the session for this stream is made now
    torch.cuda.synchronize()
    y = torch.empty_like(compiled.run(x))
    state = session = options = binding = None
    try:
        raw, side = runner._stream(index)
        state = runner.session(index, raw)
        session, options = state.session, runner._run_options
        binding = by_hand(runner, session, x, y, index)
        out["ort_stream"] = raw
        out["side_stream"] = side is not None
    except Exception as exc:
        out["session_error"] = error(exc)
    print(f"--- {label}", flush=True)

    held = [compiled.run(x)]

    def keep():
        held[0] = compiled.run(x)

    cases = {
        "a_run": lambda: compiled.run(x),
        "a2_run_keep_last": keep,
        "b_run_out": lambda: compiled.run(x, out=[y]),
    }
    if binding is not None:
        cases.update({
            "c_ort_runner_options": lambda: session.run_with_iobinding(binding, options),
            "c0_ort_default_options": lambda: session.run_with_iobinding(binding),
            "c_raw_ort_c_binding": lambda: session._sess.run_with_iobinding(binding._iobinding, options),
            "d_ort_runner_options_sync_outputs": lambda: (session.run_with_iobinding(binding, options),
                                                          binding.synchronize_outputs()),
            "d0_ort_default_options_sync_outputs": lambda: (session.run_with_iobinding(binding),
                                                            binding.synchronize_outputs()),
        })
    for name, fn in cases.items():
        attempt(out, name, lambda fn=fn: per_call(fn, calls))
    for name in ("a_run", "c_ort_runner_options"):
        if name in cases:
            attempt(out, name + "_loop_us", lambda name=name: loop_us(cases[name], calls))
    if "a_run" in out and "c_ort_runner_options" in out:
        out["a_minus_c_median_us"] = round(out["a_run"]["median_us"] - out["c_ort_runner_options"]["median_us"], 2)
    if "a_run" in out and "c0_ort_default_options" in out:
        out["a_minus_c0_median_us"] = round(out["a_run"]["median_us"] - out["c0_ort_default_options"]["median_us"], 2)

    pieces: dict = {}
    shape, dtype = tuple(y.shape), y.dtype
    attempt(pieces, "runner_lookup", lambda: batch_us(lambda: compiled.runner()))
    attempt(pieces, "signature_checked", lambda: batch_us(
        lambda: runner.signature.checked((x,), None, getattr(runner, "_written", ()))))
    attempt(pieces, "signature_checked_out", lambda: batch_us(
        lambda: runner.signature.checked((x,), [y], getattr(runner, "_written", ()))))
    attempt(pieces, "symbol_values_and_output_shapes", lambda: batch_us(
        lambda: runner.output_shapes(runner.symbol_values((x,)))))
    attempt(pieces, "torch_empty_output", lambda: batch_us(lambda: torch.empty(shape, dtype=dtype, device=x.device)))
    attempt(pieces, "current_raw_stream", lambda: batch_us(lambda: runner._stream(index)))
    if state is not None:
        attempt(pieces, "session_lookup", lambda: batch_us(lambda: runner.session(index, raw)))
        attempt(pieces, "binding_lookup_hit", lambda: batch_us(lambda: runner._binding(state, index, (x, y))))
        attempt(pieces, "bind_output_one_name", lambda: batch_us(
            lambda: binding.bind_output(runner._outputs[0].name, "cuda", index, runner._outputs[0].code,
                                        shape, y.data_ptr())))
        attempt(pieces, "ort_run_runner_options", lambda: batch_us(lambda: session.run_with_iobinding(binding, options)))
        attempt(pieces, "ort_run_c_binding", lambda: batch_us(
            lambda: session._sess.run_with_iobinding(binding._iobinding, options)))
        if side is not None:
            def events():
                side.ready.record(side.caller)
                side.stream.wait_event(side.ready)
                side.done.record(side.stream)
                side.caller.wait_event(side.done)
            attempt(pieces, "side_stream_event_pair", lambda: batch_us(events))

            def events_as_before():  # what the runner did before: wait_stream, a new event each
                side.stream.wait_stream(torch.cuda.current_stream(index))
                torch.cuda.current_stream(index).wait_stream(side.stream)
            attempt(pieces, "side_stream_wait_stream_as_before", lambda: batch_us(events_as_before))
    attempt(pieces, "run_whole", lambda: batch_us(lambda: compiled.run(x)))
    out["pieces_us"] = pieces
    attempt(out, "profile_a_run_top25_by_tottime", lambda: profile_top(lambda: compiled.run(x)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, help="where the results go")
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    path = Path(args.json)
    result: dict = {"args": vars(args)}

    def save() -> None:
        path.write_text(json.dumps(result, indent=1))

    env = result["env"] = {"python": platform.python_version(), "torch": torch.__version__,
                           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    attempt(env, "gpu", torch.cuda.get_device_name)
    attempt(env, "onnxruntime", lambda: __import__("onnxruntime").__version__)
    attempt(env, "kernel_lens", lambda: kl.__version__)
    attempt(env, "commit", lambda: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                                  capture_output=True, text=True).stdout.strip() or None)
    save()

    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        g = torch.Generator(device="cuda").manual_seed(0)
        norm = RMSNorm(args.hidden).cuda().eval()
        x = torch.randn(args.rows, args.hidden, device="cuda", generator=g)
        rows = torch.export.Dim("rows", min=1, max=65536)
        start = time.perf_counter()
        compiled = kl.compile(norm, (x.clone(),), dynamic_shapes=({0: rows},), targets=["ort"])
        result["compile_s"] = round(time.perf_counter() - start, 1)
    except Exception as exc:
        result["compile_error"] = error(exc)
        save()
        raise SystemExit(1) from None
    with torch.no_grad():
        attempt(result, "max_abs_diff_vs_eager", lambda: (compiled.run(x) - norm(x)).abs().max().item())
    save()

    try:
        result["default_stream"] = measure(compiled, x, args.calls, "torch's legacy default stream")
    except Exception as exc:
        result["default_stream_error"] = error(exc)
    save()
    try:
        with torch.cuda.stream(torch.cuda.Stream()):
            torch.cuda.current_stream().wait_stream(torch.cuda.default_stream())
            xs = x.clone()
            result["side_stream"] = measure(compiled, xs, args.calls, "a non-default stream")
    except Exception as exc:
        result["side_stream_error"] = error(exc)
    save()
    summary = {}
    for where in ("default_stream", "side_stream"):
        part = result.get(where, {})
        summary[where] = {k: (v["median_us"] if isinstance(v, dict) and "median_us" in v else v)
                          for k, v in part.items() if k[0] in "abcd" and not k.endswith("_error")}
    result["summary_median_us"] = summary
    save()
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
