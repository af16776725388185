"""Greedy decoding with a static KV cache (examples/llama_decode.py, size ``bench``) on one GPU:
per-token latency of eager PyTorch + Triton, a CUDA graph of eager, torch.compile
(mode="reduce-overhead"), kernel_lens ``run()`` and kernel_lens ``run(cuda_graph=True)`` with the
runner's static buffers, at batch 1 and 8, all in one process.

    python benchmarks/bench_decode.py --json decode_results.json --plot decode_results.png

The model (hidden 4096, 4 layers, 32/8 heads, FFN 11008, vocab 32000, max_len 256; random
weights from a seeded init) is built on the GPU in ``--dtype`` (fp16 by default). Its KV cache is
one ``[B, kv_heads, max_len, head_dim]`` tensor per layer and k/v (``caches``, the step's trailing
arguments), each written in place at ``position`` by one Triton launch (``kv_cache_write_kernel``);
the graph variants (CUDA graph of eager, torch.compile, kernel_lens CUDA graph) own their static
per-layer caches, which the loop hands back to them. kernel_lens
compiles it once (target ort, into ``--out-dir``) with a dynamic batch, from a batch-8 example;
when ``run()`` fails at some batch it is retried on a static compile for that batch
(``--per-batch-compile``: static compiles only), and ``run(cuda_graph=True)`` uses the compile
``run()`` worked with.

Each variant decodes an 8-token prompt (fed one token per step) and then ``--tokens`` (128)
greedy tokens through :func:`llama_decode.greedy_decode`: a warm-up loop, an untimed loop whose
logits are compared with eager's step by step (token match, first mismatching generated token,
max abs logit difference over the steps before it), then ``--rounds`` timed loops, interleaved
across the variants of a batch (the order rotates each round, so the GPU's clock and thermal
state weigh on all alike). Reported: the median over the generated tokens of each step's
CUDA-event time (``ms_per_token``), the median host time a step call takes to return
(``host_ms_per_step``: what the step costs the CPU), and the whole loop's CUDA-event time per
token, Python and argmax included (``loop_ms_per_token``). The loop copies each step's position
from the host (``torch.tensor([step], device=...)``), which waits for the previous step: every
variant is measured as a token-at-a-time decode loop, so a step's host time adds to its latency.
``--profile`` adds, per row, the GPU kernels of one call (torch.profiler: count, busy time, the
costliest kernels by name) and the host microseconds of one call of the step and of its parts
(``host_us``: the bare graph replay, the runner's call), so a gap between variants splits into
GPU work and host work.

The same run then measures the single-block rows (``block_rows`` in the JSON, a second panel in
the plot): examples/llama_block.py's ``LlamaBlock`` (Triton RMSNorm/RoPE/SwiGLU, causal SDPA) at
hidden 4096, 32 heads, FFN 11008, batch 1, in ``--dtype``, over ``--block-tokens`` (8 and 2048)
tokens, with the same five variants (kernel_lens compiles it once with the example's dynamic
``seq``, 2..2048). Reported: the median CUDA-event time of ``--block-iters`` calls, made in
``--rounds`` interleaved rounds (``ms``; the graph variants' copy of the input into their static
buffer included) and the max abs/rel difference from eager. ``--batches`` or ``--block-tokens`` with no values skips that part.

Every variant runs in its own try/except: a failure is recorded (``error``) and the run goes on.
TF32 is off everywhere. Writes the JSON after every row.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("KL_DECODE_SIZE", "tiny")  # the module-level model; the bench builds its own

import kernel_lens as kl  # noqa: E402
import llama_decode as D  # noqa: E402

VARIANTS = ["eager", "eager_cuda_graph", "torch_compile_reduce_overhead", "kernel_lens_run",
            "kernel_lens_run_cuda_graph", "kernel_lens_run_cuda_graph_ort"]
# kernel_lens_run_cuda_graph: cuda_graph=True (a torch CUDA graph of ORT's Run);
# kernel_lens_run_cuda_graph_ort: cuda_graph="ort" (ORT's own CUDA-graph mode).
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PROMPT_LEN = 8
PROFILE = False  # --profile: each row also gets the kernels of one call (kernel_profile)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(args, dtype) -> dict:
    import onnxruntime
    import transformers
    import triton

    return {"gpu": torch.cuda.get_device_name(), "driver": _driver(),
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "onnxruntime": onnxruntime.__version__, "transformers": transformers.__version__,
            "kernel_lens": getattr(kl, "__version__", None),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "config": D.SIZES["bench"], "dtype": str(dtype).removeprefix("torch."),
            "prompt_len": PROMPT_LEN, "tokens": args.tokens, "tf32": False}


# ----------------------------------------------------------------------------- step functions
# Each maker returns (step_fn, caches): step_fn has the step's signature
# step_fn(input_ids, position, *caches); caches are the per-layer (k_cache_0, v_cache_0, ...)
# tensors the loop must hand it (static buffers for the graph variants).


def make_eager(model, batch, example):
    return model, model.new_caches(batch)


def make_eager_cuda_graph(model, batch, example):
    ids = example[0].clone()
    position = torch.zeros(1, dtype=torch.int64, device=ids.device)
    caches = model.new_caches(batch)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up off the capture (Triton's JIT)
        for _ in range(3):
            model(ids, position, *caches)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        logits = model(ids, position, *caches)
    _reset(caches)

    def step(new_ids, new_position, *given):
        assert _same(given, caches), "the graph reads its own static caches"
        ids.copy_(new_ids)
        position.copy_(new_position)
        graph.replay()
        return logits

    step.parts = {"replay": graph.replay}
    return step, caches


def make_torch_compile(model, batch, example):
    caches = model.new_caches(batch)
    # static addresses: cudagraph trees then keep the graph though the caches are mutated
    for cache in caches:
        torch._dynamo.mark_static_address(cache)
    compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)

    def step(ids, position, *given):
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(ids, position, *given)

    return step, caches


def make_kl_run(compiled):
    def make(model, batch, example):
        return (lambda ids, position, *caches: compiled.run(ids, position, *caches,
                                                             cuda_graph=False),
                model.new_caches(batch))
    return make


def make_kl_cuda_graph(compiled, mode=True):
    def make(model, batch, example):
        runner = compiled.runner(cuda_graph=mode)
        caches = model.new_caches(batch)
        position = torch.zeros(1, dtype=torch.int64, device=caches[0].device)
        inputs, outputs = runner.cuda_graph_buffers(example[0], position, *caches)
        static_ids, static_pos, *static_caches = inputs
        static_caches = tuple(static_caches)
        _reset(static_caches)

        def step(ids, pos, *given):
            assert _same(given, static_caches), "the graph reads its own static caches"
            static_ids.copy_(ids)
            static_pos.copy_(pos)
            runner.run(*inputs, out=outputs)
            return outputs[0]

        def replay():  # the bare torch graph the runner replays (mode "torch")
            runner._last.captured.replay()

        step.parts = {"run": lambda: runner.run(*inputs, out=outputs)}
        if runner.graph_mode == "torch":
            step.parts["replay"] = replay
            step.graph = lambda: runner._last.captured
        return step, static_caches
    return make


# ----------------------------------------------------------------------------- measuring


def _reset(caches):
    for c in caches:
        c.zero_()


def _same(given, caches) -> bool:
    return len(given) == len(caches) and all(a is b for a, b in zip(given, caches))


def decode_timed(step_fn, prompt, tokens, caches) -> tuple[torch.Tensor, list[float], float, list[float]]:
    """One greedy loop with a CUDA-event pair around every step and around the whole loop; also
    the host (wall) time each step call takes to return, in ms."""
    events, host = [], []

    def timed_step(*args):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        out = step_fn(*args)
        host.append((time.perf_counter() - t0) * 1e3)
        end.record()
        events.append((start, end))
        return out

    first, last = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    first.record()
    out = D.greedy_decode(timed_step, prompt, tokens, caches)
    last.record()
    last.synchronize()
    steps = [s.elapsed_time(e) for s, e in events]
    return out, steps, first.elapsed_time(last) / len(steps), host


def kernel_profile(fn, iters: int = 5) -> dict:
    """The GPU side of ``iters`` calls of ``fn`` (torch.profiler, CUDA activity only), per call:
    kernels launched, GPU busy time (the sum of their durations), and the kernels that take the
    most time, by name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    by_name: dict[str, float] = {}
    for e in kernels:
        by_name[e.name] = by_name.get(e.name, 0.0) + e.device_time / 1e3
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {"kernels_per_call": len(kernels) / iters,
            "gpu_busy_ms_per_call": round(sum(by_name.values()) / iters, 4),
            "top_ms_per_call": [[name[:120], round(ms / iters, 4)] for name, ms in top]}


