"""kernel_lens's own decode kernels (issue 41) against what the graph runs today, one GPU, one run:

* skinny GEMM ``x @ W.t()`` (``kernel_lens.kernels.skinny_matmul``) vs ``torch.nn.functional.linear``
  (cuBLAS; what ORT's MatMul calls too) on the decode model's weights as -O2 runs them
  (examples/llama_decode.py, size ``bench``: hidden 4096, FFN 11008, 8 of 32 heads for K/V, vocab
  32000; q/k/v and gate/up concatenated), M = 1 and 8 rows, fp16; the configs ``tune()`` times
  (``candidates`` of the table's, then ``deeper``: pipelining depth and warps of the best), the
  fastest kept per shape;
* with ``--read``, the read ceiling: a streaming read (``_read_all``) of all the weights and of
  each weight, the fastest of a few grids;
* split-KV decode attention (``kernel_lens.kernels.decode_attention``) vs
  ``torch.nn.functional.scaled_dot_product_attention`` on the same [B, 8, S, 128] cache (32 query
  heads, K/V expanded to 32 heads for SDPA as the graph does), S = 256 and 4096, B = 1 and 8.

Per row: median microseconds of ``triton.testing.do_bench_cudagraph`` (a CUDA graph of 20
calls replayed: launch overhead excluded for both sides), the least bytes the op must read (the
weight, or the K/V cache), the fraction of ``--hbm-peak-tbs`` (by default the datasheet figure for the GPU: 4.8 for an H200, 3.35 for an H100 SXM) that is, the
max abs difference from a float64 reference for both sides, and whether two runs of the own
kernel give the same bits. A weight that fits in the GPU's L2 (50 MB on an H100: the 33.5 MB o
proj) is read from L2 by the replayed calls: its fraction can pass 1 and says nothing of HBM.
Writes ``--json``; ``--plot`` draws it.

    python benchmarks/bench_own_kernels.py --json own_kernels.json --plot own_kernels.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import sys
import time
from pathlib import Path

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from kernel_lens.kernels import decode_attention, skinny_matmul  # noqa: E402
from kernel_lens.kernels.decode_attention import split_count  # noqa: E402
from kernel_lens.kernels.skinny_gemm import candidates, deeper, table_config  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from decode_table import hbm_peak  # noqa: E402

# (name, N, K) of the decode model's linear layers as -O2 runs them (q/k/v and gate/up fused)
SHAPES = [("q/k/v fused", 6144, 4096), ("o proj", 4096, 4096), ("gate/up fused", 22016, 4096),
          ("down", 4096, 11008), ("lm head", 32000, 4096)]
SPLITS = (4, 8, 16, 32)


@triton.jit
def _read_all(x_ptr, out_ptr, n, per, BLOCK: tl.constexpr):
    """Each program reads ``per`` consecutive elements of x (fp16), BLOCK at a time, and stores
    their sum: a streaming read, the most a weight-streaming kernel could reach."""
    start = tl.program_id(0).to(tl.int64) * per
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for i in range(0, per, BLOCK):
        offs = start + i + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + tl.program_id(0), tl.sum(acc, axis=0))


def read_rows(peak: float) -> list[dict]:
    """The read ceiling: a streaming read of the decode model's weights (1.68 GB at -O2's
    shapes) and of each weight alone, the fastest of a few grids and block sizes."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    total = sum(n * k for _, n, k in SHAPES) * 4 - 32000 * 4096 * 3  # 4 layers, one lm head
    for name, elements in [("all weights (4 layers + lm head)", total)] + [(n, a * b) for n, a, b in SHAPES]:
        x = torch.ones(elements, dtype=torch.float16, device="cuda")
        best = None
        for programs, block in itertools.product((sms, 2 * sms, 4 * sms, 8 * sms), (1024, 2048, 4096)):
            per = triton.cdiv(triton.cdiv(elements, programs), block) * block
            grid = triton.cdiv(elements, per)
            out = torch.empty(grid, dtype=torch.float32, device="cuda")
            us = _us(lambda: _read_all[(grid,)](x, out, elements, per, BLOCK=block, num_warps=8))
            if best is None or us < best[0]:
                best = (us, programs, block)
        nbytes = elements * 2
        row = {"op": "read", "name": name, "bytes": nbytes, "us": round(best[0], 2),
               "tb_per_s": round(nbytes / (best[0] * 1e-6) / 1e12, 3),
               "hbm_fraction": round(nbytes / (best[0] * 1e-6) / (peak * 1e12), 3),
               "programs": best[1], "block": best[2]}
        print(json.dumps(row), flush=True)
        rows.append(row)
        del x
    return rows


