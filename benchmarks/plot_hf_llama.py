"""Plot benchmarks/hf_llama_results.json (written by bench_hf_llama.py on the GPU host) to
hf_llama_results.png: ms per forward of each case, eager / torch.compile / kernel_lens run().

    pip install matplotlib && python benchmarks/plot_hf_llama.py benchmarks/hf_llama_results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

COLUMNS = [("eager_ms", "eager (HF + Triton)"), ("torch_compile_ms", "torch.compile"),
           ("kernel_lens_run_ms", "kernel_lens run()")]


def main(path: str) -> Path:
    data = json.loads(Path(path).read_text())
    rows = data["rows"]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    width = 0.8 / len(COLUMNS)
    for k, (key, label) in enumerate(COLUMNS):
        ax.bar([i + (k - 1) * width for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    ax.set_xticks(range(len(rows)), [r["case"] for r in rows], rotation=15, ha="right", fontsize=8)
    ax.set_ylabel("ms per forward (median, CUDA events)")
    env = data["env"]
    ax.set_title(f"transformers Llama + Triton kernels, {env['gpu']}, {env['date']}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else str(Path(__file__).with_name("hf_llama_results.json"))))
