"""Compile times of the LLaMA-style example with the ORT target, cold and with nothing changed.

    python benchmarks/bench_compile.py benchmarks/compile_times.json [--before SRC_DIR]

Cold: empty Triton cache and empty kernel_lens build cache (fresh temporary folders); warm:
the same command again. Each is a full `kernel_lens compile ... --target ort` process.
With ``--before SRC_DIR`` (the ``src/`` of an older checkout, e.g. from ``git worktree add``)
the same runs are made with that source on ``PYTHONPATH``, interleaved with the current
source's, so both are measured in one run on the same machine; the JSON keeps both.
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


def run(env: dict, out: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile", str(ROOT / "examples" / "llama_block.py"),
                    "--target", "ort", "-o", out], check=True, env=env, capture_output=True)
    return time.perf_counter() - start


def git_rev(src: Path) -> str:
    proc = subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True)
    return proc.stdout.strip() or "?"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("path", nargs="?", default="compile_times.json")
    ap.add_argument("--before", type=Path, default=None, help="src/ folder of the older version")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    sources = {"after": ROOT / "src"}
    if args.before is not None:
        sources = {"before": args.before.resolve(), **sources}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        envs = {}
        for label, src in sources.items():
            envs[label] = {**os.environ, "PYTHONPATH": str(src),
                           "TRITON_CACHE_DIR": f"{tmp}/{label}/triton", "KERNEL_LENS_CACHE": f"{tmp}/{label}/kl"}
            results[label] = {"src": str(src), "commit": git_rev(src),
                              "cold_compile_s": round(run(envs[label], f"{tmp}/{label}/out"), 2),
                              "warm_recompile_s": []}
        for _ in range(args.repeat):  # interleaved: both see the same machine load
            for label in sources:
                results[label]["warm_recompile_s"].append(round(run(envs[label], f"{tmp}/{label}/out"), 2))
    for r in results.values():
        r["warm_recompile_median_s"] = round(statistics.median(r["warm_recompile_s"]), 2)
    doc = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), **results}
    if "before" in results:
        doc["warm_speedup"] = round(results["before"]["warm_recompile_median_s"]
                                    / results["after"]["warm_recompile_median_s"], 2)
    print(json.dumps(doc, indent=1))
    Path(args.path).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
