"""GPU host only: the LLaMA-style example exported for Triton's python backend, served by a real
tritonserver (PyPI nvidia-pytriton, staged or fetched), loads READY on the GPU and answers
concurrent HTTP and gRPC requests, every one bit-identical to kernel_lens.load(DIR).run() in
this process and none lost: benchmarks/bench_triton_server.py at a small request count.

Needs on the host: onnxruntime-gpu, tritonclient[http,grpc] and the nvidia-pytriton wheel's
tritonserver (docs/serving.md lists the wheels to stage)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import ROOT, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_served_llama_block_is_bit_identical_to_compiled_run(tmp_path):
    bench = load_module(ROOT / "benchmarks" / "bench_triton_server.py")
    status = bench.main(["--out", str(tmp_path), "--requests", "48", "--clients", "4",
                         "--seqs", "16,37,128,512"])
    results = json.loads((tmp_path / "triton_server.json").read_text())
    assert results["model_state"]["state"] == "READY", results["model_state"]
    for protocol in ("http", "grpc"):
        served = results["served"][protocol]
        assert served["errors"] == 0 and served["lost"] == 0, served["first_errors"]
        assert served["answered"] == served["bit_identical"] == 48, served
        assert served["max_abs_diff"] == 0.0
        print(f"{protocol}: p50 {served['p50_ms']:.2f} ms, p99 {served['p99_ms']:.2f} ms, "
              f"{served['throughput_rps']:.1f} req/s; max_abs_diff=0")
    assert results["native"]["run"]["requests"] == 48
    assert status == 0
