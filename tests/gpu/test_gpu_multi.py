"""GPU host with two or more GPUs: one compiled model, two ORT sessions on two devices."""

from __future__ import annotations

import copy

import pytest
import torch

import kernel_lens as kl

from conftest import EXAMPLES, load_module

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


def test_two_sessions_on_two_devices(tmp_path):
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    x, y = (t.cuda(0) for t in module.example_inputs)
    compiled = kl.compile(copy.deepcopy(module.model), [x, y], dynamic_shapes=module.dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path)
    for step in range(3):  # alternate devices: modules are loaded once per CUDA context
        for device in ("cuda:0", "cuda:1"):
            a = torch.randn(1000 + step, device=device)
            b = torch.randn(1000 + step, device=device)
            got = compiled.run(a, b)
            with torch.cuda.device(a.device):
                want = module.model(a, b)
            assert got.device == a.device
            assert torch.equal(got, want), (device, step)
    assert len(compiled._runner._sessions) == 2
