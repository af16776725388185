"""GPU host with two or more GPUs: one compiled model, ORT sessions on two devices, with and
without CUDA graphs (each device has its own session, capture stream and graphs)."""

from __future__ import annotations

import copy

import pytest
import torch

import kernel_lens as kl

from conftest import EXAMPLES, load_module

pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    x, y = (t.cuda(0) for t in module.example_inputs)
    compiled = kl.compile(copy.deepcopy(module.model), [x, y], dynamic_shapes=module.dynamic_shapes,
                          targets=["ort"], output_dir=tmp_path_factory.mktemp("multi"))
    return module, compiled


@pytest.mark.parametrize("mode", [False, "torch", "ort"])
def test_two_sessions_on_two_devices(toy, mode):
    module, compiled = toy
    streams = {d: torch.cuda.Stream(d) for d in ("cuda:0", "cuda:1")}  # ORT runs on torch's stream
    for step in range(3):  # alternate devices: modules are loaded once per CUDA context
        for device in ("cuda:0", "cuda:1"):
            for size in (1000, 4099):  # two shapes: two graphs per device in graph modes
                a = torch.randn(size + step, device=device)
                b = torch.randn(size + step, device=device)
                with torch.cuda.device(a.device), torch.cuda.stream(streams[device]):
                    got = compiled.run(a, b, cuda_graph=mode)
                    want = module.model(a, b)
                    torch.cuda.current_stream().synchronize()
                assert got.device == a.device
                assert torch.equal(got, want), (device, step, size)
                print(f"toy_two_kernels {device} size={size + step} cuda_graph={mode} "
                      f"max_abs_diff={(got - want).abs().max().item()!r}")
    runner = compiled.runner(cuda_graph=mode)
    devices = {index for index, _ in runner._sessions}
    assert devices == {0, 1}
    if mode:
        graphs = [g for s in runner._sessions.values() for g in s.graphs.values()]
        assert len(graphs) == 2 * 2 * 3  # per device, per shape (the sizes change each step)
        if mode == "torch":
            assert all(g.captured is not None for g in graphs)