def compare(step_fn, prompt, tokens, caches, reference: list[torch.Tensor] | None,
            ref_tokens: torch.Tensor | None):
    """An untimed loop: its tokens and logits (all steps, fp32) or its agreement with eager's."""
    logits = []
    out = D.greedy_decode(step_fn, prompt, tokens, caches,
                          on_step=lambda step, lg: logits.append(lg.float().clone()))
    if reference is None:
        return out, logits, {}
    same = (out == ref_tokens).all(0)  # per generated token, over the batch
    mismatch = None if bool(same.all()) else int((~same).nonzero()[0])
    # steps whose inputs were identical: every prefill step, and generated steps before the first
    # mismatching token (its successor is fed a different token)
    valid = len(logits) if mismatch is None else PROMPT_LEN + mismatch
    diff = max(float((a - b).abs().max()) for a, b in zip(logits[:valid], reference[:valid]))
    return out, logits, {"tokens_match": mismatch is None, "first_mismatch": mismatch,
                         "max_abs_logit_diff": diff}


def prepare_variant(name, maker, model, batch, example, prompt, tokens, reference, ref_tokens):
    """Make the variant's step, warm it up (compiles, graph captures) and compare an untimed loop
    with eager's: (row, tokens, logits, step_fn, caches)."""
    row = {"batch": batch, "variant": name}
    t0 = time.perf_counter()
    step_fn, caches = maker(model, batch, example)
    with torch.no_grad():
        _reset(caches)
        D.greedy_decode(step_fn, prompt, min(tokens, 16), caches)
        row["setup_s"] = round(time.perf_counter() - t0, 1)
        _reset(caches)
        out, logits, agreement = compare(step_fn, prompt, tokens, caches, reference, ref_tokens)
    row.update(agreement)
    return row, out, logits, step_fn, caches