def _us(fn) -> float:
    return do_bench_cudagraph(fn, rep=40, return_mode="median") * 1e3


def gemm_rows(ms: list[int], peak: float, dtype) -> list[dict]:
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (name, n, k), m in itertools.product(SHAPES, ms):
        w = (torch.randn(n, k, device="cuda", generator=gen) / math.sqrt(k)).to(dtype)
        x = torch.randn(m, k, device="cuda", generator=gen).to(dtype)
        ref = x.double() @ w.double().t()
        wt = w.t()
        nbytes = w.numel() * w.element_size()
        torch_us = _us(lambda: torch.nn.functional.linear(x, w))
        torch_diff = (torch.nn.functional.linear(x, w).double() - ref).abs().max().item()
        best = None
        tried = 0
        for round_ in (candidates(table_config(n, k), k), None):  # as tune(): then the best one deeper
            for cfg in round_ if round_ is not None else deeper(best[1]):
                try:
                    out = skinny_matmul(x, wt, config=cfg)
                    us = _us(lambda: skinny_matmul(x, wt, config=cfg))
                except Exception as exc:  # noqa: BLE001 - a config that does not fit the chip
                    print(f"  {name} M={m} {cfg}: {type(exc).__name__}: {str(exc)[:120]}", flush=True)
                    continue
                tried += 1
                if best is None or us < best[0]:
                    best = (us, cfg, out)
            if round_ is not None:
                first_round = best
        us, cfg, out = best
        again = skinny_matmul(x, wt, config=cfg)
        row = {"op": "gemm", "name": name, "M": m, "N": n, "K": k, "dtype": str(dtype).removeprefix("torch."),
               "bytes": nbytes, "torch_us": round(torch_us, 2), "own_us": round(us, 2),
               "own_over_torch": round(us / torch_us, 3),
               "torch_hbm_fraction": round(nbytes / (torch_us * 1e-6) / (peak * 1e12), 3),
               "own_hbm_fraction": round(nbytes / (us * 1e-6) / (peak * 1e12), 3),
               "own_config": cfg.__dict__, "configs_timed": tried,
               "first_round_us": round(first_round[0], 2), "first_round_config": first_round[1].__dict__,
               "torch_max_abs_diff": torch_diff,
               "own_max_abs_diff": (out.double() - ref).abs().max().item(),
               "own_bit_stable": bool(torch.equal(out, again))}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def attention_rows(batches: list[int], contexts: list[int], peak: float, dtype) -> list[dict]:
    rows = []
    hq, hkv, d = 32, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(1)
    for b, s in itertools.product(batches, contexts):
        q = torch.randn(b, hq, d, device="cuda", generator=gen).to(dtype)
        k = torch.randn(b, hkv, s, d, device="cuda", generator=gen).to(dtype)
        v = torch.randn(b, hkv, s, d, device="cuda", generator=gen).to(dtype)
        lengths = torch.full((b,), s, dtype=torch.int32, device="cuda")
        kk, vv = k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1)
        ref = torch.nn.functional.scaled_dot_product_attention(q.double()[:, :, None], kk.double(), vv.double())[:, :, 0]

        def sdpa():
            return torch.nn.functional.scaled_dot_product_attention(
                q[:, :, None], k.repeat_interleave(hq // hkv, 1), v.repeat_interleave(hq // hkv, 1))[:, :, 0]

        def sdpa_pre():  # K/V already expanded (the expansion's copy left out)
            return torch.nn.functional.scaled_dot_product_attention(q[:, :, None], kk, vv)[:, :, 0]
        nbytes = 2 * k.numel() * k.element_size()
        t_us, tpre_us = _us(sdpa), _us(sdpa_pre)
        best = None
        for splits, bs in itertools.product(SPLITS, (32, 64)):
            out = decode_attention(q, k, v, lengths, splits=splits, block_s=bs)
            us = _us(lambda: decode_attention(q, k, v, lengths, splits=splits, block_s=bs))
            if best is None or us < best[0]:
                best = (us, splits, bs, out)
        chosen = split_count(b, hkv, s)  # what -O2 launches with
        chosen_us = _us(lambda: decode_attention(q, k, v, lengths, splits=chosen, block_s=64))
        us, splits, bs, out = best
        again = decode_attention(q, k, v, lengths, splits=splits, block_s=bs)
        row = {"op": "decode_attention", "B": b, "S": s, "H_q": hq, "H_kv": hkv, "D": d,
               "dtype": str(dtype).removeprefix("torch."), "bytes": nbytes,
               "torch_us": round(t_us, 2), "torch_kv_expanded_us": round(tpre_us, 2), "own_us": round(us, 2),
               "own_over_torch": round(us / t_us, 3),
               "torch_hbm_fraction": round(nbytes / (t_us * 1e-6) / (peak * 1e12), 3),
               "own_hbm_fraction": round(nbytes / (us * 1e-6) / (peak * 1e12), 3),
               "own_config": {"splits": splits, "block_s": bs},
               "split_count": chosen, "split_count_us": round(chosen_us, 2),
               "torch_max_abs_diff": (sdpa().double() - ref).abs().max().item(),
               "own_max_abs_diff": (out.double() - ref).abs().max().item(),
               "own_bit_stable": bool(torch.equal(out, again))}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def plot(result: dict, path: str) -> None:
    import matplotlib  # noqa: PLC0415
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    rows = [r for r in result["rows"] if r["op"] != "read"]
    ceiling = next((r for r in result["rows"] if r["op"] == "read" and r["name"].startswith("all")), None)
    fig, ax = plt.subplots(figsize=(11, 4))
    if ceiling is not None:
        ax.axhline(ceiling["hbm_fraction"], color="gray", linestyle="--",
                   label=f"streaming read of all weights ({ceiling['tb_per_s']} TB/s)")
    labels = [f"{r['name']} M={r['M']}" if r["op"] == "gemm" else f"attn B={r['B']} S={r['S']}" for r in rows]
    xs = range(len(rows))
    ax.bar([x - 0.2 for x in xs], [r["torch_hbm_fraction"] for r in rows], 0.4, label="torch (cuBLAS / SDPA)")
    ax.bar([x + 0.2 for x in xs], [r["own_hbm_fraction"] for r in rows], 0.4, label="kernel_lens own kernel")
    ax.set_xticks(list(xs), labels, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("fraction of HBM peak")
    ax.set_title(f"{result['env']['gpu']}: decode ops, one op alone (CUDA graph of 20 calls)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--plot")
    ap.add_argument("--from-json", help="only draw --plot from this JSON (no GPU)")
    ap.add_argument("--hbm-peak-tbs", type=float, help="default: the datasheet figure for the GPU's name")
    ap.add_argument("--rows", type=int, nargs="*", default=[1, 8], help="GEMM rows (none: no GEMM rows)")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8], help="attention batches (none: none)")
    ap.add_argument("--contexts", type=int, nargs="+", default=[256, 4096])
    ap.add_argument("--read", action="store_true", help="also the streaming-read ceiling rows")
    args = ap.parse_args()
    if args.from_json:
        plot(json.loads(Path(args.from_json).read_text()), args.plot)
        return
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    peak, source = hbm_peak(torch.cuda.get_device_name(), args.hbm_peak_tbs)
    if peak is None:
        raise SystemExit(source)
    args.hbm_peak_tbs = peak
    env = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cuda": torch.version.cuda, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "hbm_peak_tbs": args.hbm_peak_tbs, "hbm_peak_source": source, "timing": "do_bench_cudagraph median, rep=40 ms"}
    result = {"env": env, "rows": []}
    if args.read:
        result["rows"] += read_rows(args.hbm_peak_tbs)
    result["rows"] += gemm_rows(args.rows, args.hbm_peak_tbs, torch.float16)
    result["rows"] += attention_rows(args.batches, args.contexts, args.hbm_peak_tbs, torch.float16)
    env["run_s"] = round(time.time() - start, 1)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
