"""Real third-party Triton kernels on the CPU host, as a user calls them: fla-core ops (an
autotuner with a disk cache, a library Autotuner subclass, constexprs from sizes) and PyTorch's
two ``torch.library`` patterns, each in its own process through ``scripts/library_conformance.py``
(the same runner the H200 run uses; see docs/library_conformance.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT

CASES = ["fla_l2norm", "fla_layer_norm", "fla_chunk_local_cumsum", "fla_rotary",
         "torchlib_custom_op", "torchlib_triton_op", "fla_group_norm",
         "conch_gemma_rms_norm", "conch_varlen_attention", "conch_mixed_precision_gemm",
         "flashnn_gemm_a8w8", "flashnn_dynamic_quant", "flashnn_flash_attention"]
# fla_group_norm: a constexpr with 32 values over the declared range, one binary each;
# conch_gemma_rms_norm: a tl.const pointer; flashnn_dynamic_quant: the token count a constexpr


def test_library_cases_compile_or_fail_in_one_typed_line(tmp_path):
    out = tmp_path / "results.json"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "library_conformance.py"),
                           *CASES, "--phases", "compile", "--jobs", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert out.exists(), proc.stderr[-2000:]
    data = json.loads(out.read_text())
    results = {r["case"]: r["compile"] for r in (data["results"] if isinstance(data, dict) else data)}
    assert set(results) == set(CASES)
    for case in CASES:
        result = results[case]
        assert result["status"] == "compiled", (case, result.get("message"))
        assert result.get("matches_reference", True), (case, result.get("max_abs_diff"))


def test_a_timed_out_case_leaves_no_child_running(tmp_path):
    """A case past --timeout is killed with everything it started (issue 30, item 9): a worker's
    compiler or server child must not outlive it."""
    import importlib.util
    import os
    import time

    spec = importlib.util.spec_from_file_location("kl_conformance_script", ROOT / "scripts" / "library_conformance.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    pids = tmp_path / "pids"
    worker = [sys.executable, "-c", f"import subprocess, time\n"
              f"child = subprocess.Popen(['sleep', '300'])\n"
              f"open({str(pids)!r}, 'w').write(str(child.pid))\ntime.sleep(300)\n"]
    start = time.monotonic()
    assert script.run_worker(worker, timeout=3) is None
    assert time.monotonic() - start < 30
    child = int(pids.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state in ("Z", "X"):
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        raise AssertionError("the worker's child outlived the timeout")
    done = script.run_worker([sys.executable, "-c", "print('ok')"], timeout=30)
    assert done.returncode == 0 and done.stdout == "ok\n"
