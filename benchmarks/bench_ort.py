"""Benchmarks on the GPU host: kernel_lens + ONNX Runtime (CUDA EP) against native Triton,
PyTorch eager and torch.compile, all in one process, timed with CUDA events.

    python benchmarks/bench_ort.py OUT.json

Per kernel: the same Triton kernel launched natively (the model's own forward) vs the
compiled model through ORT with IOBinding; both sides include their host overhead (Triton's
Python launcher vs ORT's Run). LLaMA-style block end to end: ORT + kernel_lens vs eager vs
torch.compile, fp32 and fp16. Each number is the median over many timed iterations.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import kernel_lens as kl  # noqa: E402
from conftest import CORPUS, EXAMPLES, load_module  # noqa: E402


def timed(fn, *args, warmup=25, iters=200, repeats=5):
    """Median milliseconds per call over `repeats` batches of `iters` back-to-back calls."""
    for _ in range(warmup):
        fn(*args)
    torch.cuda.synchronize()
    per_call = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn(*args)
        end.record()
        end.synchronize()
        per_call.append(start.elapsed_time(end) / iters)
    return statistics.median(per_call)


def kernel_cases():
    # (corpus model, inputs at benchmark size)
    yield "vector_add n=2^20", "vector_add", (torch.randn(1 << 20), torch.randn(1 << 20))
    yield "vector_add n=1000", "vector_add", (torch.randn(1000), torch.randn(1000))
    yield "swiglu tokens=4096 inter=4096", "swiglu", ("_make_inputs", dict(tokens=4096, intermediate=4096))
    yield "rmsnorm 64x2048x80", "rmsnorm", ("_make_inputs", dict(batch=64, seq=2048))


def bench_kernels(out_dir: Path):
    rows = []
    for label, name, inputs in kernel_cases():
        module = load_module(CORPUS / f"{name}.py")
        model = module.model.cuda() if isinstance(module.model, torch.nn.Module) else module.model
        examples = [t.cuda() for t in module.example_inputs]
        compiled = kl.compile(model, [t.clone() for t in examples], dynamic_shapes=module.dynamic_shapes,
                              targets=["ort"], output_dir=out_dir / name)
        if isinstance(inputs, tuple) and isinstance(inputs[0], str):
            inputs = getattr(module, inputs[0])(**inputs[1])
        args = [t.cuda() for t in inputs]
        native_ms = timed(model, *args)
        ort_ms = timed(compiled.run, *args)
        diff = (compiled.run(*args).float() - model(*args).float()).abs().max().item()
        rows.append({"case": label, "native_triton_ms": native_ms, "ort_kernel_lens_ms": ort_ms,
                     "overhead_us": (ort_ms - native_ms) * 1e3, "ratio": ort_ms / native_ms,
                     "max_abs_diff": diff, "shape": [list(a.shape) for a in args]})
        print(rows[-1], flush=True)
    return rows


def bench_gpu_bound(out_dir: Path):
    """Large enough that both sides are GPU-bound: the difference is what a node adds on the GPU."""
    module = load_module(CORPUS / "vector_add.py")
    model = module.model
    x, y = torch.randn(1 << 26, device="cuda"), torch.randn(1 << 26, device="cuda")
    n = torch.export.Dim("n", min=2, max=1 << 27)
    compiled = kl.compile(model, (x[:4096].clone(), y[:4096].clone()), dynamic_shapes=({0: n}, {0: n}),
                          targets=["ort"], output_dir=out_dir / "vector_add_big")
    rows = []
    for label, stream in (("default stream", None), ("non-default stream", torch.cuda.Stream())):
        # On torch's legacy default stream ORT runs on a side stream ordered with two events;
        # on any other torch stream it runs on that stream directly.
        with torch.cuda.stream(stream) if stream is not None else torch.cuda.stream(torch.cuda.current_stream()):
            native_ms, ort_ms = timed(model, x, y), timed(compiled.run, x, y)
            diff = (compiled.run(x, y) - model(x, y)).abs().max().item()
        rows.append({"case": f"vector_add n=2^26 GPU-bound, {label}", "native_triton_ms": native_ms,
                     "ort_kernel_lens_ms": ort_ms, "overhead_us": (ort_ms - native_ms) * 1e3,
                     "ratio": ort_ms / native_ms, "max_abs_diff": diff, "shape": [[1 << 26]] * 2})
        print(rows[-1], flush=True)
    return rows


def bench_llama(out_dir: Path):
    module = load_module(EXAMPLES / "llama_block.py")
    rows = []
    for dtype in (torch.float32, torch.float16):
        for seq in (128, 1024):
            model = module.LlamaBlock(hidden=1024, n_heads=16, intermediate=2816).cuda().to(dtype).eval()
            x = torch.randn(1, seq, 1024, device="cuda", dtype=dtype)
            seq_dim = torch.export.Dim("seq", min=2, max=4096)
            start = time.perf_counter()
            compiled = kl.compile(model, (x.clone(),), dynamic_shapes=({1: seq_dim},), targets=["ort"],
                                  output_dir=out_dir / f"llama_{str(dtype)[6:]}_{seq}")
            compile_s = time.perf_counter() - start
            with torch.no_grad():
                eager_ms = timed(model, x)
                tc = torch.compile(model)
                tc(x)
                compile_ms = timed(tc, x)
                ort_ms = timed(compiled.run, x)
                diff = (compiled.run(x).float() - model(x).float()).abs().max().item()
            rows.append({"dtype": str(dtype)[6:], "seq": seq, "hidden": 1024, "eager_ms": eager_ms,
                         "torch_compile_ms": compile_ms, "ort_kernel_lens_ms": ort_ms,
                         "speedup_vs_eager": eager_ms / ort_ms, "speedup_vs_torch_compile": compile_ms / ort_ms,
                         "max_abs_diff_vs_eager": diff, "kernel_lens_compile_s": compile_s})
            print(rows[-1], flush=True)
    return rows


def main(path: str) -> None:
    import onnxruntime
    import triton

    result = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "onnxruntime": onnxruntime.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with tempfile.TemporaryDirectory() as tmp:
        result["kernels"] = bench_kernels(Path(tmp)) + bench_gpu_bound(Path(tmp))
        result["llama_block"] = bench_llama(Path(tmp))
    Path(path).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "bench.json")
