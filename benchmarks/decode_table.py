"""The decode benchmark's JSON (benchmarks/bench_decode.py) as the README's Markdown tables.

    python benchmarks/decode_table.py benchmarks/decode_results.json [more.json ...]

One table per context (the static KV cache's length): every (batch, variant) row with its median
ms per generated token, that time over the CUDA graph of eager's at the same (context, batch) (the
baseline a decode loop gets from one ``torch.cuda.graph``; below 1.00× is faster), tokens per
second over the whole batch, the share of the GPU's peak HBM bandwidth that the step's minimum
bytes take at that speed, and whether the variant produced eager's tokens. Then the single-block
rows, the rows the time budget skipped, and the failures. Several JSONs (a run split to fit a time
limit) are merged; a later file's row replaces an earlier one's for the same (context, batch,
variant). Prints to stdout.

This module also owns what the benchmark and its plot share about rows: variant names, their
order and their labels. It imports no torch, so it runs anywhere.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

# Peak HBM bandwidth in TB/s by a part of the GPU's name (datasheets). PCIe and NVL parts of the
# same chips differ, so only the names below are known; anything else needs --hbm-peak-tbs.
HBM_PEAK_TBS = [("H200", 4.8), ("H100 80GB HBM3", 3.35), ("H100 SXM", 3.35),
                ("A100-SXM4-80GB", 2.039)]


def hbm_peak(gpu: str, given: float | None) -> tuple[float | None, str]:
    """(peak HBM TB/s, where it comes from): the option, else the table, else None and why."""
    if given:
        return given, "--hbm-peak-tbs"
    for part, tbs in HBM_PEAK_TBS:
        if part in gpu:
            return tbs, f"datasheet figure for {part!r}"
    return None, (f"no peak HBM bandwidth known for {gpu!r}: hbm_fraction is null; "
                  f"pass --hbm-peak-tbs")

ANCHORS = ["eager", "eager_cuda_graph", "torch_compile_reduce_overhead",
           "torch_compile_max_autotune"]
KL_VARIANTS = ["kernel_lens_run", "kernel_lens_run_cuda_graph", "kernel_lens_run_cuda_graph_ort"]
LABELS = {"eager": "eager", "eager_cuda_graph": "CUDA graph of eager",
          "torch_compile_reduce_overhead": "torch.compile reduce-overhead",
          "torch_compile_max_autotune": "torch.compile max-autotune",
          "kernel_lens_run": "kernel_lens `run()`",
          "kernel_lens_run_cuda_graph": "kernel_lens `run(cuda_graph=True)`",
          "kernel_lens_run_cuda_graph_ort": "kernel_lens `run(cuda_graph=\"ort\")`"}
BASELINE = "eager_cuda_graph"  # the ratio column's denominator
_LEVEL = re.compile(r"^(?P<base>kernel_lens_\w+?)_o(?P<level>\d+)$")


# ----------------------------------------------------------------------------- variant names


def variant_name(base: str, opt_level: int | None) -> str:
    """A row's ``variant``: kernel_lens variants carry their optimization level (``_o1``)."""
    return base if opt_level is None else f"{base}_o{opt_level}"


def split_variant(name: str) -> tuple[str, int | None]:
    """``variant_name``'s inverse: (base variant, opt level or None)."""
    match = _LEVEL.match(name)
    return (match["base"], int(match["level"])) if match else (name, None)


def order_key(name: str) -> tuple:
    """Anchors first, then kernel_lens by level, then by variant; unknown names last."""
    base, level = split_variant(name)
    if base in ANCHORS:
        return (0, ANCHORS.index(base))
    if base in KL_VARIANTS:
        return (1, -1 if level is None else level, KL_VARIANTS.index(base))
    return (2, name)


def label(name: str, markdown: bool = True) -> str:
    base, level = split_variant(name)
    text = LABELS.get(base, base) + ("" if level is None else f" -O{level}")
    return text if markdown else text.replace("`", "")


# ----------------------------------------------------------------------------- loading


def _row_key(row: dict) -> tuple:
    return (row.get("model", "decode"), row.get("context"), row.get("batch"), row.get("tokens"),
            row["variant"])


