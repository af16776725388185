"""Greedy decoding with a static KV cache (examples/llama_decode.py, size ``bench``) on one GPU:
per-token latency, throughput and HBM use of eager PyTorch + Triton, a CUDA graph of eager,
torch.compile (modes "reduce-overhead" and "max-autotune") and kernel_lens (``run()``,
``run(cuda_graph=True)``) at each graph-optimization level, over several KV-cache lengths and
batches, all in one process.

    python benchmarks/bench_decode.py --json decode_results.json --plot decode_results.png
    python benchmarks/decode_table.py decode_results.json        # the README's Markdown tables

The model (hidden 4096, 4 layers, 32/8 heads, FFN 11008, vocab 32000; random weights from a
seeded init, the same at every context) is built on the GPU in ``--dtype`` (fp16 by default), once
per ``--contexts`` value (256 and 4096), which is the length ``max_len`` of its static KV cache.
The cache is one ``[B, kv_heads, max_len, head_dim]`` tensor per layer and k/v (``caches``, the
step's trailing arguments), each written in place at ``position`` by one Triton launch
(``kv_cache_write_kernel``); every step attends over the whole cache, the positions after
``position`` masked, so every step of the loop costs what a step at the end of a ``max_len``
context costs. The graph variants (CUDA graph of eager, torch.compile, kernel_lens CUDA graph)
own their static per-layer caches, which the loop hands back to them.

Rows come in (context, batch) groups (``--batches``: 1, 8, 32), each with these variants:
- anchors (``--variants``): ``eager`` (always; the reference), ``eager_cuda_graph``,
  ``torch_compile_reduce_overhead`` and ``torch_compile_max_autotune`` (torch.compile with
  ``dynamic=False`` and the caches marked static addresses; max-autotune only at
  ``--max-autotune-batches``, by default every batch: its compiles take minutes);
- kernel_lens (``--kl-variants``: ``kernel_lens_run``, ``kernel_lens_run_cuda_graph``; the
  ``kernel_lens_run_cuda_graph_ort`` graph mode when asked) at each ``--opt-levels`` level
  (``kl.compile(..., optimize=level)``: 0 no graph optimizations, 1 the default ones), named
  ``<variant>_o<level>``, the level also in ``opt_level``. kernel_lens compiles once per context
  and level (target ort, each into its own folder under ``--out-dir``) with a dynamic batch, from a
  batch-8 example; when ``run()`` fails at some batch it is retried on a static compile for that
  batch (``--per-batch-compile``: static compiles only), and the CUDA-graph variants use the
  compile ``run()`` worked with.

Each variant decodes an 8-token prompt (fed one token per step) and then ``--tokens`` (128)
greedy tokens through :func:`llama_decode.greedy_decode`: a warm-up loop, an untimed loop whose
logits are compared with eager's step by step (token match, first mismatching generated token,
max abs logit difference over the steps before it), then ``--rounds`` timed loops, interleaved
across the variants of a group (the order rotates each round, so the GPU's clock and thermal
state weigh on all alike). Reported per row: the median over the generated tokens of each step's
CUDA-event time (``ms_per_token``), the median host time a step call takes to return
(``host_ms_per_step``: what the step costs the CPU), the whole loop's CUDA-event time per token,
Python and argmax included (``loop_ms_per_token``), and from it ``tokens_per_s_per_seq`` and
``tokens_per_s`` (times the batch); ``setup_s`` (making the variant and its warm-up loop:
torch.compile's compiles, graph captures; kernel_lens compiles are timed apart, in
``env["kernel_lens_compile_s"]``); ``bytes_per_step``, the least a step must read from HBM (every
parameter except the embedding table, of which only the batch's rows, plus the whole KV cache:
2 x layers x batch x kv_heads x max_len x head_dim x element size; counted on the model; the cache
write and activations are left out); ``hbm_fraction`` = bytes_per_step / ms_per_token / the peak
HBM bandwidth (``--hbm-peak-tbs``, else the datasheet figure for the GPU's name, ``HBM_PEAK_TBS``;
for an unknown GPU null, and ``env["hbm_peak_source"]`` says why); ``speedup_vs_eager``. The loop
copies each step's position from the host (``torch.tensor([step], device=...)``), which waits for
the previous step: every variant is measured as a token-at-a-time decode loop, so a step's host
time adds to its latency. ``--profile`` adds, per row, the GPU kernels of one call
(torch.profiler: count, busy time, the costliest kernels by name) and the host microseconds of one
call of the step and of its parts (``host_us``: the bare graph replay, the runner's call), so a
gap between variants splits into GPU work and host work.

The same run then measures the single-block rows (``block_rows`` in the JSON, the last panel of
the plot): examples/llama_block.py's ``LlamaBlock`` (Triton RMSNorm/RoPE/SwiGLU, causal SDPA) at
hidden 4096, 32 heads, FFN 11008, batch 1, in ``--dtype``, over ``--block-tokens`` (8 and 2048)
tokens, with the anchors but max-autotune and the kernel_lens variants at every level (kernel_lens
compiles once per level with the example's dynamic ``seq``, 2..2048). Reported: the median
CUDA-event time of ``--block-iters`` calls, made in ``--rounds`` interleaved rounds (``ms``; the
graph variants' copy of the input into their static buffer included) and the max abs/rel
difference from eager. ``--batches`` or ``--block-tokens`` with no values skips that part.

``--time-budget-s`` bounds a run (a GPU command may have a hard time limit): a row, or a
kernel_lens compile, whose setup would end past the budget (judged by the last one of its kind)
is not started and is named in ``result["skipped"]``; a group whose eager row is skipped is skipped
whole. What has started finishes, so leave a minute for the last group's timed rounds.
Every variant runs in its own try/except: a failure is recorded (``error``) and the run goes on.
Between groups the variants' caches, graphs and compiled code are freed. TF32 is off everywhere.
Writes the JSON after every row; ``--merge`` instead merges earlier runs' JSONs (a run split
across commands) into ``--json`` and ``--plot``, without a GPU.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch
import transformers
import triton

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("KL_DECODE_SIZE", "tiny")  # the module-level model; the bench builds its own

import decode_table as T  # noqa: E402  (this folder: names, order and labels of the variants)
import kernel_lens as kl  # noqa: E402
import llama_block as LB  # noqa: E402
import llama_decode as D  # noqa: E402

log = logging.getLogger("bench_decode")

ANCHORS = T.ANCHORS
KL_VARIANTS = T.KL_VARIANTS
# kernel_lens_run_cuda_graph: cuda_graph=True (a torch CUDA graph of ORT's Run);
# kernel_lens_run_cuda_graph_ort: cuda_graph="ort" (ORT's own CUDA-graph mode).
DEFAULT_KL_VARIANTS = KL_VARIANTS[:2]
BLOCK_ANCHORS = ANCHORS[:3]  # max-autotune is a decode anchor: its compiles cost minutes
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
PROMPT_LEN = 8
KL_EXAMPLE_BATCH = 8  # the dynamic-batch compile's example batch (as in the earlier runs)
HBM_PEAK_TBS = T.HBM_PEAK_TBS  # peak HBM TB/s by GPU name (decode_table.py)
hbm_peak = T.hbm_peak
PROFILE = False  # --profile: each row also gets the kernels of one call (kernel_profile)


def _driver() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(args, dtype) -> dict:
    """The machine, the versions and the model's config (bench_block_lowering.py and
    bench_graph_nodes.py call it too, with only ``args.tokens``)."""
    import onnxruntime  # noqa: PLC0415 - for its version only; kernel_lens loads it when it runs

    return {"gpu": torch.cuda.get_device_name(), "driver": _driver(),
            "cuda": torch.version.cuda, "torch": torch.__version__, "triton": triton.__version__,
            "onnxruntime": onnxruntime.__version__, "transformers": transformers.__version__,
            "kernel_lens": getattr(kl, "__version__", None),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "config": D.SIZES["bench"], "dtype": str(dtype).removeprefix("torch."),
            "prompt_len": PROMPT_LEN, "tokens": args.tokens, "tf32": False}


def decode_environment(args, dtype) -> dict:
    """``environment`` plus this run's settings and the peak HBM bandwidth it divides by."""
    env = environment(args, dtype)
    peak, source = hbm_peak(env["gpu"], args.hbm_peak_tbs)
    env["config"] = {k: v for k, v in env["config"].items() if k != "max_len"}  # see contexts
    return env | {"contexts": args.contexts, "batches": args.batches, "rounds": args.rounds,
                  "variants": ["eager"] + [v for v in args.variants if v != "eager"],
                  "max_autotune_batches": args.max_autotune_batches,
                  "kl_variants": args.kl_variants, "opt_levels": args.opt_levels,
                  "kl_example_batch": KL_EXAMPLE_BATCH, "hbm_peak_tbs": peak,
                  "hbm_peak_source": source, "time_budget_s": args.time_budget_s or None}


