"""Which attention kernel ONNX Runtime's CUDA EP runs for the fp16 LLaMA-style block (hidden 4096,
32 heads) at 2048 tokens, and what it costs: the same compiled artifacts in sessions with each
value of the CUDA EP option ``sdpa_kernel`` (ORT's AttentionBackend bit mask: 0 default, 1 flash,
2 memory-efficient, 8 cuDNN flash, 16 math), against eager PyTorch + Triton, timed in one run
(CUDA-event medians, pre-bound IOBinding, one non-default stream).

    python benchmarks/bench_attention_kernels.py OUT.json
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import kernel_lens as kl  # noqa: E402
from bench_ort import timed  # noqa: E402
from conftest import EXAMPLES, load_module  # noqa: E402

block_mod = load_module(EXAMPLES / "llama_block.py")


def session_fn(compiled, x, sdpa_kernel):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.register_custom_ops_library(str(compiled.artifacts["ort.library"]))
    stream = torch.cuda.current_stream().cuda_stream
    options = {"device_id": "0", "use_tf32": "0", "has_user_compute_stream": "1",
               "user_compute_stream": str(stream)}
    if sdpa_kernel is not None:
        options["sdpa_kernel"] = str(sdpa_kernel)
    session = ort.InferenceSession(str(compiled.artifacts["ort.onnx"]), so,
                                   providers=[("CUDAExecutionProvider", options)])
    out = torch.empty_like(x)
    binding = session.io_binding()
    binding.bind_input(session.get_inputs()[0].name, "cuda", 0, 10, tuple(x.shape), x.data_ptr())
    binding.bind_output(session.get_outputs()[0].name, "cuda", 0, 10, tuple(out.shape), out.data_ptr())
    run_options = ort.RunOptions()
    run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")
    run_options.add_run_config_entry("gpu_graph_id", "-1")
    return (lambda: session.run_with_iobinding(binding, run_options)), out


def main(path):
    torch.backends.cuda.matmul.allow_tf32 = False
    g = torch.Generator(device="cuda").manual_seed(0)
    block = block_mod.LlamaBlock(hidden=4096, n_heads=32, intermediate=11008).cuda().half().eval()
    seq = torch.export.Dim("seq", min=2, max=4096)
    ex = torch.randn(1, 64, 4096, device="cuda", generator=g).half()
    compiled = kl.compile(block, (ex,), dynamic_shapes=({1: seq},), targets=["ort"])
    x = torch.randn(1, 2048, 4096, device="cuda", generator=g).half()
    with torch.no_grad():
        ref = block(x)
        fns = {"eager": (lambda: block(x), None)}
        for value in (None, 1, 2, 8, 16):
            try:
                fns[f"ort sdpa_kernel={value}"] = session_fn(compiled, x, value)
            except Exception as exc:
                print(f"sdpa_kernel={value}: {type(exc).__name__}: {exc}", flush=True)
        rows = {name: [] for name in fns}
        for _ in range(5):  # interleaved rounds
            for name, (fn, _) in fns.items():
                rows[name].append(timed(fn, iters=50, repeats=3))
        results = {}
        for name, (fn, out) in fns.items():
            fn()
            torch.cuda.synchronize()
            diff = None if out is None else (out.float() - ref.float()).abs().max().item()
            results[name] = {"ms": round(sorted(rows[name])[2], 4), "max_abs_diff_vs_eager": diff}
            print(name, results[name], flush=True)
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    import onnxruntime
    env["onnxruntime"] = onnxruntime.__version__
    Path(path).write_text(json.dumps({"env": env, "block_fp16_2048_tokens": results}, indent=1))


if __name__ == "__main__":
    with torch.cuda.stream(torch.cuda.Stream()):
        try:
            main(sys.argv[1] if len(sys.argv) > 1 else "attention_kernels.json")
        except Exception:
            traceback.print_exc()
            sys.exit(1)