def load(paths: list[str | Path]) -> dict:
    """The result of one run, or several merged: env from the first (the others' dates and
    contexts under ``env["merged_from"]``), rows, block rows, skipped rows and errors of all, a
    later file's row replacing an earlier one's. A row from before contexts were measured gets
    its run's cache length as ``context``. Each decode row gets ``vs_eager_cuda_graph``, its
    ms/token over the CUDA graph of eager of its own run (same context and batch), and
    ``run_date``: ratios are never taken across runs."""
    merged: dict = {"env": None, "rows": {}, "block_rows": {}, "skipped": [], "errors": {}}
    for path in paths:
        result = json.loads(Path(path).read_text())
        env = result.get("env", {})
        if merged["env"] is None:
            merged["env"] = dict(env, merged_from=[])
        merged["env"]["merged_from"].append({"path": str(path), "date": env.get("date"),
                                             "contexts": env.get("contexts"),
                                             "tokens": env.get("tokens") if result.get("rows") else None})
        old_context = env.get("config", {}).get("max_len")
        graphs = {(r.get("context", old_context), r.get("batch")): r["ms_per_token"]
                  for r in result.get("rows", []) if r["variant"] == "eager_cuda_graph" and "ms_per_token" in r}
        for part in ("rows", "block_rows"):
            for row in result.get(part, []):
                if part == "rows":
                    row.setdefault("context", old_context)
                    graph = graphs.get((row["context"], row.get("batch")))
                    if graph and "ms_per_token" in row:  # within its own run: merged rows keep theirs
                        row.setdefault("vs_eager_cuda_graph", round(row["ms_per_token"] / graph, 3))
                        row.setdefault("run_date", env.get("date"))
                merged[part][_row_key(row)] = row
        merged["skipped"] += result.get("skipped", [])
        for key, error in result.get("errors", {}).items():
            merged["errors"][key if key not in merged["errors"] else f"{path}: {key}"] = error
    if len(paths) == 1:  # one file: what it was merged from, if it was
        if env.get("merged_from"):
            merged["env"]["merged_from"] = env["merged_from"]
        else:
            del merged["env"]["merged_from"]
    return dict(merged, rows=list(merged["rows"].values()),
                block_rows=list(merged["block_rows"].values()))


# ----------------------------------------------------------------------------- formatting


def _ms(row: dict, key: str, fastest: float | None) -> str:
    if row.get(key) is None:
        return "failed" if "error" in row else "not timed"
    text = f"{row[key]:.3f}"
    return f"**{text}**" if row[key] == fastest else text


def _ratio(row: dict, baseline: dict | None, key: str) -> str:
    if row.get(key) is None or not baseline or not baseline.get(key):
        return "–"
    return f"{row[key] / baseline[key]:.2f}×"


def _match(row: dict) -> str:
    if "tokens_match" not in row:
        return "–"
    return "yes" if row["tokens_match"] else f"until token {row['first_mismatch']}"