# ----------------------------------------------------------------------------- time budget


class BudgetSpent(Exception):
    """Work not started because ``--time-budget-s`` would be spent (named in ``skipped``)."""


class Budget:
    """``--time-budget-s``: a piece of work starts only if the time so far plus the last duration
    of its kind (a kernel_lens compile, a max-autotune setup; 0 for a kind not seen yet) fits the
    budget, so that one long compile does not run past it; what does not start is appended to
    ``skipped``. No budget (0): everything starts."""

    def __init__(self, seconds: float, skipped: list):
        self.seconds, self.skipped = seconds, skipped
        self.start = time.perf_counter()
        self.last: dict[str, float] = {}
        self._named: set[str] = set()  # a compile that several rows need is named once

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def allows(self, kind: str, where: dict) -> bool:
        if not self.seconds or self.elapsed() + self.last.get(kind, 0.0) <= self.seconds:
            return True
        self.skip(where)
        return False

    def skip(self, where: dict) -> None:
        key = json.dumps(where, sort_keys=True)
        if key not in self._named:
            self._named.add(key)
            self.skipped.append(dict(where, after_s=round(self.elapsed(), 1)))

    def took(self, kind: str, seconds: float) -> None:
        self.last[kind] = seconds


# ----------------------------------------------------------------------------- step functions
# Each maker returns (step_fn, caches): step_fn has the step's signature
# step_fn(input_ids, position, *caches); caches are the per-layer (k_cache_0, v_cache_0, ...)
# tensors the loop must hand it (static buffers for the graph variants). ``ids`` is an example
# [B, 1] token batch for the captures.