def host_parts(step_fn, prompt, caches, iters: int = 200) -> dict:
    """Host (wall) microseconds of one call of each part of a graph variant's step (the step
    itself, and what ``step_fn.parts`` names: the bare graph replay, the runner's call), each
    timed alone with the GPU idle before it: the median of ``iters`` calls."""
    position = torch.tensor([PROMPT_LEN], dtype=torch.int64, device=prompt.device)
    ids = prompt[:, :1].contiguous()
    parts = {"step": lambda: step_fn(ids, position, *caches), **getattr(step_fn, "parts", {})}
    out = {}
    for name, fn in parts.items():
        times = []
        for _ in range(iters):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e6)
        out[name] = round(statistics.median(times), 1)
    torch.cuda.synchronize()
    return out


def host_trace(fn, iters: int = 20) -> list:
    """The host side of ``iters`` calls of ``fn`` (torch.profiler, CPU and CUDA activity): the
    operators and CUDA API calls that take the most CPU time, in microseconds per call."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
            torch.cuda.synchronize()
    host = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CPU
            and e.key != "cudaDeviceSynchronize" and e.key != "cudaStreamSynchronize"]
    host.sort(key=lambda e: -e.self_cpu_time_total)
    return [[e.key[:80], round(e.self_cpu_time_total / iters, 1), e.count // iters] for e in host[:10]]


def time_variants(prepared: list, prompt, tokens: int, rounds: int) -> None:
    """The timed loops, ``rounds`` per variant, interleaved (variant order rotating each round) so
    that the GPU's clock and thermal state weigh on every variant alike; the rows get the medians
    over all rounds' generated tokens."""
    steps = {id(p): [] for p in prepared}
    host = {id(p): [] for p in prepared}
    loops = {id(p): [] for p in prepared}
    with torch.no_grad():
        for r in range(rounds):
            for p in prepared[r % len(prepared):] + prepared[:r % len(prepared)]:
                row, out, step_fn, caches = p
                _reset(caches)
                timed_out, s, loop, h = decode_timed(step_fn, prompt, tokens, caches)
                steps[id(p)] += s[PROMPT_LEN - 1:]  # the steps whose output is a generated token
                host[id(p)] += h[PROMPT_LEN - 1:]
                loops[id(p)].append(loop)
                row["timed_run_same_tokens"] = row.get("timed_run_same_tokens", True) and \
                    bool(torch.equal(timed_out, out))
        for p in prepared:
            row, out, step_fn, caches = p
            generated = steps[id(p)]
            loop = statistics.median(loops[id(p)])
            row.update(ms_per_token=round(statistics.median(generated), 4),
                       ms_per_token_p90=round(sorted(generated)[int(0.9 * (len(generated) - 1))], 4),
                       host_ms_per_step=round(statistics.median(host[id(p)]), 4),
                       loop_ms_per_token=round(loop, 4), tokens_per_s_per_seq=round(1000.0 / loop, 1),
                       rounds=rounds)
            if PROFILE:  # one step at the position after the prompt: its GPU kernels, host parts
                position = torch.tensor([PROMPT_LEN], dtype=torch.int64, device=prompt.device)
                ids = prompt[:, :1].contiguous()
                row["profile"] = kernel_profile(lambda: step_fn(ids, position, *caches))
                row["host_us"] = host_parts(step_fn, prompt, caches)
                row["host_trace_us"] = host_trace(lambda: step_fn(ids, position, *caches))
                if getattr(step_fn, "graph", None) is not None:  # what the replayed graph holds
                    from kernel_lens.runtime.cuda_graph import node_kinds
                    row["graph_nodes"] = node_kinds(step_fn.graph().raw_cuda_graph())