def _number(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _groups(rows: list[dict], keys: tuple[str, ...]) -> dict[tuple, list[dict]]:
    groups: dict[tuple, list[dict]] = {}
    def key(row: dict) -> tuple:
        return (*(row.get(k) or 0 for k in keys), order_key(row["variant"]))

    for row in sorted(rows, key=key):
        groups.setdefault(tuple(row.get(k) for k in keys), []).append(row)
    return groups


def header(result: dict) -> list[str]:
    env = result["env"]
    peak = env.get("hbm_peak_tbs")
    versions = ", ".join(f"{name} {env[name]}" for name in ("torch", "triton", "onnxruntime")
                         if env.get(name))
    runs = env.get("merged_from")
    dates = ", ".join(str(r["date"]) for r in runs) if runs else env.get("date")
    lines = [f"{env.get('gpu')}, {versions}; {env.get('dtype')}, {env.get('prompt_len')} prompt "
             f"tokens then {env.get('tokens')} greedy tokens; run(s) of {dates}."]
    if peak:
        lines.append(f"HBM fraction: the bytes a step must read (weights, the batch's embedding "
                     f"rows, the whole KV cache) per ms/token, over {peak} TB/s "
                     f"({env.get('hbm_peak_source')}).")
    else:
        why = env.get("hbm_peak_source", "no peak bandwidth known")
        lines.append(f"HBM fraction not computed: {why}.")
    return lines


def decode_tables(result: dict) -> list[str]:
    lines = []
    by_context = _groups(result["rows"], ("context",))
    for (context,), rows in by_context.items():
        lines += ["", f"**Context {context}** (static KV cache of {context} positions, attended "
                      f"in full every step): median ms per generated token", "",
                  "| batch | variant | ms/token | ÷ CUDA graph of eager | tokens/s | HBM fraction "
                  "| eager's tokens |",
                  "|---:|---|---:|---:|---:|---:|---|"]
        for (_, batch), group in _groups(rows, ("context", "batch")).items():
            baseline = next((r for r in group if r["variant"] == BASELINE), None)
            timed = [r["ms_per_token"] for r in group if r.get("ms_per_token") is not None]
            fastest = min(timed) if timed else None
            for row in group:
                hbm = row.get("hbm_fraction")
                lines.append(f"| {batch} | {label(row['variant'])} | "
                             f"{_ms(row, 'ms_per_token', fastest)} | "
                             f"{_ratio(row, baseline, 'ms_per_token')} | "
                             f"{_number(row.get('tokens_per_s'), ',.0f')} | "
                             f"{'–' if hbm is None else f'{100 * hbm:.1f}%'} | {_match(row)} |")
    return lines


def block_table(result: dict) -> list[str]:
    rows = result.get("block_rows", [])
    if not rows:
        return []
    env = result["env"].get("block", {})
    lines = ["", f"**One LLaMA block** (examples/llama_block.py, hidden {env.get('hidden')}, FFN "
                 f"{env.get('intermediate')}, batch 1): median ms per forward", "",
             "| tokens | variant | ms | ÷ CUDA graph of eager | tokens/s | max rel diff |",
             "|---:|---|---:|---:|---:|---:|"]
    for (tokens,), group in _groups(rows, ("tokens",)).items():
        baseline = next((r for r in group if r["variant"] == BASELINE), None)
        timed = [r["ms"] for r in group if r.get("ms") is not None]
        fastest = min(timed) if timed else None
        for row in group:
            lines.append(f"| {tokens} | {label(row['variant'])} | {_ms(row, 'ms', fastest)} | "
                         f"{_ratio(row, baseline, 'ms')} | "
                         f"{_number(row.get('tokens_per_s'), ',.0f')} | "
                         f"{_number(row.get('max_rel_diff'), '.1e').replace('0.0e+00', '0')} |")
    return lines


def notes(result: dict) -> list[str]:
    """The skipped rows (by group) and the failures, one line each."""
    lines = []
    skipped: dict[str, list[str]] = {}
    for s in result.get("skipped", []):
        where = " ".join(f"{k} {s[k]}" for k in ("part", "context", "batch", "tokens")
                         if s.get(k) is not None)
        skipped.setdefault(where, []).append(s.get("variant") or "all")
    if skipped:
        lines += ["", "Skipped (time budget spent):"]
        lines += [f"- {where}: {', '.join(names)}" for where, names in skipped.items()]
    failures = [(f"context {r.get('context')} batch {r.get('batch')}" if "batch" in r
                 else f"block {r.get('tokens')} tokens", r["variant"], r["error"])
                for r in result["rows"] + result.get("block_rows", []) if "error" in r]
    failures += [("run", key, error) for key, error in result.get("errors", {}).items()]
    if failures:
        lines += ["", "Failed:"]
        for where, name, error in failures:
            text = json.dumps(error) if isinstance(error, dict) else str(error)
            lines.append(f"- {where}, {name}: {text.splitlines()[0][:200]}")
    return lines


def markdown(result: dict) -> str:
    return "\n".join(header(result) + decode_tables(result) + block_table(result) + notes(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("json", nargs="+", help="bench_decode.py results (several: merged)")
    args = parser.parse_args()
    print(markdown(load(args.json)))


if __name__ == "__main__":
    main()
