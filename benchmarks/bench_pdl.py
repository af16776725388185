"""What programmatic dependent launch is worth to the `-O2` decode step (GPU host only).

kernel_lens's own kernels (skinny GEMM, split-K sum, decode attention) built for sm_90 are
launched with Triton's ``launch_pdl`` and wait (``gdc_wait``) before they read anything, so a
launch may be scheduled while the one before it drains. This compiles the decode step of
``bench_decode.py`` twice at ``-O2`` (static batch), with and without (``OwnKernels.PDL``), and
times both beside the CUDA graph of eager in interleaved rounds (``bench_decode.time_variants``),
each through ORT in a torch CUDA graph. The two compiles run the same arithmetic: their logits
must be bit-identical step for step, which the script checks (``pdl_logits_identical``).

    python benchmarks/bench_pdl.py --contexts 256 4096 --batches 1 --json $OUT/pdl.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_decode as B  # noqa: E402  (this folder)
from bench_decode import D, kl  # noqa: E402
from kernel_lens.frontends.own_kernels import OwnKernels  # noqa: E402
from kernel_lens.kernels import skinny_gemm as SG  # noqa: E402


def compile_o2(model, batch: int, folder: Path, pdl: bool):
    """The -O2 compile; without PDL it takes the configs the PDL compile timed (one A/B: the
    same tiles, splits and sums, so the same bits)."""
    OwnKernels.PDL = pdl
    if not pdl:
        for key in [k for k in SG._TUNED if k[-1] is True]:
            SG._TUNED[key[:-1] + (False,)] = SG._TUNED[key]
    try:
        example = D.make_inputs(model, batch, position=B.PROMPT_LEN, device="cuda")
        t0 = time.perf_counter()
        compiled = kl.compile(model, example, roles=D.roles, targets=["ort"], output_dir=folder, optimize=2)
        return compiled, round(time.perf_counter() - t0, 1)
    finally:
        OwnKernels.PDL = True


def gemm_configs(compiled) -> list:
    """Each own GEMM launch's tile, split and pipelining, in order."""
    out = []
    for g in compiled.ir.graphs():
        for launch in g.launches:
            kernel = g.kernels[launch.kernel]
            if kernel.name == "_skinny_gemm":
                const = {a.name: a.constant for a in launch.args}
                out.append([const["BLOCK_N"], const["BLOCK_K"], const["SPLIT_K"], kernel.options.num_warps,
                            kernel.options.num_stages])
    return out


def launches_with_pdl(compiled) -> int:
    return sum(1 for g in compiled.ir.graphs() for l in g.launches
               if any(b.launch_pdl for b in g.kernels[l.kernel].binaries))


def run(args, save) -> dict:
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    B.PROFILE = args.profile
    dtype = B.DTYPES["fp16"]
    result = {"env": {**B.environment(args, dtype), "script": "benchmarks/bench_pdl.py",
                      "rounds": args.rounds}, "rows": []}
    peak, source = B.hbm_peak(torch.cuda.get_device_name(), None)
    result["env"]["hbm_peak_tbs"], result["env"]["hbm_peak_source"] = peak, source
    for context in args.contexts:
        model = B.build_model(context, dtype)
        for batch in args.batches:
            g = torch.Generator().manual_seed(batch)  # bench_decode's prompt and capture tokens
            prompt = torch.randint(0, model.config.vocab_size, (batch, B.PROMPT_LEN), generator=g).cuda()
            ids = torch.randint(0, model.config.vocab_size, (batch, 1),
                                generator=torch.Generator().manual_seed(0)).cuda()
            ref = {"variant": "eager", "context": context, "batch": batch}
            ref_tokens, ref_logits, _, _ = B.prepare_variant(ref, B.make_eager, model, batch, ids, prompt,
                                                             args.tokens, None, None)
            rows, prepared, logits = [], [], {}
            makers = [("eager_cuda_graph", B.make_eager_cuda_graph, None)]
            for pdl in (True, False):
                compiled, seconds = compile_o2(model, batch, Path(args.out_dir) / f"ctx{context}_b{batch}_pdl{int(pdl)}",
                                               pdl)
                name = "kernel_lens_o2_pdl" if pdl else "kernel_lens_o2_no_pdl"
                makers.append((name, B.make_kl_cuda_graph(compiled), {"compile_s": seconds,
                                                                      "pdl_launches": launches_with_pdl(compiled),
                                                                      "gemm_configs": gemm_configs(compiled)}))
            for name, maker, extra in makers:
                row = {"variant": name, "context": context, "batch": batch, **(extra or {})}
                out, lg, step_fn, caches = B.prepare_variant(row, maker, model, batch, ids, prompt, args.tokens,
                                                             ref_logits, ref_tokens)
                logits[name] = lg
                prepared.append((row, out, step_fn, caches))
                rows.append(row)
            B.time_variants(prepared, prompt, args.tokens, args.rounds)
            step_bytes = B.bytes_per_step(model, batch)
            graph_ms = rows[0]["ms_per_token"]
            for row in rows:
                B.add_throughput(row, batch, step_bytes, peak)
                row["vs_eager_cuda_graph"] = round(row["ms_per_token"] / graph_ms, 4)
            on, off = logits["kernel_lens_o2_pdl"], logits["kernel_lens_o2_no_pdl"]
            identical = len(on) == len(off) and all(torch.equal(a, b) for a, b in zip(on, off))
            rows[1]["pdl_logits_identical"] = rows[2]["pdl_logits_identical"] = identical
            rows[1]["same_gemm_configs"] = rows[1]["gemm_configs"] == rows[2]["gemm_configs"]
            rows[1]["pdl_over_no_pdl"] = round(rows[1]["ms_per_token"] / rows[2]["ms_per_token"], 4)
            result["rows"] += rows
            save(result)  # after every group: a run cut short keeps what it measured
            print(json.dumps(rows, indent=1), flush=True)
            del prepared
            B._free()
        del model
        B._free()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, nargs="+", default=[256, 4096])
    parser.add_argument("--batches", type=int, nargs="+", default=[1])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--out-dir", default="kl_pdl_bench")
    parser.add_argument("--json", default="pdl_results.json")
    args = parser.parse_args()
    run(args, lambda result: Path(args.json).write_text(json.dumps(result, indent=1)))


if __name__ == "__main__":
    main()