def make_eager(model, batch, ids):
    return model, model.new_caches(batch)


def make_eager_cuda_graph(model, batch, ids):
    ids = ids.clone()
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


def make_torch_compile(mode: str):
    def make(model, batch, ids):
        caches = model.new_caches(batch)
        # static addresses: cudagraph trees then keep the graph though the caches are mutated
        for cache in caches:
            torch._dynamo.mark_static_address(cache)
        compiled = torch.compile(model, mode=mode, dynamic=False)

        def step(ids, position, *given):
            torch.compiler.cudagraph_mark_step_begin()
            return compiled(ids, position, *given)

        return step, caches
    return make


DECODE_MAKERS = {"eager": make_eager, "eager_cuda_graph": make_eager_cuda_graph,
                 "torch_compile_reduce_overhead": make_torch_compile("reduce-overhead"),
                 "torch_compile_max_autotune": make_torch_compile("max-autotune")}


def make_kl_run(compiled):
    def make(model, batch, ids):
        return (lambda ids, position, *caches: compiled.run(ids, position, *caches,
                                                             cuda_graph=False),
                model.new_caches(batch))
    return make


def make_kl_cuda_graph(compiled, mode=True):
    def make(model, batch, ids):
        runner = compiled.runner(cuda_graph=mode)
        caches = model.new_caches(batch)
        position = torch.zeros(1, dtype=torch.int64, device=caches[0].device)
        inputs, outputs = runner.cuda_graph_buffers(ids, position, *caches)
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


def _free() -> None:
    """Give back what a finished group held (its variants' caches, graphs, compiled code): the
    next group's caches need the room (one set is 2 GB at batch 32 and 4096 positions).
    ``torch._dynamo.reset`` also drops the cudagraph trees' pools, and keeps dynamo below its
    recompile limit as (context, batch) groups add up."""
    gc.collect()
    torch._dynamo.reset()
    torch.cuda.empty_cache()


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
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - --profile only

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


def prepare_variant(row, maker, model, batch, ids, prompt, tokens, reference, ref_tokens):
    """Make the variant's step, warm it up (compiles, graph captures; ``row["setup_s"]``) and
    compare an untimed loop with eager's (into ``row``): (tokens, logits, step_fn, caches)."""
    t0 = time.perf_counter()
    step_fn, caches = maker(model, batch, ids)
    with torch.no_grad():
        _reset(caches)
        D.greedy_decode(step_fn, prompt, min(tokens, 16), caches)
        row["setup_s"] = round(time.perf_counter() - t0, 1)
        _reset(caches)
        out, logits, agreement = compare(step_fn, prompt, tokens, caches, reference, ref_tokens)
    row.update(agreement)
    return out, logits, step_fn, caches


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
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415 - --profile only

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
                    from kernel_lens.runtime.cuda_graph import node_kinds  # noqa: PLC0415

                    row["graph_nodes"] = node_kinds(step_fn.graph().raw_cuda_graph())


# ----------------------------------------------------------------------------- HBM traffic