def kl_compile(model, batch, dtype_name, out_dir: Path, dynamic: bool, env: dict):
    example = D.make_inputs(model, batch, position=PROMPT_LEN, device="cuda")
    folder = out_dir / (f"dynamic_b{batch}_{dtype_name}" if dynamic else f"static_b{batch}_{dtype_name}")
    t0 = time.perf_counter()
    shapes = D.dynamic_shapes_for(batch, model.n_layers) if dynamic else None
    compiled = kl.compile(model, example, dynamic_shapes=shapes, roles=D.roles, targets=["ort"],
                          output_dir=folder)
    env.setdefault("kernel_lens_compile_s", {})[folder.name] = round(time.perf_counter() - t0, 1)
    print(f"kernel_lens compile {folder.name}: {env['kernel_lens_compile_s'][folder.name]} s", flush=True)
    return compiled


def run_decode(args, dtype, env: dict, result: dict, save: Callable[[], None]) -> None:
    """The decode table: every variant at every batch, rows appended to ``result["rows"]``."""
    with torch.device("cuda"):  # the random init runs on the GPU
        model = D.LlamaDecodeStep("bench", seed=0)
    model = model.to(dtype).eval()
    if PROMPT_LEN + args.tokens - 1 > model.max_len:
        raise SystemExit(f"{PROMPT_LEN} + {args.tokens} tokens do not fit max_len {model.max_len}")
    out_dir = Path(args.out_dir)

    compiled_by_batch: dict[int, object] = {}
    if not args.per_batch_compile and any(v.startswith("kernel_lens") for v in args.variants):
        try:
            shared = kl_compile(model, max(max(args.batches), 2), args.dtype, out_dir, True, env)
            compiled_by_batch = {b: shared for b in args.batches}
        except Exception as exc:  # noqa: BLE001 - recorded, the other variants still run
            result["errors"]["kernel_lens_compile_dynamic"] = f"{type(exc).__name__}: {exc}"[:2000]
            traceback.print_exc()

    static_by_batch: dict[int, object] = {}  # a compile that failed is not tried again

    def kl_model(batch: int):
        if batch not in static_by_batch:
            try:
                static_by_batch[batch] = kl_compile(model, batch, args.dtype, out_dir, False, env)
            except Exception as exc:  # noqa: BLE001
                static_by_batch[batch] = exc
        if isinstance(static_by_batch[batch], Exception):
            raise static_by_batch[batch]
        return static_by_batch[batch]

    used: dict[int, str] = {}  # batch -> the compile kernel_lens_run ran on
    for batch in args.batches:
        g = torch.Generator().manual_seed(batch)
        prompt = torch.randint(0, model.config.vocab_size, (batch, PROMPT_LEN), generator=g).cuda()
        example = D.make_inputs(model, batch, position=PROMPT_LEN, device="cuda")
        reference = ref_tokens = None
        prepared: list = []  # (row, tokens, step_fn, caches) of every variant that works
        rows: list = []
        makers: dict[str, Callable] = {
            "eager": make_eager, "eager_cuda_graph": make_eager_cuda_graph,
            "torch_compile_reduce_overhead": make_torch_compile,
        }
        for name in ["eager"] + [v for v in args.variants if v != "eager"]:
            if name == "kernel_lens_run":  # the dynamic-batch compile, else a static one
                attempts = [] if batch not in compiled_by_batch else \
                    [("dynamic batch", lambda: make_kl_run(compiled_by_batch[batch]))]
                attempts.append(("static", lambda: make_kl_run(kl_model(batch))))
            elif name.startswith("kernel_lens_run_cuda_graph"):  # the compile run() worked with
                label = used.get(batch, "dynamic batch" if batch in compiled_by_batch else "static")
                mode = "ort" if name.endswith("_ort") else True
                attempts = [(label, lambda label=label, mode=mode: make_kl_cuda_graph(
                    compiled_by_batch[batch] if label == "dynamic batch" else kl_model(batch), mode))]
            else:
                attempts = [(None, lambda name=name: makers[name])]
            row, errors = {"batch": batch, "variant": name}, {}
            for label, get_maker in attempts:
                try:
                    row, out, logits, step_fn, caches = prepare_variant(
                        name, get_maker(), model, batch, example, prompt, args.tokens, reference,
                        ref_tokens)
                    if label is not None:
                        row["kernel_lens_compile"] = label
                        used.setdefault(batch, label)
                    if name == "eager":
                        reference, ref_tokens = logits, out
                        row.update(tokens_match=True, first_mismatch=None, max_abs_logit_diff=0.0)
                    prepared.append((row, out, step_fn, caches))
                    break
                except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                    traceback.print_exc()
                    errors[label or "error"] = f"{type(exc).__name__}: {exc}"[:2000]
                finally:
                    torch.cuda.synchronize()
            if errors:
                row["error" if not any(p[0] is row for p in prepared) else "earlier_errors"] = errors
            rows.append(row)
        try:
            time_variants(prepared, prompt, args.tokens, args.rounds)
        except Exception as exc:  # noqa: BLE001 - recorded
            traceback.print_exc()
            result["errors"][f"decode_timing_b{batch}"] = f"{type(exc).__name__}: {exc}"[:2000]
        for row in rows:
            _record(result["rows"], row, "batch", "ms_per_token")
        save()
        del reference, prepared
        torch.cuda.empty_cache()


