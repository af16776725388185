"""Compile times of the LLaMA-style example with the ORT target, cold and with nothing changed,
against a floor.

    python benchmarks/bench_compile.py benchmarks/compile_times.json [--before SRC_DIR]

Cold: empty Triton cache and empty kernel_lens build cache (fresh temporary folders); warm:
the same command again. Each is a full `kernel_lens compile ... --target ort` process.

Floor: a process that does what the compile's capture has to do at minimum: import torch and
triton, import the example (building its model) and run ``model(*example_inputs)`` once with
its Triton kernels executing, on a CPU-only host through Triton's interpreter, the way
``kernel_lens.frontends.capture.recorder.capture`` runs them. ``warm_over_floor`` is the ratio of the
medians (warm recompile / floor).

Stages: a warm recompile run in one process under a timing harness that wraps each stage's
entry point (exclusive times: a stage nested in another counts only for itself): ``import``
(interpreter start until the capture begins: torch, triton, torch.export's tracer,
kernel_lens, the model file),
``capture``, ``trace`` (torch.export), ``aot`` (Triton compiles of every binary, the passes'
included), ``passes``, ``onnx`` (lowering and saving), ``codegen`` (C++ sources), ``build``
(the library: cache key and lookup, or the compiler) and ``other`` (IR assembly, writing the
outputs, exit).

With ``--before SRC_DIR`` (the ``src/`` of an older checkout, e.g. from ``git worktree add``)
the same runs are made with that source on ``PYTHONPATH``, interleaved with the current
source's (and with the floor), so all are measured in one run on the same machine; the JSON
keeps both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "llama_block.py"
STAGES = ("import", "capture", "trace", "aot", "passes", "onnx", "codegen", "build", "other")

FLOOR = r"""
import importlib.util, sys
import torch, triton
from kernel_lens.frontends.capture.recorder import capture
path = sys.argv[1]
spec = importlib.util.spec_from_file_location("example", path)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
got = capture(mod.model, tuple(mod.example_inputs), 90)
assert got.launches and not got.native
"""


def compile_cmd(out: str) -> list[str]:
    return [sys.executable, "-m", "kernel_lens.cli", "compile", str(EXAMPLE), "--target", "ort", "-o", out]


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, check=True, env=env, capture_output=True, text=True)
    return time.perf_counter() - start, proc.stdout


def run(env: dict, out: str) -> float:
    return timed(compile_cmd(out), env)[0]


def floor(env: dict) -> float:
    return timed([sys.executable, "-c", FLOOR, str(EXAMPLE)], env)[0]


def stages(env: dict, out: str) -> dict[str, float]:
    """A warm recompile's split by stage (seconds), from a child running the harness below."""
    wall, stdout = timed([sys.executable, str(Path(__file__).resolve()), "--stages-child", out], env)
    inner = json.loads(stdout.strip().splitlines()[-1])
    split = {k: inner.get(k, 0.0) for k in STAGES}
    split["import"] += wall - inner["total"]  # interpreter start-up before the harness ran
    split["other"] = wall - sum(v for k, v in split.items() if k != "other")
    return {**{k: round(v, 3) for k, v in split.items()}, "total": round(wall, 3)}


def stages_child(out: str) -> None:
    """Run ``kernel_lens compile`` in this process with each stage's entry point timed."""
    start = time.perf_counter()
    spent = dict.fromkeys(STAGES, 0.0)
    stack: list[list] = []  # [stage, time entered or resumed]

    def wrap(stage: str, fn):
        def timed_call(*args, **kwargs):
            now = time.perf_counter()
            if stack:  # pause the enclosing stage
                spent[stack[-1][0]] += now - stack[-1][1]
            stack.append([stage, now])
            try:
                return fn(*args, **kwargs)
            finally:
                now = time.perf_counter()
                spent[stage] += now - stack.pop()[1]
                if stack:
                    stack[-1][1] = now
        return timed_call

    import kernel_lens.compiler as compiler
    import kernel_lens.frontends.lift as lift
    import kernel_lens.passes.base as passes_base
    import kernel_lens.targets.ort.target as ort_target
    from kernel_lens import cli

    patches = [(lift, "capture", "capture"), (lift, "trace", "trace"), (lift, "compile_binary", "aot"),
               (compiler, "compile_binary", "aot"), (passes_base.PassManager, "run", "passes"),
               (ort_target, "lower_to_onnx_cached" if hasattr(ort_target, "lower_to_onnx_cached")
                else "lower_to_onnx", "onnx"), (ort_target, "save_onnx", "onnx"),
               (ort_target, "ort_sources", "codegen"), (ort_target, "build_shared_library", "build")]
    for owner, attr, stage in patches:
        setattr(owner, attr, wrap(stage, getattr(owner, attr)))

    def mark_import(fn):  # everything before the capture starts is start-up (imports, model file)
        def call(*args, **kwargs):
            spent["import"] = time.perf_counter() - start
            return fn(*args, **kwargs)
        return call

    lift.capture = mark_import(lift.capture)
    with open(os.devnull, "w") as devnull:
        stdout, sys.stdout = sys.stdout, devnull
        try:
            rc = cli.main(["compile", str(EXAMPLE), "--target", "ort", "-o", out])
        finally:
            sys.stdout = stdout
    if rc:
        raise SystemExit(rc)
    spent["total"] = time.perf_counter() - start
    print(json.dumps(spent))


def git_rev(src: Path) -> str:
    proc = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    return proc.stdout.strip() or "?"


def median_split(splits: list[dict[str, float]]) -> dict[str, float]:
    return {k: round(statistics.median(s[k] for s in splits), 3) for k in splits[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="compile_times.json")
    ap.add_argument("--before", type=Path, default=None, help="src/ folder of the older version")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--stages-child", metavar="OUT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.stages_child:
        stages_child(args.stages_child)
        return
    sources = {"after": ROOT / "src"}
    if args.before is not None:
        sources = {"before": args.before.resolve(), **sources}
    results = {}
    floors: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        envs = {}
        for label, src in sources.items():
            envs[label] = {**os.environ, "PYTHONPATH": str(src),
                           "TRITON_CACHE_DIR": f"{tmp}/{label}/triton", "KERNEL_LENS_CACHE": f"{tmp}/{label}/kl"}
            results[label] = {"src": str(src), "commit": git_rev(src),
                              "cold_compile_s": round(run(envs[label], f"{tmp}/{label}/out"), 2),
                              "warm_recompile_s": [], "stages": []}
        for _ in range(args.repeat):  # interleaved: all see the same machine load
            floors.append(round(floor(envs["after"]), 2))
            for label in sources:
                results[label]["warm_recompile_s"].append(round(run(envs[label], f"{tmp}/{label}/out"), 2))
                results[label]["stages"].append(stages(envs[label], f"{tmp}/{label}/out"))
    floor_median = statistics.median(floors)
    for r in results.values():
        r["warm_recompile_median_s"] = round(statistics.median(r["warm_recompile_s"]), 2)
        r["warm_stages_median_s"] = median_split(r.pop("stages"))
        r["warm_over_floor"] = round(r["warm_recompile_median_s"] / floor_median, 2)
    doc = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "floor": {"what": "import torch + triton + the example, run its forward once through "
                             "Triton's interpreter (kernel_lens capture)",
                     "runs_s": floors, "median_s": round(floor_median, 2)},
           **results}
    if "before" in results:
        doc["warm_speedup"] = round(results["before"]["warm_recompile_median_s"]
                                    / results["after"]["warm_recompile_median_s"], 2)
    print(json.dumps(doc, indent=1))
    Path(args.path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