def bytes_per_step(model, batch: int) -> int:
    """The bytes one decode step must read from HBM at least: every parameter once, except the
    embedding table, of which only the batch's rows (one token each); and the whole KV cache,
    since attention runs over all ``max_len`` positions (the mask only hides the later ones).
    The cache write (one position) and the activations are left out: well under 0.1 %."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # shared ones once
    embed = model.hf.model.embed_tokens.weight
    if embed is not model.hf.lm_head.weight:  # tied: the LM head reads the whole table anyway
        weights -= embed.numel() * embed.element_size()
        weights += batch * embed.shape[1] * embed.element_size()
    cache_elements = 2 * model.n_layers * torch.Size(model.cache_shape(batch)).numel()
    return weights + cache_elements * model.hf.lm_head.weight.element_size()


def add_throughput(row: dict, batch: int, step_bytes: int, peak_tbs: float | None) -> None:
    """tokens/s over the whole batch, the step's minimum bytes and their share of the peak HBM
    bandwidth at the row's ms/token (null without a peak)."""
    row["bytes_per_step"] = step_bytes
    if "tokens_per_s_per_seq" in row:
        row["tokens_per_s"] = round(batch * row["tokens_per_s_per_seq"], 1)
    if "ms_per_token" in row:
        row["hbm_fraction"] = None if not peak_tbs else \
            round(step_bytes / (row["ms_per_token"] * 1e-3) / (peak_tbs * 1e12), 4)


def compare_to_eager(rows: list, ms: str) -> None:
    """Each row's speed-up over the eager row of its group (``rows``), then print them."""
    eager = next((r for r in rows if r["variant"] == "eager" and ms in r), None)
    for row in rows:
        if ms in row and eager and row["variant"] != "eager":
            row["speedup_vs_eager"] = round(eager[ms] / row[ms], 3)
        print(json.dumps(row), flush=True)


# ----------------------------------------------------------------------------- decode


def build_model(context: int, dtype):
    with torch.device("cuda"):  # the random init runs on the GPU
        model = D.LlamaDecodeStep("bench", seed=0, max_len=context)
    return model.to(dtype).eval()


def kl_compile(model, batch: int, folder: Path, dynamic: bool, level: int, env: dict,
               budget: Budget):
    example = D.make_inputs(model, batch, position=PROMPT_LEN, device="cuda")
    t0 = time.perf_counter()
    shapes = D.dynamic_shapes_for(batch, model.n_layers) if dynamic else None
    compiled = kl.compile(model, example, dynamic_shapes=shapes, roles=D.roles, targets=["ort"],
                          output_dir=folder, optimize=level)
    seconds = round(time.perf_counter() - t0, 1)
    env.setdefault("kernel_lens_compile_s", {})[folder.name] = seconds
    budget.took("kernel_lens_compile", seconds)
    log.info("kernel_lens compile %s: %s s", folder.name, seconds)
    return compiled


class KlCompiles:
    """One context's kernel_lens compiles at one optimization level, each made on first use (so
    the time budget can skip it): the dynamic-batch compile, and static ones per batch
    (``--per-batch-compile``, or when ``run()`` fails on the dynamic one). A compile that failed
    is not tried again. ``used`` remembers per batch the compile a variant worked with: the other
    variants of the batch take the same."""

    def __init__(self, model, context: int, level: int, args, env: dict, result: dict,
                 budget: Budget):
        self.model, self.context, self.level = model, context, level
        self.args, self.env, self.result, self.budget = args, env, result, budget
        self.made: dict[str, object] = {}  # folder name -> CompiledModel, or the exception
        self.used: dict[int, str] = {}  # batch -> "dynamic batch" or "static"

    def run_attempts(self, batch: int) -> list:
        """``kernel_lens_run``: the dynamic-batch compile, else a static one for this batch."""
        labels = ["static"] if self.args.per_batch_compile else ["dynamic batch", "static"]
        return [(label, lambda label=label: make_kl_run(self.get(label, batch)))
                for label in labels]

    def graph_attempts(self, batch: int, mode) -> list:
        """The CUDA-graph variants: the compile ``run()`` worked with."""
        label = self.used.get(batch)
        if label is None:
            dynamic = self.made.get(self._name("dynamic batch", batch))
            failed = self.args.per_batch_compile or isinstance(dynamic, Exception)
            label = "static" if failed else "dynamic batch"
        return [(label, lambda: make_kl_cuda_graph(self.get(label, batch), mode))]

    def _name(self, label: str, batch: int) -> str:
        kind = f"dynamic_b{KL_EXAMPLE_BATCH}" if label == "dynamic batch" else f"static_b{batch}"
        return f"ctx{self.context}_{kind}_{self.args.dtype}_o{self.level}"

    def get(self, label: str, batch: int):
        name = self._name(label, batch)
        if name not in self.made:
            where = {"part": "kernel_lens compile", "context": self.context, "variant": name}
            if not self.budget.allows("kernel_lens_compile", where):
                raise BudgetSpent(name)
            dynamic = label == "dynamic batch"
            try:
                self.made[name] = kl_compile(self.model, KL_EXAMPLE_BATCH if dynamic else batch,
                                             Path(self.args.out_dir) / name, dynamic, self.level,
                                             self.env, self.budget)
            except Exception as exc:  # noqa: BLE001 - recorded; the rows that need it say so
                traceback.print_exc()
                self.made[name] = exc
                self.result["errors"][f"kernel_lens_compile_{name}"] = \
                    f"{type(exc).__name__}: {exc}"[:2000]
        if isinstance(self.made[name], Exception):
            raise self.made[name]
        return self.made[name]


