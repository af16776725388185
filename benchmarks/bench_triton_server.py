"""Triton Inference Server on the GPU host: the LLaMA-style example (examples/llama_block.py)
exported for Triton's python backend and served by a real tritonserver (PyPI nvidia-pytriton),
against the same compiled model run in this process.

    python benchmarks/bench_triton_server.py --out OUT_DIR [--compiled DIR]
    python benchmarks/bench_triton_server.py --plot OUT_DIR/triton_server.json   (needs matplotlib)

DIR is `kernel_lens compile examples/llama_block.py --target ort -o DIR`; without --compiled the
example is compiled into OUT_DIR/compiled first. Then:
- the model is exported (python backend) into OUT_DIR/repo and tritonserver is started on it
  (kernel_lens.serving.tritonserver; its log stays in OUT_DIR/server/tritonserver.log);
- the reference for every input size is `kernel_lens.load(DIR).run(x)` in this process: the
  same ONNX graph, custom-op library and ONNX Runtime CUDA EP options the server runs, so every
  response must be bit-identical to it (bytes equal). The eager forward of the example is also
  compared, for information only: ORT's matmuls and attention are other kernels than torch's;
- per protocol (HTTP, then gRPC), --clients threads (one client each) send --requests requests
  in all, cycling through the input sizes; every request must be answered (none lost), with no
  error and bit-identical;
- `compiled.run()` is timed in this process over the same inputs (GPU-resident inputs, and with
  the host copies a served request also pays);
- OUT_DIR/triton_server.json gets throughput and p50/p99 latencies; OUT_DIR/triton_server.png a
  plot when matplotlib is importable (else run --plot where it is).
Exit status 0 only when every request of both protocols was answered, bit-identical.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import math
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

MODEL = "llama_block"
INPUT, OUTPUT = "x", "output_0"


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (nearest rank) of values."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def summarize(latencies_s: list[float], wall_s: float, answered: int) -> dict:
    ms = [t * 1e3 for t in latencies_s] or [float("nan")]
    return {"p50_ms": percentile(ms, 50), "p99_ms": percentile(ms, 99), "mean_ms": statistics.fmean(ms),
            "throughput_rps": answered / wall_s if wall_s > 0 else float("nan"), "wall_s": wall_s}


# --- the model and its references ------------------------------------------------------------

def compile_example(out: Path) -> Path:
    import torch

    import kernel_lens as kl
    from conftest import EXAMPLES, load_module

    module = load_module(EXAMPLES / "llama_block.py")
    kl.compile(module.model.cuda(), [t.cuda() for t in module.example_inputs],
               dynamic_shapes=module.dynamic_shapes, targets=["ort"], output_dir=out)
    torch.cuda.synchronize()
    return out


def make_inputs(seqs: list[int], hidden: int = 64, seed: int = 0) -> dict[int, np.ndarray]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {s: torch.randn(1, s, hidden, generator=g).numpy() for s in seqs}


def references(compiled, inputs: dict[int, np.ndarray]) -> tuple[dict[int, np.ndarray], dict[int, float]]:
    """compiled.run() per input (the bit-exact reference) and its max abs diff to eager."""
    import copy

    import torch

    from conftest import EXAMPLES, load_module

    eager = copy.deepcopy(load_module(EXAMPLES / "llama_block.py").model).cuda().eval()
    refs, eager_diff = {}, {}
    with torch.no_grad():
        for s, x in inputs.items():
            xc = torch.from_numpy(x).cuda()
            out = compiled.run(xc)
            refs[s] = out.cpu().numpy()
            eager_diff[s] = float((eager(xc) - out).abs().max())
    return refs, eager_diff


def time_native(compiled, inputs: dict[int, np.ndarray], count: int) -> dict:
    """compiled.run() over `count` calls cycling through the inputs, timed per call (synchronized),
    on GPU-resident inputs and with the host copies a served request pays (numpy in and out)."""
    import torch

    seqs = list(inputs)
    gpu = {s: torch.from_numpy(x).cuda() for s, x in inputs.items()}
    for s in seqs:  # warm-up
        compiled.run(gpu[s])
    torch.cuda.synchronize()
    result = {}
    for label, with_copies in (("run", False), ("run_with_host_copies", True)):
        latencies = []
        start = time.perf_counter()
        for r in range(count):
            s = seqs[r % len(seqs)]
            t0 = time.perf_counter()
            if with_copies:
                compiled.run(torch.from_numpy(inputs[s]).cuda()).cpu().numpy()
            else:
                compiled.run(gpu[s])
                torch.cuda.synchronize()
            latencies.append(time.perf_counter() - t0)
        result[label] = {"requests": count, **summarize(latencies, time.perf_counter() - start, count)}
    return result


# --- clients ---------------------------------------------------------------------------------

def _client(protocol: str, server):
    if protocol == "http":
        import tritonclient.http as module
        return module, module.InferenceServerClient(server.url, network_timeout=300.0)
    import tritonclient.grpc as module
    return module, module.InferenceServerClient(server.grpc_url)


def infer(module, client, protocol: str, x: np.ndarray, request_id: str) -> np.ndarray:
    tensor = module.InferInput(INPUT, list(x.shape), "FP32")
    extra = {"binary_data": True} if protocol == "http" else {}
    tensor.set_data_from_numpy(x, **extra)
    result = client.infer(MODEL, [tensor], outputs=[module.InferRequestedOutput(OUTPUT, **extra)],
                          request_id=request_id)
    return result.as_numpy(OUTPUT)


def load_test(server, protocol: str, inputs: dict[int, np.ndarray], refs: dict[int, np.ndarray],
              requests: int, clients: int) -> dict:
    """`clients` threads, one client each, send `requests` requests in all (request r uses input
    size r mod the number of sizes); every answer is compared byte for byte with its reference."""
    seqs = list(inputs)
    records: dict[int, dict] = {}
    lock = threading.Lock()
    connections = [_client(protocol, server) for _ in range(clients)]
    barrier = threading.Barrier(clients)

    def worker(k: int) -> None:
        module, client = connections[k]
        try:
            barrier.wait()
            for r in range(k, requests, clients):
                s = seqs[r % len(seqs)]
                t0 = time.perf_counter()
                try:
                    got = infer(module, client, protocol, inputs[s], f"{protocol}-{r}")
                except Exception as exc:  # counted and reported, never dropped
                    record = {"seq": s, "error": f"{type(exc).__name__}: {exc}"}
                else:
                    latency = time.perf_counter() - t0
                    ref = refs[s]
                    same = got.shape == ref.shape and got.dtype == ref.dtype and got.tobytes() == ref.tobytes()
                    diff = float(np.abs(got.astype(np.float64) - ref).max()) if got.shape == ref.shape else float("inf")
                    record = {"seq": s, "latency_s": latency, "bit_identical": same, "max_abs_diff": diff}
                with lock:
                    records[r] = record
        finally:
            client.close()

    threads = [threading.Thread(target=worker, args=(k,), name=f"{protocol}-client-{k}") for k in range(clients)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    answered = [r for r in records.values() if "error" not in r]
    errors = [r for r in records.values() if "error" in r]
    return {"protocol": protocol, "clients": clients, "requests": requests, "answered": len(answered),
            "errors": len(errors), "lost": requests - len(records),
            "bit_identical": sum(r["bit_identical"] for r in answered),
            "max_abs_diff": max((r["max_abs_diff"] for r in answered), default=None),
            "first_errors": [r["error"] for r in errors[:5]],
            **summarize([r["latency_s"] for r in answered], wall, len(answered))}


# --- the run ---------------------------------------------------------------------------------

def environment(server) -> dict:
    import onnxruntime
    import torch

    import kernel_lens

    meta = server.metadata()
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "gpu": torch.cuda.get_device_name(0), "python": sys.version.split()[0],
            "torch": torch.__version__, "onnxruntime": onnxruntime.__version__,
            "kernel_lens": kernel_lens.__version__, "tritonserver": meta.get("version")}


def run(args: argparse.Namespace) -> int:
    import torch

    import kernel_lens as kl
    from kernel_lens.serving import export_triton
    from kernel_lens.serving.tritonserver import TritonServer, find_install

    if not torch.cuda.is_available():
        print("bench_triton_server: needs a CUDA GPU (and onnxruntime-gpu, tritonclient, tritonserver)",
              file=sys.stderr)
        return 2
    out = Path(args.out).absolute()
    out.mkdir(parents=True, exist_ok=True)
    directory = Path(args.compiled) if args.compiled else compile_example(out / "compiled")
    compiled = kl.load(directory)
    seqs = [int(s) for s in args.seqs.split(",")]
    inputs = make_inputs(seqs)
    refs, eager_diff = references(compiled, inputs)

    export = export_triton(directory, out / "repo", name=MODEL, backend="python", instances=args.instances)
    shutil.rmtree(out / "server", ignore_errors=True)  # the launcher takes only an empty work folder
    server = TritonServer.start(export.model_dir.parent, install=find_install(args.root), work=out / "server",
                                wait=120.0)
    results: dict = {"model": MODEL, "compiled": str(directory), "seqs": seqs, "instances": args.instances,
                     "reference": "kernel_lens.load(DIR).run(x) in the benchmark process (bit-exact); "
                                  "eager forward compared for information only",
                     "eager_max_abs_diff": {str(s): d for s, d in eager_diff.items()}}
    try:
        results["env"] = environment(server)
        state = server.wait_models([MODEL], timeout=600.0)[MODEL]
        results["model_state"] = state
        if state["state"] != "READY":
            print(f"bench_triton_server: {MODEL} did not load: {state.get('reason')}", file=sys.stderr)
            return _finish(out, results, ok=False)
        for protocol in ("http", "grpc"):  # warm-up: every size once per protocol
            module, client = _client(protocol, server)
            for s, x in inputs.items():
                infer(module, client, protocol, x, f"warmup-{protocol}-{s}")
            client.close()
        results["served"] = {p: load_test(server, p, inputs, refs, args.requests, args.clients)
                             for p in ("http", "grpc")}
        results["native"] = time_native(compiled, inputs, args.requests)
    finally:
        server.stop()
    served = results["served"].values()
    ok = all(r["answered"] == r["requests"] == r["bit_identical"] and r["lost"] == 0 for r in served)
    return _finish(out, results, ok)


def _finish(out: Path, results: dict, ok: bool) -> int:
    results["ok"] = ok
    path = out / "triton_server.json"
    path.write_text(json.dumps(results, indent=1) + "\n")
    for name, r in results.get("served", {}).items():
        print(f"{name:5s} {r['answered']}/{r['requests']} answered, {r['bit_identical']} bit-identical, "
              f"{r['errors']} errors, {r['lost']} lost; {r['throughput_rps']:.1f} req/s, "
              f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")
    for name, r in results.get("native", {}).items():
        print(f"{name}: {r['throughput_rps']:.1f} calls/s, p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms")
    print(f"results: {path}")
    if results.get("served"):
        try:
            print(f"plot: {plot(path)}")
        except ImportError:
            print("plot: matplotlib is not installed here; run --plot on the JSON where it is")
    return 0 if ok else 1


def plot(path: str | Path) -> Path:
    """Latency (p50, p99) and throughput of HTTP, gRPC and compiled.run(), from the JSON."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(path).read_text())
    rows = [(f"tritonserver {'HTTP' if p == 'http' else 'gRPC'}", r) for p, r in data["served"].items()]
    rows += [(f"compiled.{name}()" if name == "run" else "compiled.run() + host copies", r)
             for name, r in data["native"].items()]
    labels = [label for label, _ in rows]
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 3.6))
    y = np.arange(len(rows))
    lat.barh(y - 0.2, [r["p50_ms"] for _, r in rows], height=0.4, label="p50")
    lat.barh(y + 0.2, [r["p99_ms"] for _, r in rows], height=0.4, label="p99")
    lat.set_yticks(y, labels, fontsize=8)
    lat.invert_yaxis()
    lat.set_xlabel("latency per request (ms)")
    lat.legend(fontsize=8)
    thr.barh(y, [r["throughput_rps"] for _, r in rows], color="#1f77b4")
    thr.set_yticks(y, labels, fontsize=8)
    thr.invert_yaxis()
    thr.set_xlabel("requests (calls) per second")
    env = data.get("env", {})
    served = next(iter(data["served"].values()))
    fig.suptitle(f"{data['model']}: {served['clients']} clients, {served['requests']} requests per protocol, "
                 f"seq {data['seqs']}; {env.get('gpu')}, tritonserver {env.get('tritonserver')}, "
                 f"onnxruntime {env.get('onnxruntime')}", fontsize=8)
    fig.tight_layout()
    png = Path(path).with_suffix(".png")
    fig.savefig(png, dpi=130)
    return png


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="output folder (results JSON, plot, exported repo, server log)")
    parser.add_argument("--compiled", default=None, help="compiled folder (default: compile the example)")
    parser.add_argument("--requests", type=int, default=200, help="requests per protocol (default 200)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    parser.add_argument("--instances", type=int, default=1, help="model instances on the GPU (default 1)")
    parser.add_argument("--seqs", default="16,64,128,256,512,1024", help="input sequence lengths to cycle")
    parser.add_argument("--root", default=None, help="unpacked nvidia-pytriton (default: fetch cache, "
                                                     "else an installed pytriton)")
    parser.add_argument("--plot", metavar="JSON", default=None, help="only plot an earlier run's JSON")
    args = parser.parse_args(argv)
    if args.plot:
        print(plot(args.plot))
        return 0
    if not args.out:
        parser.error("--out is required (unless --plot)")
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
