"""What kernel_lens's CUDA graph of ORT's ``Run`` holds, and what replaying it costs the host, with
and without ``CUBLAS_WORKSPACE_CONFIG`` set, beside a CUDA graph of eager PyTorch.

    python benchmarks/bench_graph_nodes.py --json graph_nodes.json [--tokens 8] [--config :4096:8 ...]

The fp16 LLaMA block of ``bench_decode.py`` (hidden 4096, FFN 11008, 32 heads) is compiled once
(target ort); then, for each ``--config`` value ("" = unset), a fresh process sets the variable
before CUDA starts, captures ``run(cuda_graph=True)`` on the runtime's static buffers and a CUDA
graph of eager, and reports: the node kinds of kernel_lens's graph
(``runtime.cuda_graph.node_kinds``: cuBLAS workspace allocated inside the capture shows as
``mem_alloc``/``mem_free`` nodes), the host microseconds of one bare replay of each graph (median
of 300, the GPU idle before each), the CUDA-event ms of one call of each, and whether kernel_lens's
output is the same with the setting as without it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def child(args) -> dict:
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_decode as B  # noqa: E402  (sys.path: src/, examples/)
    import llama_block as LB

    import kernel_lens as kl
    from kernel_lens.runtime.cuda_graph import node_kinds

    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        block = LB.LlamaBlock(**B.BLOCK_CONFIG, seed=0).to("cuda", torch.float16).eval()
        block.inv_freq = block.inv_freq.float()
    x = torch.randn(1, args.tokens, B.BLOCK_CONFIG["hidden"],
                    generator=torch.Generator().manual_seed(0)).to("cuda", torch.float16)
    compiled = kl.load(args.artifacts)
    runner = compiled.runner(cuda_graph=True)
    inputs, outputs = runner.cuda_graph_buffers(x)
    inputs[0].copy_(x)
    runner.run(*inputs, out=outputs)  # captures
    kl_graph = runner._last.captured
    eager = B.block_eager_cuda_graph(block, x, None)
    eager(x)
    eager_graph = eager.__closure__  # the closure holds the torch graph; find it
    graph = next(c.cell_contents for c in eager_graph if isinstance(c.cell_contents, torch.cuda.CUDAGraph))

    def host_us(replay) -> float:
        times = []
        for _ in range(300):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            replay()
            times.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
        return round(statistics.median(times), 1)

    def call_ms(fn) -> float:
        return round(statistics.median(B.time_calls(lambda _: fn(), x, 100)), 4)

    runner.run(*inputs, out=outputs)
    torch.cuda.synchronize()
    return {"config": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
            "kernel_lens_graph_nodes": node_kinds(kl_graph.raw_cuda_graph()),
            "kernel_lens_replay_host_us": host_us(kl_graph.replay),
            "eager_graph_replay_host_us": host_us(graph.replay),
            "kernel_lens_call_ms": call_ms(lambda: runner.run(*inputs, out=outputs)),
            "eager_graph_call_ms": call_ms(lambda: eager(x)),
            "output_sha": __import__("hashlib").sha256(
                outputs[0].cpu().view(torch.int16).numpy().tobytes()).hexdigest()[:16]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="graph_nodes.json")
    parser.add_argument("--tokens", type=int, default=8)
    parser.add_argument("--config", nargs="*", default=["", ":4096:8"])
    parser.add_argument("--artifacts", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        import torch

        with torch.cuda.stream(torch.cuda.Stream()):
            print(json.dumps(child(args)))
        return
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import bench_decode as B  # noqa: E402
    import llama_block as LB

    import kernel_lens as kl

    with torch.no_grad():
        block = LB.LlamaBlock(**B.BLOCK_CONFIG, seed=0).to("cuda", torch.float16).eval()
        block.inv_freq = block.inv_freq.float()
    x = torch.randn(1, args.tokens, B.BLOCK_CONFIG["hidden"]).to("cuda", torch.float16)
    folder = Path("kl_graph_nodes")
    kl.compile(block, (x,), dynamic_shapes=LB.dynamic_shapes, targets=["ort"], output_dir=folder)
    rows = []
    for config in args.config:
        env = dict(os.environ)
        env.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if config:
            env["CUBLAS_WORKSPACE_CONFIG"] = config
        out = subprocess.run([sys.executable, __file__, "--child", "--tokens", str(args.tokens),
                              "--artifacts", str(folder.resolve())], env=env, capture_output=True,
                             text=True, timeout=300)
        row = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else \
            {"config": config, "error": out.stderr[-2000:]}
        print(json.dumps(row), flush=True)
        rows.append(row)
    Path(args.json).write_text(json.dumps({"env": B.environment(argparse.Namespace(tokens=0), torch.float16)
                                           | {"tokens": args.tokens}, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
