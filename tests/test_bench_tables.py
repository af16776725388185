"""benchmarks/decode_table.py: merging runs keeps every ratio within its own run."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))
import decode_table as T  # noqa: E402


def _run(path, date, rows):
    path.write_text(json.dumps({"env": {"date": date}, "rows": rows}))
    return path


def test_merged_rows_keep_the_ratio_to_their_own_runs_cuda_graph(tmp_path):
    old = _run(tmp_path / "old.json", "d1", [
        {"context": 256, "batch": 1, "variant": "eager_cuda_graph", "ms_per_token": 0.8},
        {"context": 256, "batch": 1, "variant": "kernel_lens_run_cuda_graph_o1", "ms_per_token": 0.72},
        {"context": 256, "batch": 8, "variant": "eager_cuda_graph", "ms_per_token": 1.0}])
    new = _run(tmp_path / "new.json", "d2", [
        {"context": 256, "batch": 1, "variant": "eager_cuda_graph", "ms_per_token": 0.5},
        {"context": 256, "batch": 1, "variant": "kernel_lens_run_cuda_graph_o2", "ms_per_token": 0.4},
        {"context": 4096, "batch": 1, "variant": "kernel_lens_run_cuda_graph_o2", "ms_per_token": 0.7}])
    rows = {(r["context"], r["batch"], r["variant"]): r for r in T.load([old, new])["rows"]}
    assert rows[(256, 1, "eager_cuda_graph")]["ms_per_token"] == 0.5  # the later run's row
    assert rows[(256, 1, "kernel_lens_run_cuda_graph_o1")]["vs_eager_cuda_graph"] == 0.9  # 0.72 / 0.8
    assert rows[(256, 1, "kernel_lens_run_cuda_graph_o1")]["run_date"] == "d1"
    assert rows[(256, 1, "kernel_lens_run_cuda_graph_o2")]["vs_eager_cuda_graph"] == 0.8  # 0.4 / 0.5
    assert "vs_eager_cuda_graph" not in rows[(4096, 1, "kernel_lens_run_cuda_graph_o2")]  # no graph row there


def test_a_merged_file_loaded_again_keeps_what_it_was_merged_from(tmp_path):
    a = _run(tmp_path / "a.json", "d1", [{"context": 256, "batch": 1, "variant": "eager", "ms_per_token": 3.0}])
    b = _run(tmp_path / "b.json", "d2", [{"context": 256, "batch": 8, "variant": "eager", "ms_per_token": 3.5}])
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(T.load([a, b])))
    again = T.load([merged])
    assert [m["date"] for m in again["env"]["merged_from"]] == ["d1", "d2"] and len(again["rows"]) == 2
    assert "merged_from" not in T.load([a])["env"]