def max_autotune_at(args, batch: int) -> bool:
    return args.max_autotune_batches is None or batch in args.max_autotune_batches


def planned_kl_variants(args) -> list[tuple[str, str, int | None]]:
    """(row name, base variant, opt level) of the kernel_lens variants, level by level."""
    return [(T.variant_name(v, level), v, level)
            for level in args.opt_levels for v in args.kl_variants]


def planned_variants(args, batch: int) -> list[tuple[str, str, int | None]]:
    """(row name, base variant, opt level) of a decode group, in order: eager first (the
    reference), the other anchors, then the kernel_lens variants."""
    anchors = ["eager"] + [v for v in args.variants if v != "eager" and
                           (v != "torch_compile_max_autotune" or max_autotune_at(args, batch))]
    return [(v, v, None) for v in anchors] + planned_kl_variants(args)


def decode_attempts(base: str, level: int | None, batch: int, compiles: dict) -> list:
    """(compile label or None, () -> maker) to try in turn for one variant."""
    if base == "kernel_lens_run":
        return compiles[level].run_attempts(batch)
    if base.startswith("kernel_lens_run_cuda_graph"):
        return compiles[level].graph_attempts(batch, "ort" if base.endswith("_ort") else True)
    return [(None, lambda: DECODE_MAKERS[base])]


def run_group(args, model, context: int, batch: int, compiles: dict, result: dict,
              save: Callable[[], None], budget: Budget) -> None:
    """One (context, batch) group: every planned variant made and checked against eager (each row
    saved as soon as it is made), then all timed in interleaved rounds."""
    g = torch.Generator().manual_seed(batch)
    prompt = torch.randint(0, model.config.vocab_size, (batch, PROMPT_LEN), generator=g).cuda()
    # the example tokens for the captures: make_inputs' ids, without its random caches
    ids = torch.randint(0, model.config.vocab_size, (batch, 1),
                        generator=torch.Generator().manual_seed(0)).cuda()
    reference = ref_tokens = None
    prepared: list = []  # (row, tokens, step_fn, caches) of every variant that works
    rows: list = []
    eager_skipped = False
    for name, base, level in planned_variants(args, batch):
        where = {"part": "decode", "context": context, "batch": batch, "variant": name}
        if eager_skipped:  # no reference to check against, no speed-up to compute
            budget.skip(where)
            continue
        if not budget.allows(base, where):
            eager_skipped = name == "eager"
            continue
        row = {"context": context, "batch": batch, "variant": name}
        if level is not None:
            row["opt_level"] = level
        errors, skipped = {}, False
        for label, get_maker in decode_attempts(base, level, batch, compiles):
            try:
                maker = get_maker()  # a kernel_lens compile happens here: not part of setup_s
                out, logits, step_fn, caches = prepare_variant(
                    row, maker, model, batch, ids, prompt, args.tokens, reference, ref_tokens)
                if label is not None:
                    row["kernel_lens_compile"] = label
                    compiles[level].used.setdefault(batch, label)
                if name == "eager":
                    reference, ref_tokens = logits, out
                    row.update(tokens_match=True, first_mismatch=None, max_abs_logit_diff=0.0)
                prepared.append((row, out, step_fn, caches))
                break
            except BudgetSpent:
                skipped = True
                break
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                traceback.print_exc()
                errors[label or "error"] = f"{type(exc).__name__}: {exc}"[:2000]
            finally:
                torch.cuda.synchronize()
        if skipped:
            budget.skip(where)
            continue
        if errors:
            row["error" if not any(p[0] is row for p in prepared) else "earlier_errors"] = errors
        budget.took(base, row.get("setup_s", 0.0))
        rows.append(row)
        result["rows"].append(row)
        save()
    if not prepared:
        return
    try:
        time_variants(prepared, prompt, args.tokens, args.rounds)
    except Exception as exc:  # noqa: BLE001 - recorded
        traceback.print_exc()
        result["errors"][f"decode_timing_ctx{context}_b{batch}"] = \
            f"{type(exc).__name__}: {exc}"[:2000]
    step_bytes = bytes_per_step(model, batch)
    for row in rows:
        add_throughput(row, batch, step_bytes, result["env"]["hbm_peak_tbs"])
    compare_to_eager(rows, "ms_per_token")
    save()


