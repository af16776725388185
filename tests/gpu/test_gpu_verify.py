"""GPU host only: ``kernel_lens verify`` (issue 27 item 4) compares values, every Triton launch's
written tensors and timings, and names the first launch that differs; one artifact set built for
sm_80 and sm_90 (item 5) runs the device's own binary, bit-exact."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kernel_lens as kl
from kernel_lens.verify import verify

from conftest import CORPUS, EXAMPLES, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernel_lens.cli", "-q", *args], capture_output=True,
                          text=True, timeout=900)


def test_verify_compares_outputs_launches_and_times_on_the_gpu():
    proc = _cli("verify", str(EXAMPLES / "toy_two_kernels.py"))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    out = proc.stdout
    assert out.count("launches: 2 of 2 bit-exact") == 4, out
    assert out.count("bit-exact") >= 8 and "max abs 0," in out
    assert out.count(" ms, compiled ") == 4 and out.rstrip().endswith("result: ok")


def test_verify_names_the_first_launch_that_differs(tmp_path):
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    inputs = tuple(t.cuda() for t in module.example_inputs)
    compiled = kl.compile(module.model.cuda(), inputs, dynamic_shapes=module.dynamic_shapes,
                          output_dir=tmp_path / "toy", targets=["ort"])
    other = type(module.model)(scale=3.0).cuda()  # the second launch's scale differs
    report = verify(other, inputs, module.dynamic_shapes, compiled, ["x", "y"], cap=4096)
    text = report.text()
    print(text)
    assert not report.ok
    first = report.sets[0].launches
    assert first[0].exact and not first[1].exact
    assert "launches: 1 of 2 bit-exact" in text and "launch 1 (scale_relu_kernel) out_ptr: max abs" in text


def test_verify_says_why_a_model_split_by_size_is_not_compared_per_launch():
    proc = _cli("verify", str(CORPUS / "size_branches.py"))
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "launches not compared: per-launch results of a model split by size" in proc.stdout


def test_one_artifact_set_for_sm80_and_sm90_runs_the_sm90_binary_bit_exact(tmp_path):
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    inputs = tuple(t.cuda() for t in module.example_inputs)
    want = module.model.cuda()(*inputs)
    for archs, ran in (([80, 90], "sm_90"), ([80], "sm_80")):  # sm_80 alone: its PTX, JIT-compiled
        folder = tmp_path / f"toy_{'_'.join(map(str, archs))}"
        kl.compile(module.model, inputs, dynamic_shapes=module.dynamic_shapes, arch=archs,
                   output_dir=folder, targets=["ort"])
        probe = (f"import sys, torch; sys.path.insert(0, 'tests'); import kernel_lens as kl; "
                 f"from pathlib import Path; from conftest import load_module; "
                 f"m = load_module(Path({str(EXAMPLES / 'toy_two_kernels.py')!r})); "
                 f"x = tuple(t.cuda() for t in m.example_inputs); "
                 f"got = kl.load({str(folder)!r}).run(*x); want = m.model.cuda()(*x); "
                 f"print('EXACT', torch.equal(got, want))")
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                              env={**os.environ, "KERNEL_LENS_LOG_LAUNCHES": "1"})
        print(archs, proc.stdout, proc.stderr[-2000:])
        assert proc.returncode == 0, proc.stderr
        assert "EXACT True" in proc.stdout
        launched = [line for line in proc.stderr.splitlines() if line.startswith("kernel_lens: launch")]
        assert launched and all(f"arch={ran} " in line for line in launched), launched
    assert want is not None