# ----------------------------------------------------------------------------- single block
# examples/llama_block.py's LlamaBlock (Triton RMSNorm/RoPE/SwiGLU, causal SDPA) at the issue's
# size, batch 1, one forward over ``tokens`` positions. Each maker returns fn(x) -> out.

BLOCK_CONFIG = dict(hidden=4096, n_heads=32, intermediate=11008)


def block_eager(block, x, compiled):
    return block


def block_eager_cuda_graph(block, x, compiled):
    static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():  # warm-up off the capture (Triton's JIT)
        for _ in range(3):
            block(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = block(static_x)

    def fn(new_x):
        static_x.copy_(new_x)
        graph.replay()
        return out

    return fn


def block_torch_compile(block, x, compiled):
    fn = torch.compile(block, mode="reduce-overhead", dynamic=False)

    def step(new_x):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(new_x)

    return step


def _record(rows: list, row: dict, size: str, ms: str) -> None:
    """Append ``row``, with its speed-up over the eager row of the same ``size``, and print it."""
    eager = next((r for r in rows if r[size] == row[size] and r["variant"] == "eager" and ms in r), None)
    if ms in row and eager and row["variant"] != "eager":
        row["speedup_vs_eager"] = round(eager[ms] / row[ms], 3)
    print(json.dumps(row), flush=True)
    rows.append(row)


def block_kl_run(block, x, compiled):
    return lambda new_x: compiled.run(new_x, cuda_graph=False)


def block_kl_cuda_graph(block, x, compiled, mode=True):
    runner = compiled.runner(cuda_graph=mode)
    inputs, outputs = runner.cuda_graph_buffers(x)

    def fn(new_x):
        inputs[0].copy_(new_x)
        runner.run(*inputs, out=outputs)
        return outputs[0]

    return fn


BLOCK_MAKERS = {"eager": block_eager, "eager_cuda_graph": block_eager_cuda_graph,
                "torch_compile_reduce_overhead": block_torch_compile,
                "kernel_lens_run": block_kl_run, "kernel_lens_run_cuda_graph": block_kl_cuda_graph,
                "kernel_lens_run_cuda_graph_ort":
                    lambda block, x, compiled: block_kl_cuda_graph(block, x, compiled, "ort")}


def time_calls(fn, x, iters: int) -> list[float]:
    """CUDA-event time of each of ``iters`` calls (input copy into static buffers included)."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def run_block(args, dtype, env: dict, result: dict, save: Callable[[], None]) -> None:
    """The single-block rows: every variant at every token count, into ``result["block_rows"]``;
    kernel_lens compiles once with the example's dynamic ``seq`` (2..2048)."""
    import llama_block as LB

    env["block"] = dict(BLOCK_CONFIG, tokens=args.block_tokens, iters=args.block_iters, batch=1)
    with torch.no_grad():
        block = LB.LlamaBlock(**BLOCK_CONFIG, seed=0)
        block = block.to("cuda", dtype).eval()
        block.inv_freq = block.inv_freq.float()  # the RoPE angles stay fp32
    result.setdefault("block_rows", [])
    compiled, compile_error = None, None
    if any(v.startswith("kernel_lens") for v in args.variants):
        try:
            g = torch.Generator().manual_seed(7)
            example = (torch.randn(1, min(args.block_tokens), BLOCK_CONFIG["hidden"], generator=g)
                       .to("cuda", dtype),)
            t0 = time.perf_counter()
            compiled = kl.compile(block, example, dynamic_shapes=LB.dynamic_shapes, targets=["ort"],
                                  output_dir=Path(args.out_dir) / f"block_dynamic_seq_{args.dtype}")
            env.setdefault("kernel_lens_compile_s", {})["block"] = round(time.perf_counter() - t0, 1)
        except Exception as exc:  # noqa: BLE001 - the other variants still run
            traceback.print_exc()
            compile_error = f"{type(exc).__name__}: {exc}"[:2000]
            result["errors"]["kernel_lens_compile_block"] = compile_error
            save()
    for tokens in args.block_tokens:
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(1, tokens, BLOCK_CONFIG["hidden"], generator=g).to("cuda", dtype)
        with torch.no_grad():
            want = block(x).float()
        rows, fns = [], []
        for name in ["eager"] + [v for v in args.variants if v != "eager"]:
            row = {"model": "llama_block", "tokens": tokens, "variant": name}
            rows.append(row)
            try:
                if name.startswith("kernel_lens") and compiled is None:
                    raise RuntimeError(f"no kernel_lens compile: {compile_error}")
                t0 = time.perf_counter()
                with torch.no_grad():
                    fn = BLOCK_MAKERS[name](block, x, compiled)
                    for _ in range(5):  # warm-up (compiles, captures graphs)
                        fn(x)
                    torch.cuda.synchronize()
                    row["setup_s"] = round(time.perf_counter() - t0, 1)
                    got = fn(x).float()
                    diff = (got - want).abs()
                    row.update(max_abs_diff=float(diff.max()),
                               max_rel_diff=float(diff.max() / want.abs().max()))
                fns.append((row, fn))
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            finally:
                torch.cuda.synchronize()
        # timed calls in rounds, variants interleaved (order rotating), as for decode
        times: dict[int, list[float]] = {id(row): [] for row, _ in fns}
        per_round = max(1, args.block_iters // args.rounds)
        with torch.no_grad():
            for r in range(args.rounds):
                for row, fn in fns[r % len(fns):] + fns[:r % len(fns)]:
                    try:
                        times[id(row)] += time_calls(fn, x, per_round)
                    except Exception as exc:  # noqa: BLE001
                        traceback.print_exc()
                        row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            for row, fn in fns:
                t = times[id(row)]
                if "error" in row or not t:
                    continue
                row.update(ms=round(statistics.median(t), 4),
                           ms_p90=round(sorted(t)[int(0.9 * (len(t) - 1))], 4),
                           tokens_per_s=round(tokens * 1000.0 / statistics.median(t), 1),
                           rounds=args.rounds)
                if PROFILE:
                    row["profile"] = kernel_profile(lambda: fn(x))
        for row in rows:
            _record(result["block_rows"], row, "tokens", "ms")
        save()
        del fns
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="decode_results.json")
    parser.add_argument("--plot", default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8],
                        help="decode batches (none: no decode table)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--out-dir", default="kl_decode_bench", help="kernel_lens artifacts")
    parser.add_argument("--per-batch-compile", action="store_true",
                        help="compile kernel_lens per batch (static shapes)")
    parser.add_argument("--variants", nargs="+", default=VARIANTS, choices=VARIANTS)
    parser.add_argument("--block-tokens", type=int, nargs="*", default=[8, 2048],
                        help="token counts of the single-block rows (none: no block rows)")
    parser.add_argument("--block-iters", type=int, default=60, help="timed calls per block row")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per row, variants interleaved (decode: one loop each)")
    parser.add_argument("--profile", action="store_true",
                        help="add each row's GPU kernels per call (torch.profiler) to the JSON")
    args = parser.parse_args()
    global PROFILE
    PROFILE = args.profile

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[args.dtype]
    env = environment(args, dtype)
    result = {"env": env, "rows": [], "errors": {}}

    def save():
        Path(args.json).write_text(json.dumps(result, indent=1))

    if args.batches:
        try:
            run_decode(args, dtype, env, result, save)
        except Exception as exc:  # noqa: BLE001 - the block rows still run
            traceback.print_exc()
            result["errors"]["decode"] = f"{type(exc).__name__}: {exc}"[:2000]
            save()
        torch.cuda.empty_cache()
    if args.block_tokens:
        try:
            run_block(args, dtype, env, result, save)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            result["errors"]["block"] = f"{type(exc).__name__}: {exc}"[:2000]
            save()

    save()
    if args.plot:
        try:
            plot(result, args.plot)
        except Exception as exc:  # noqa: BLE001
            result["errors"]["plot"] = f"{type(exc).__name__}: {exc}"
            save()
    print(json.dumps(result, indent=1))


