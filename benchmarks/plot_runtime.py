"""Plot benchmarks/runtime_results.json (bench_runtime.py) or hf_llama_results.json
(bench_hf_llama.py), both written on the GPU host: one panel per row, time relative to eager.

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
           ("ort_by_hand", "ORT by hand (bare)"), ("ort_by_hand_cuda_graph", "ORT by hand, CUDA graph"),
           ("kernel_lens_run", "kernel_lens run()"),
           ("kernel_lens_run_cuda_graph", "kernel_lens run(cuda_graph=True)")]
OURS = {"run", "run_cuda_graph", "run_cuda_graph_static", "kernel_lens_run", "kernel_lens_run_cuda_graph"}


def main(path: str) -> Path:
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    cols = min(len(rows), 3)
    fig, axes = plt.subplots((len(rows) + cols - 1) // cols, cols, figsize=(5 * cols, 3.2 * ((len(rows) + cols - 1) // cols)), squeeze=False)
    axes = axes.reshape(-1)
    for ax, row in zip(axes, rows):
        base = row["eager_ms"]
        shown = [(key, label) for key, label in COLUMNS if row.get(f"{key}_ms") is not None]
        names = [label for _, label in shown]
        ratios = [row[f"{key}_ms"] / base for key, _ in shown]
        colors = ["#1f77b4" if key in OURS else "#bbb" if key.startswith("ort_") else "#888"
                  for key, _ in shown]
        ax.barh(range(len(names)), ratios, color=colors)
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
