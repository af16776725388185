"""Plot benchmarks/runtime_results.json (written by bench_runtime.py on the GPU host).

    pip install matplotlib && python benchmarks/plot_runtime.py benchmarks/runtime_results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = [("eager", "eager"), ("cuda_graph_eager", "CUDA graph of eager"), ("torch_compile", "torch.compile"),
           ("run", "run()"), ("run_cuda_graph", "run(cuda_graph=True)"),
           ("run_cuda_graph_static", "run(cuda_graph=True), static buffers"),
           ("ort_by_hand", "ORT by hand (bare)"), ("ort_by_hand_cuda_graph", "ORT by hand, CUDA graph")]


def main(path: str) -> Path:
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 4.6))
    for ax, row in zip(axes, rows):
        base = row["eager_ms"]
        names = [label for key, label in COLUMNS if f"{key}_ms" in row]
        ratios = [row[f"{key}_ms"] / base for key, _ in COLUMNS if f"{key}_ms" in row]
        ax.barh(range(len(names)), ratios, color=["#888"] * 3 + ["#1f77b4"] * 3 + ["#bbb"] * 2)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(range(len(names)), names, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("time / eager (lower is better)")
        ax.set_title(f"{row['case']} (eager {base:.3f} ms)", fontsize=9)
    env = data["env"]
    fig.suptitle(f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}, onnxruntime {env['onnxruntime']}, "
                 f"{env['date']}", fontsize=9)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/runtime_results.json"))