def run_decode(args, dtype, result: dict, save: Callable[[], None], budget: Budget) -> None:
    """The decode rows: per context its own model (the same weights) and kernel_lens compiles,
    then its (context, batch) groups, freed one after the other."""
    for context in args.contexts:
        if PROMPT_LEN + args.tokens - 1 > context:
            result["errors"][f"decode_context_{context}"] = \
                f"{PROMPT_LEN} prompt + {args.tokens} tokens do not fit a cache of {context}"
            continue
        if not budget.allows("model", {"part": "decode", "context": context}):
            continue  # the entry names the whole context
        t0 = time.perf_counter()
        model = build_model(context, dtype)
        budget.took("model", time.perf_counter() - t0)
        compiles = {level: KlCompiles(model, context, level, args, result["env"], result, budget)
                    for level in args.opt_levels}
        for batch in args.batches:
            run_group(args, model, context, batch, compiles, result, save, budget)
            _free()
        del model, compiles  # the kernel_lens sessions hold their own copy of the weights
        _free()


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


def planned_block_variants(args) -> list[tuple[str, str, int | None]]:
    anchors = ["eager"] + [v for v in args.variants if v != "eager" and v in BLOCK_ANCHORS]
    return [(v, v, None) for v in anchors] + planned_kl_variants(args)


class BlockCompiles:
    """The block's kernel_lens compile per optimization level (dynamic ``seq``), made on first
    use; a failed one is not tried again."""

    def __init__(self, block, args, dtype, env: dict, result: dict, budget: Budget):
        self.block, self.args, self.dtype = block, args, dtype
        self.env, self.result, self.budget = env, result, budget
        self.made: dict[int, object] = {}  # level -> CompiledModel, or the exception

    def get(self, level: int):
        if level not in self.made:
            name = f"block_dynamic_seq_{self.args.dtype}_o{level}"
            if not self.budget.allows("kernel_lens_compile_block",
                                      {"part": "kernel_lens compile", "variant": name}):
                raise BudgetSpent(name)
            try:
                g = torch.Generator().manual_seed(7)
                example = (torch.randn(1, min(self.args.block_tokens), BLOCK_CONFIG["hidden"],
                                       generator=g).to("cuda", self.dtype),)
                t0 = time.perf_counter()
                self.made[level] = kl.compile(self.block, example, dynamic_shapes=LB.dynamic_shapes,
                                              targets=["ort"], optimize=level,
                                              output_dir=Path(self.args.out_dir) / name)
                seconds = round(time.perf_counter() - t0, 1)
                self.env.setdefault("kernel_lens_compile_s", {})[name] = seconds
                self.budget.took("kernel_lens_compile_block", seconds)
            except Exception as exc:  # noqa: BLE001 - recorded; the rows that need it say so
                traceback.print_exc()
                self.made[level] = exc
                self.result["errors"][f"kernel_lens_compile_{name}"] = \
                    f"{type(exc).__name__}: {exc}"[:2000]
        made = self.made[level]
        if isinstance(made, Exception):
            raise RuntimeError(f"no kernel_lens compile at -O{level}: "
                               f"{type(made).__name__}: {made}"[:2000])
        return made


