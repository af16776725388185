"""The runtime's own speed on the GPU host, every row side by side in one run (CUDA events).

    python benchmarks/bench_runtime.py OUT.json [--profile] [--kernels] [--kernels-only]

--kernels adds, per block row, the GPU activities of one call (torch.profiler) for eager, run(),
a graph of eager and run(cuda_graph=True) on static buffers: their count, GPU busy time, wall
time and the idle rest. --kernels-only prints those and skips the timed rows.

Rows: the fp16 LLaMA-style block (hidden 4096, 32 heads, FFN 11008) at 2048 and 8 tokens, and
one RMSNorm kernel on 2048x4096 fp32. Columns: eager PyTorch + Triton, a CUDA graph of eager
(torch.cuda.CUDAGraph, static input), torch.compile, kernel_lens `run()`, `run(cuda_graph=True)`
(copies in and out), `run(cuda_graph=True)` on the runtime's static buffers (no copies), and the
same artifacts through ORT driven by hand (`run_with_iobinding` on a pre-bound session, plain
and in ORT's CUDA-graph mode). Host cost per call: wall time of back-to-back calls of `run()`
and of a bare pre-bound `run_with_iobinding` on the same artifacts, for the small models.
Everything runs on one non-default torch stream, which is also ORT's compute stream.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

import kernel_lens as kl  # noqa: E402
from bench_ort import timed  # noqa: E402  (CUDA-event medians, one definition for both)
from conftest import EXAMPLES, load_module  # noqa: E402

block_mod = load_module(EXAMPLES / "llama_block.py")


def host_us(fn, iters=2000):
    """Microseconds of host (wall) time per call, calls back to back, one sync at the end."""
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        best.append((time.perf_counter() - start) / iters * 1e6)
        torch.cuda.synchronize()
    return min(best)


class RMSNorm(torch.nn.Module):
    def __init__(self, hidden=4096):
        super().__init__()
        self.w = torch.nn.Parameter(1.0 + 0.1 * torch.randn(hidden, generator=torch.Generator().manual_seed(0)))

    def forward(self, x):
        return block_mod.rms_norm(x, self.w, 1e-6)


def graph_of(model, x):
    static_x = x.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            model(static_x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = model(static_x)
    return lambda keep=(static_x, static_y): g.replay()  # buffers live as long as the graph


def by_hand(compiled, x, cuda_graph, graph_id=None):
    """The same artifacts through ORT on a pre-bound IOBinding (what run() costs at the least)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.register_custom_ops_library(str(compiled.artifacts["ort.library"]))
    stream = torch.cuda.current_stream()
    opts = {"has_user_compute_stream": "1", "user_compute_stream": str(stream.cuda_stream),
            "use_tf32": "0"}
    if cuda_graph:
        opts["enable_cuda_graph"] = "1"
    sess = ort.InferenceSession(str(compiled.artifacts["ort.onnx"]), so,
                                providers=[("CUDAExecutionProvider", opts)])
    runner = compiled.runner()
    y = torch.empty(runner.output_shapes(runner.symbol_values([x]))[0], dtype=x.dtype, device="cuda")
    binding = sess.io_binding()
    code = runner._inputs[0].code
    binding.bind_input(compiled.ir.inputs[0], "cuda", 0, code, tuple(x.shape), x.data_ptr())
    binding.bind_output("output_0", "cuda", 0, code, tuple(y.shape), y.data_ptr())
    ro = ort.RunOptions()
    ro.add_run_config_entry("disable_synchronize_execution_providers", "1")
    if graph_id is not None:
        ro.add_run_config_entry("gpu_graph_id", graph_id)
    return lambda: sess.run_with_iobinding(binding, ro)


