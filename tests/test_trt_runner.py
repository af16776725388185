"""``run(backend="tensorrt")`` on a CPU-only host, with TensorRT-RTX's real builder (pinned wheels,
scripts/fetch_tensorrt_rtx.py): the runner loads the model's plugin library, builds an engine
from kernel_lens's ONNX with the IR's optimization profile, caches it by content, TensorRT
version and GPU, and finds it again in a new process without rebuilding. Running the engine
needs a CUDA GPU: without one the error says so. Executing an engine cannot be done in this
environment (TensorRT-RTX refuses the H200, the only GPU; no full TensorRT installs here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import KernelLensError

from conftest import EXAMPLES, eager_on_cpu, load_module
from test_trt_plugins import MODELS


def _compile(stem, folder, targets):
    m = load_module(MODELS[stem])
    return kl.compile(m.model, tuple(t.clone() for t in m.example_inputs),
                      dynamic_shapes=getattr(m, "dynamic_shapes", None), arch=90, targets=targets,
                      output_dir=folder)


SCRIPT = textwrap.dedent("""
    import json, sys, torch
    import kernel_lens as kl
    from kernel_lens.runtime import trt as krt

    model = kl.load(sys.argv[1])
    runner = model.runner("tensorrt")
    out = {"package": runner.trt.__name__, "version": runner.trt.__version__}
    path = runner.build_engine()
    out.update(engine=str(path), bytes=path.stat().st_size, mtime=path.stat().st_mtime_ns,
               key=runner.engine_key())
    krt.gpu_identity = lambda: "NVIDIA H200 sm_90"  # another GPU: another engine
    out["key_other_gpu"] = runner.engine_key()
    x = torch.ones(16)
    try:
        runner.run(x, x)
    except kl.KernelLensError as exc:
        out["run_error"] = str(exc)
    # CPU tensors through the model: the TensorRT graph is evaluated on the CPU (issue 38)
    out["cpu_run"] = [t.tolist() for t in model.run(x, 2 * x, backend="tensorrt")]
    print(json.dumps(out))
""")


def test_tensorrt_runner_builds_and_caches_an_engine(rtx, trt_headers, tmp_path):
    folder = tmp_path / "out"
    compiled = _compile("toy_two_kernels", folder, ["trt-v3"])
    assert compiled.backends() == ["trt-v3"]
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    env = {**os.environ, **rtx, "KERNEL_LENS_CACHE": str(tmp_path / "cache")}

    def once():
        proc = subprocess.run([sys.executable, str(script), str(folder)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout.splitlines()[-1])

    first, second = once(), once()
    assert first["package"] == "tensorrt_rtx_bindings" and first["version"].startswith("1.7")
    assert first["bytes"] > 1000 and str(tmp_path / "cache") in first["engine"]
    assert second["engine"] == first["engine"] and second["mtime"] == first["mtime"]  # cache hit
    assert first["key_other_gpu"] != first["key"]
    assert "needs a CUDA GPU" in first["run_error"]
    toy = load_module(EXAMPLES / "toy_two_kernels.py")
    want = eager_on_cpu(toy.model, (torch.ones(16), 2 * torch.ones(16)))
    assert first["cpu_run"] == [t.tolist() for t in want]


def test_backend_aliases_pick_the_built_target(trt_headers, ort_headers, tmp_path):
    both = _compile("vector_add", tmp_path / "a", ["trt-v3", "trt-v2"])
    with pytest.raises(KernelLensError, match=r"backend 'tensorrt' could be any of \['trt-v2', 'trt-v3'\]"):
        both.runner("tensorrt")
    with pytest.raises(KernelLensError, match=r"the TensorRT runner has none"):
        both.runner("trt-v3", cuda_graph=True)
    ort_only = _compile("vector_add", tmp_path / "b", ["ort"])
    with pytest.raises(KernelLensError, match=r"not built for backend 'tensorrt'.*targets=\['trt'\]"):
        ort_only.runner("tensorrt")


def test_without_tensorrt_the_error_says_what_to_install(monkeypatch):
    from kernel_lens.runtime import trt as krt

    for name in krt.PACKAGES:
        monkeypatch.setitem(sys.modules, name, None)  # import fails, as when not installed
    with pytest.raises(KernelLensError, match="pip install tensorrt .* or tensorrt-rtx"):
        krt.import_tensorrt()
