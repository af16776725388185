"""Compile times of the LLaMA-style example with the ORT target, cold and with nothing changed.

    python benchmarks/bench_compile.py benchmarks/compile_times.json

Cold: empty Triton cache and empty kernel_lens build cache (fresh temporary folders); warm:
the same command again. Each is a full `kernel_lens compile ... --target ort` process.
"""

from __future__ import annotations

import json
import os
import platform
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


def main(path: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "TRITON_CACHE_DIR": f"{tmp}/triton", "KERNEL_LENS_CACHE": f"{tmp}/kl"}
        cold = run(env, f"{tmp}/out")
        warm = [run(env, f"{tmp}/out") for _ in range(3)]
    result = {"cpu_count": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version(),
              "cold_compile_s": round(cold, 2), "warm_recompile_s": [round(w, 2) for w in warm],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(result)
    Path(path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "compile_times.json")