def row(label, model, x, compiled, host=False, rounds=7):
    """Every column of one row, measured interleaved: ``rounds`` rounds, each timing every column
    once (5x100 calls, median), and each column's median over the rounds, so that drift in the
    GPU's clocks during the row affects every column alike."""
    out = {"case": label}
    cases = {
        "eager": lambda: (lambda: model(x)),
        "cuda_graph_eager": lambda: graph_of(model, x),
        "torch_compile": lambda: (lambda c=torch.compile(model): (lambda: c(x)))(),
        "run": lambda: (lambda: compiled.run(x)),
        "run_cuda_graph": lambda: (lambda: compiled.run(x, cuda_graph=True)),
        "run_cuda_graph_static": lambda: static_call(compiled, x),
        "ort_by_hand": lambda: by_hand(compiled, x, False),
        "ort_by_hand_graph_id_-1": lambda: by_hand(compiled, x, False, "-1"),
        "ort_by_hand_cuda_graph": lambda: by_hand(compiled, x, True),
    }
    fns = {}
    for name, make in cases.items():
        try:
            fns[name] = make()
            fns[name]()
        except Exception as exc:  # record and go on: one failing column must not lose the run
            fns.pop(name, None)
            out[name + "_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            traceback.print_exc()
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            times[name].append(timed(fn, warmup=10, iters=100))
    for name, fn in fns.items():
        out[name + "_ms"] = round(statistics.median(times[name]), 4)
        if host and name in ("run", "ort_by_hand", "ort_by_hand_graph_id_-1", "eager",
                             "run_cuda_graph", "run_cuda_graph_static"):
            out[name + "_host_us"] = round(host_us(fn), 1)
        print(label, name, {k: v for k, v in out.items() if k.startswith(name)}, flush=True)
    return out


def static_call(compiled, x):
    ins, outs = compiled.runner(cuda_graph=True).cuda_graph_buffers(x)
    ins[0].copy_(x)
    return lambda: compiled.run(*ins, out=outs, cuda_graph=True)


def profile_run(compiled, x, calls=3000):
    """Where the host time of run() goes (cProfile, top entries by own time)."""
    import cProfile
    import io
    import pstats

    for _ in range(100):
        compiled.run(x)
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        compiled.run(x)
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(18)
    print(text.getvalue())


def kernel_table(label, fn, calls=20, top=12):
    """The CUDA kernels one call launches, by total GPU time (torch.profiler, CUPTI: ORT's kernels
    are seen too), to say where a gap to eager comes from."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = sorted((e for e in prof.key_averages() if e.device_time_total > 0),
                  key=lambda e: -e.device_time_total)
    print(f"--- {label}: CUDA kernels per call (us), top {top}")
    for e in rows[:top]:
        print(f"{e.device_time_total / calls:9.1f}  x{e.count // calls:<3} {e.key[:110]}")
    busy = sum(e.device_time_total for e in rows) / calls
    count = sum(e.count for e in rows) / calls
    print(f"{busy:9.1f}  total, {count:.0f} GPU activities per call", flush=True)
    return {"busy_us": round(busy, 1), "activities": round(count)}


def main(path):
    torch.backends.cuda.matmul.allow_tf32 = False
    rows = []
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    import onnxruntime
    import triton
    env.update(triton=triton.__version__, onnxruntime=onnxruntime.__version__)
    g = torch.Generator(device="cuda").manual_seed(0)

    only = "--kernels-only" in sys.argv
    if only:
        sys.argv.append("--kernels")
    norm = RMSNorm().cuda().eval()
    x = torch.randn(2048, 4096, device="cuda", generator=g)
    rows_dim = torch.export.Dim("rows", min=1, max=65536)
    compiled = kl.compile(norm, (x.clone(),), dynamic_shapes=({0: rows_dim},), targets=["ort"])
    if "--profile" in sys.argv:
        profile_run(compiled, x)
    if not only:
        rows.append(row("rmsnorm 2048x4096 fp32", norm, x, compiled, host=True))
    Path(path).write_text(json.dumps({"env": env, "rows": rows}, indent=1))

    block = block_mod.LlamaBlock(hidden=4096, n_heads=32, intermediate=11008).cuda().half().eval()
    seq = torch.export.Dim("seq", min=2, max=4096)
    ex = torch.randn(1, 64, 4096, device="cuda", generator=g).half()
    start = time.perf_counter()
    compiled = kl.compile(block, (ex,), dynamic_shapes=({1: seq},), targets=["ort"])
    env["block_compile_s"] = round(time.perf_counter() - start, 1)
    with torch.no_grad():
        for tokens in (8, 2048):
            x = torch.randn(1, tokens, 4096, device="cuda", generator=g).half()
            if not only:
                rows.append(row(f"block fp16 {tokens} tokens", block, x, compiled, host=tokens == 8))
            if "--kernels" in sys.argv:  # where the time goes: GPU busy vs wall (idle = the rest)
                fns = {"eager": lambda: block(x), "run()": lambda: compiled.run(x),
                       "graph of eager": graph_of(block, x), "run(cuda_graph=True) static": static_call(compiled, x)}
                for name, fn in fns.items():
                    stats = kernel_table(f"{name}, {tokens} tokens", fn)
                    stats["wall_us"] = round(timed(fn) * 1e3, 1)
                    stats["idle_us"] = round(stats["wall_us"] - stats["busy_us"], 1)
                    print(f"{name}, {tokens} tokens: {stats}", flush=True)
                    env.setdefault("timeline", {})[f"{name}, {tokens} tokens"] = stats
            Path(path).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print(json.dumps({"env": env, "rows": rows}, indent=1))


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    # Everything on one non-default stream: ORT is given that stream (the legacy default stream
    # cannot be handed to ORT), so every column's CUDA events time the same stream's work.
    with torch.cuda.stream(torch.cuda.Stream()):
        main(args[0] if args else "runtime_results.json")