def time_block_rows(fns: list, x, args) -> None:
    """Timed calls in rounds, variants interleaved (order rotating), as for decode."""
    times: dict[int, list[float]] = {id(row): [] for row, _ in fns}
    per_round = max(1, args.block_iters // args.rounds)
    tokens = x.shape[1]
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


def run_block(args, dtype, result: dict, save: Callable[[], None], budget: Budget) -> None:
    """The single-block rows: every variant at every token count, into ``result["block_rows"]``."""
    env = result["env"]
    env["block"] = dict(BLOCK_CONFIG, tokens=args.block_tokens, iters=args.block_iters, batch=1)
    with torch.no_grad():
        block = LB.LlamaBlock(**BLOCK_CONFIG, seed=0)
        block = block.to("cuda", dtype).eval()
        block.inv_freq = block.inv_freq.float()  # the RoPE angles stay fp32
    result.setdefault("block_rows", [])
    compiles = BlockCompiles(block, args, dtype, env, result, budget)
    for tokens in args.block_tokens:
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(1, tokens, BLOCK_CONFIG["hidden"], generator=g).to("cuda", dtype)
        with torch.no_grad():
            want = block(x).float()
        rows, fns = [], []
        for name, base, level in planned_block_variants(args):
            where = {"part": "block", "tokens": tokens, "variant": name}
            if not budget.allows(f"block_{base}", where):
                continue
            row = {"model": "llama_block", "tokens": tokens, "variant": name}
            if level is not None:
                row["opt_level"] = level
            try:
                compiled = None if level is None else compiles.get(level)
                t0 = time.perf_counter()
                with torch.no_grad():
                    fn = BLOCK_MAKERS[base](block, x, compiled)
                    for _ in range(5):  # warm-up (compiles, captures graphs)
                        fn(x)
                    torch.cuda.synchronize()
                    row["setup_s"] = round(time.perf_counter() - t0, 1)
                    got = fn(x).float()
                    diff = (got - want).abs()
                    row.update(max_abs_diff=float(diff.max()),
                               max_rel_diff=float(diff.max() / want.abs().max()))
                fns.append((row, fn))
            except BudgetSpent:
                budget.skip(where)
                continue
            except Exception as exc:  # noqa: BLE001 - recorded, the run goes on
                traceback.print_exc()
                row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
            finally:
                torch.cuda.synchronize()
            budget.took(f"block_{base}", row.get("setup_s", 0.0))
            rows.append(row)
            result["block_rows"].append(row)
            save()
        if fns:
            time_block_rows(fns, x, args)
        compare_to_eager(rows, "ms")
        save()
        del fns
        _free()


# ----------------------------------------------------------------------------- plot
# One panel per context (x: batch; a bar per variant, one colour per variant in every panel),
# then the block panel (x: tokens). kernel_lens levels share a hue, -O0 the lighter shade.

_TAB20 = {"eager": 14, "eager_cuda_graph": 10, "torch_compile_reduce_overhead": 2,
          "torch_compile_max_autotune": 6, "kernel_lens_run": 0, "kernel_lens_run_cuda_graph": 4,
          "kernel_lens_run_cuda_graph_ort": 8}


def _colour(cmap, name: str):
    base, level = T.split_variant(name)
    index = _TAB20.get(base, 16)
    r, g, b, a = cmap(index + (1 if level == 0 else 0))
    if level is not None and level >= 2:  # -O2 and up: the -O1 colour, darker
        return (r * 0.55, g * 0.55, b * 0.55, a)
    return (r, g, b, a)


def _bars(ax, cmap, rows: list, key: str, value_key: str, group_label) -> None:
    """Grouped bars: one group per ``key`` value (batch or tokens), a bar per variant."""
    groups = sorted({r[key] for r in rows})
    variants = sorted({r["variant"] for r in rows}, key=T.order_key)
    width = 0.86 / len(variants)
    for i, name in enumerate(variants):
        xs, values = [], []
        for j, group in enumerate(groups):
            row = next((r for r in rows if r[key] == group and r["variant"] == name), None)
            if row is None:  # not planned there (max-autotune batches) or skipped
                continue
            xs.append(j + (i - (len(variants) - 1) / 2) * width)
            values.append(row.get(value_key) or 0.0)
        ax.bar(xs, values, width, color=_colour(cmap, name))
        for x, value in zip(xs, values):
            ax.text(x, value, f" {value:.2f}" if value else " failed", ha="center", va="bottom",
                    rotation=90, fontsize=6)
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels([group_label(g) for g in groups], fontsize=9)
    ax.margins(y=0.18)  # room for the rotated value labels


def plot(result: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415 - an optional dependency, only --plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    env = result["env"]
    rows, block_rows = result.get("rows", []), result.get("block_rows", [])
    panels = [("decode", c) for c in sorted({r["context"] for r in rows})]
    panels += [("block", None)] if block_rows else []
    if not panels:
        return
    cmap = plt.get_cmap("tab20")
    runs = sorted({r["tokens"] for r in env.get("merged_from", []) if r.get("tokens")} or {env["tokens"]})
    tokens = "/".join(str(t) for t in runs)  # merged runs may have decoded different lengths
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 4.2 * len(panels)), squeeze=False)
    for ax, (kind, context) in zip(axes[:, 0], panels):
        if kind == "decode":
            _bars(ax, cmap, [r for r in rows if r["context"] == context], "batch", "ms_per_token",
                  lambda b: f"batch {b}")
            ax.set_ylabel("ms per token (median)")
            ax.set_title(f"LLaMA decode step, static KV cache of {context} positions "
                         f"({env['dtype']}, hidden 4096, 4 layers, {tokens} greedy tokens) "
                         f"on {env['gpu']}", fontsize=9)
        else:
            _bars(ax, cmap, block_rows, "tokens", "ms", lambda t: f"{t} tokens")
            spread = max(r["ms"] for r in block_rows) / min(r["ms"] for r in block_rows)
            if spread > 10:  # 8 and 2048 tokens side by side; else a linear axis from 0
                ax.set_yscale("log")
            ax.set_ylabel(f"ms per forward (median{', log' if spread > 10 else ''})")
            ax.set_title(f"One LLaMA block (examples/llama_block.py, {env['dtype']}, hidden 4096, "
                         f"FFN 11008, batch 1) on {env['gpu']}", fontsize=9)
    # one legend for every panel: a variant has the same colour throughout
    names = sorted({r["variant"] for r in rows + block_rows}, key=T.order_key)
    fig.legend(handles=[Patch(color=_colour(cmap, n), label=T.label(n, markdown=False))
                        for n in names], loc="upper center", ncol=4, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.7 / (4.2 * len(panels))))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default="decode_results.json")
    parser.add_argument("--plot", default=None)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="fp16")
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096],
                        help="static KV-cache lengths (max_len) of the decode model")
    parser.add_argument("--batches", type=int, nargs="*", default=[1, 8, 32],
                        help="decode batches (none: no decode rows)")
    parser.add_argument("--tokens", type=int, default=128, help="greedy tokens per decode loop")
    parser.add_argument("--variants", nargs="+", default=ANCHORS, choices=ANCHORS,
                        help="anchor variants (eager always runs: the reference)")
    parser.add_argument("--max-autotune-batches", type=int, nargs="*", default=None,
                        help="batches with a torch_compile_max_autotune row (default: all; "
                             "none: no such row)")
    parser.add_argument("--kl-variants", nargs="*", default=DEFAULT_KL_VARIANTS,
                        choices=KL_VARIANTS, help="kernel_lens variants (none: no kernel_lens)")
    parser.add_argument("--opt-levels", type=int, nargs="+", default=[0, 1],
                        help="kernel_lens graph-optimization levels (kl.compile(optimize=...))")
    parser.add_argument("--out-dir", default="kl_decode_bench", help="kernel_lens artifacts")
    parser.add_argument("--per-batch-compile", action="store_true",
                        help="compile kernel_lens per batch (static shapes)")
    parser.add_argument("--block-tokens", type=int, nargs="*", default=[8, 2048],
                        help="token counts of the single-block rows (none: no block rows)")
    parser.add_argument("--block-iters", type=int, default=60, help="timed calls per block row")
    parser.add_argument("--rounds", type=int, default=3,
                        help="timed rounds per row, variants interleaved (decode: one loop each)")
    parser.add_argument("--hbm-peak-tbs", type=float, default=None,
                        help="peak HBM bandwidth in TB/s (default: by GPU name: "
                             + ", ".join(f"{n} {t}" for n, t in HBM_PEAK_TBS) + ")")
    parser.add_argument("--time-budget-s", type=float, default=0,
                        help="start no row or compile past this many seconds (0: no budget)")
    parser.add_argument("--profile", action="store_true",
                        help="add each row's GPU kernels per call (torch.profiler) to the JSON")
    parser.add_argument("--merge", nargs="+", metavar="JSON",
                        help="measure nothing: merge these runs' JSONs into --json (and --plot)")
    return parser.parse_args(argv)