def _bars(ax, rows, groups, key, label, value_key):
    """Grouped bars: one group per variant, one bar per ``key`` value (batch or tokens)."""
    variants = [v for v in VARIANTS if any(r["variant"] == v for r in rows)]
    width = 0.8 / max(len(groups), 1)
    for j, group in enumerate(groups):
        values = []
        for v in variants:
            row = next((r for r in rows if r[key] == group and r["variant"] == v), {})
            values.append(row.get(value_key) or 0.0)
        xs = [i + (j - (len(groups) - 1) / 2) * width for i in range(len(variants))]
        ax.bar(xs, values, width, label=label(group))
        for x, value in zip(xs, values):
            ax.text(x, value, f"{value:.2f}" if value else "failed", ha="center", va="bottom",
                    fontsize=7)
    ax.set_xticks(range(len(variants)))
    ax.set_xticklabels([v.replace("_", "\n") for v in variants], fontsize=8)
    ax.legend(fontsize=8)


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env = result["env"]
    rows, block_rows = result.get("rows", []), result.get("block_rows", [])
    panels = [p for p in ("decode", "block") if {"decode": rows, "block": block_rows}[p]]
    if not panels:
        return
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 4.5 * len(panels)), squeeze=False)
    for ax, panel in zip(axes[:, 0], panels):
        if panel == "decode":
            _bars(ax, rows, sorted({r["batch"] for r in rows}), "batch", lambda b: f"batch {b}",
                  "ms_per_token")
            ax.set_ylabel("ms per token (median)")
            ax.set_title(f"LLaMA decode step, static KV cache ({env['dtype']}, hidden 4096, "
                         f"4 layers, {env['tokens']} greedy tokens) on {env['gpu']}", fontsize=9)
        else:
            tokens = sorted({r["tokens"] for r in block_rows})
            _bars(ax, block_rows, tokens, "tokens", lambda t: f"{t} tokens", "ms")
            ax.set_yscale("log")
            ax.set_ylabel("ms per forward (median, log)")
            ax.set_title(f"One LLaMA block (examples/llama_block.py, {env['dtype']}, hidden 4096, "
                         f"FFN 11008, batch 1) on {env['gpu']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    with torch.cuda.stream(torch.cuda.Stream()):  # ORT runs on torch's current (non-default) stream
        main()
