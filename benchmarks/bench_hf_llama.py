"""A transformers Llama with Triton kernels (examples/hf_llama.py, size ``bench``) on the GPU host:
eager PyTorch + Triton, torch.compile, and kernel_lens + ONNX Runtime side by side in one run.

    python benchmarks/bench_hf_llama.py OUT.json

Rows: fp32 and fp16, prefill (batch 1, 512 and 2048 tokens) and decode-sized calls (batch 1,
8 tokens; the model runs without a KV cache, so "decode" is a short forward). Columns (median ms
of CUDA-event timings over back-to-back calls on one non-default stream): eager (the patched model,
Triton kernels launched natively), torch.compile (default mode, of the same patched model),
kernel_lens ``run()`` and ``run(cuda_graph=True)``; plus the max abs difference of kernel_lens's
output from eager (ORT's GEMM/attention are not torch's, so not 0). TF32 is off everywhere.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))
os.environ["KL_HF_LLAMA_SIZE"] = "bench"

import kernel_lens as kl  # noqa: E402
from bench_ort import timed  # noqa: E402
from conftest import EXAMPLES, load_module  # noqa: E402

hf = load_module(EXAMPLES / "hf_llama.py")
SHAPES = [("decode", 8), ("prefill", 512), ("prefill", 2048)]


def bench_dtype(dtype: torch.dtype, env: dict) -> list[dict]:
    model = hf.HFLlama("bench").cuda().to(dtype).eval()
    name = str(dtype).removeprefix("torch.")
    (example,) = hf.make_inputs(1, 64, "cuda")
    start = time.perf_counter()
    compiled = kl.compile(model, (example,), dynamic_shapes=hf.dynamic_shapes, targets=["ort"])
    env[f"kernel_lens_compile_{name}_s"] = round(time.perf_counter() - start, 1)
    compiled_torch = torch.compile(model)
    rows = []
    with torch.no_grad():
        for kind, tokens in SHAPES:
            (ids,) = hf.make_inputs(1, tokens, "cuda", seed=tokens)
            eager_out = model(ids)
            row = {"case": f"{name} {kind} {tokens} tokens", "dtype": name, "tokens": tokens}
            cells = {
                "eager_ms": lambda: model(ids),
                "torch_compile_ms": lambda: compiled_torch(ids),
                "kernel_lens_run_ms": lambda: compiled.run(ids),
                "kernel_lens_run_cuda_graph_ms": lambda: compiled.run(ids, cuda_graph=True),
            }
            for key, fn in cells.items():
                try:
                    row[key] = round(timed(fn, warmup=5, iters=20 if tokens > 512 else 50,
                                           repeats=5), 4)
                except Exception as exc:  # record the failure, keep measuring the others
                    row[key] = None
                    row[key.replace("_ms", "_error")] = f"{type(exc).__name__}: {exc}"[:300]
                    traceback.print_exc()
            ours = compiled.run(ids)
            row["max_abs_diff_vs_eager"] = float((ours.float() - eager_out.float()).abs().max())
            for key in ("torch_compile_ms", "kernel_lens_run_ms", "kernel_lens_run_cuda_graph_ms"):
                if row.get(key) and row.get("eager_ms"):
                    row[key.replace("_ms", "_over_eager")] = round(row[key] / row["eager_ms"], 3)
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(path: str) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import onnxruntime
    import transformers
    import triton

    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "triton": triton.__version__, "onnxruntime": onnxruntime.__version__,
           "transformers": transformers.__version__, "config": hf.SIZES["bench"],
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    rows = []
    for dtype in (torch.float32, torch.float16):
        rows += bench_dtype(dtype, env)
        Path(path).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    with torch.cuda.stream(torch.cuda.Stream()):  # ORT is given this stream too
        main(sys.argv[1] if len(sys.argv) > 1 else "hf_llama_results.json")