def measure(args) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = DTYPES[args.dtype]
    result = {"env": decode_environment(args, dtype), "rows": [], "errors": {}, "skipped": []}
    budget = Budget(args.time_budget_s, result["skipped"])

    def save():
        Path(args.json).write_text(json.dumps(result, indent=1))

    if args.batches:
        try:
            run_decode(args, dtype, result, save, budget)
        except Exception as exc:  # noqa: BLE001 - the block rows still run
            traceback.print_exc()
            result["errors"]["decode"] = f"{type(exc).__name__}: {exc}"[:2000]
            save()
        _free()
    if args.block_tokens:
        try:
            run_block(args, dtype, result, save, budget)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            result["errors"]["block"] = f"{type(exc).__name__}: {exc}"[:2000]
    result["env"]["run_s"] = round(budget.elapsed(), 1)
    save()
    return result


def main() -> None:
    args = parse_args()
    global PROFILE
    PROFILE = args.profile
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if args.merge:
        result = T.load(args.merge)
    else:
        # ORT runs on torch's current (non-default) stream
        with torch.cuda.stream(torch.cuda.Stream()):
            result = measure(args)
    Path(args.json).write_text(json.dumps(result, indent=1))
    if args.plot:
        try:
            plot(result, args.plot)
        except Exception as exc:  # noqa: BLE001
            traceback.print_exc()
            result["errors"]["plot"] = f"{type(exc).__name__}: {exc}"
            Path(args.json).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
