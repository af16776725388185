"""Plot benchmarks/results.json (written by bench_ort.py on the GPU host) to results.png.

    pip install matplotlib && python benchmarks/plot.py benchmarks/results.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main(path: str) -> Path:
    data = json.loads(Path(path).read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    kernels = data["kernels"]
    x = range(len(kernels))
    left.bar([i - 0.2 for i in x], [k["native_triton_ms"] * 1e3 for k in kernels], 0.4, label="Triton (native launch)")
    left.bar([i + 0.2 for i in x], [k["ort_kernel_lens_ms"] * 1e3 for k in kernels], 0.4, label="ORT + kernel_lens")
    left.set_xticks(list(x), [k["case"] for k in kernels], rotation=20, ha="right", fontsize=8)
    left.set_ylabel("µs per call (median, CUDA events)")
    left.set_title("Per kernel")
    left.legend(fontsize=8)
    rows = data["llama_block"]
    labels = [f"{r['dtype']} seq={r['seq']}" for r in rows]
    x = range(len(rows))
    for offset, key, label in ((-0.27, "eager_ms", "PyTorch eager"), (0.0, "torch_compile_ms", "torch.compile"),
                               (0.27, "ort_kernel_lens_ms", "ORT + kernel_lens")):
        right.bar([i + offset for i in x], [r[key] for r in rows], 0.27, label=label)
    right.set_xticks(list(x), labels, fontsize=8)
    right.set_ylabel("ms per forward (median)")
    right.set_title("LLaMA-style block (hidden 1024, 16 heads)")
    right.legend(fontsize=8)
    fig.suptitle(f"{data['gpu']} · torch {data['torch']} · triton {data['triton']} · onnxruntime {data['onnxruntime']}",
                 fontsize=9)
    fig.tight_layout()
    out = Path(path).with_suffix(".png")
    fig.savefig(out, dpi=110)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1] if len(sys.argv) > 1 else "benchmarks/results.json"))
