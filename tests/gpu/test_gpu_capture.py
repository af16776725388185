"""GPU host only: native capture of the whole corpus, checked against torch and against
Triton's own JIT (our AOT PTX must equal the PTX the JIT compiled for the same launch)."""

from __future__ import annotations

import copy

import pytest
import torch

import kernel_lens as kl
from kernel_lens.frontends.source import resolve_jit

from conftest import corpus_files, flatten, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _to_cuda(x):
    return x.cuda() if isinstance(x, torch.Tensor) else x


@pytest.mark.parametrize("name", [p.stem for p in corpus_files()])
def test_native_capture_matches_reference_and_jit(name):
    module = load_module(next(p for p in corpus_files() if p.stem == name))
    model = module.model
    if isinstance(model, torch.nn.Module):  # a copy: the CPU tests share this module object
        model = copy.deepcopy(model).cuda()
    inputs = tuple(_to_cuda(t).clone() for t in module.example_inputs)
    ref_inputs = tuple(t.clone() for t in module.example_inputs)  # torch reference on the CPU
    compiled = kl.compile(model, inputs, dynamic_shapes=module.dynamic_shapes)
    major, minor = torch.cuda.get_device_capability()
    assert compiled.ir.arch == major * 10 + minor
    rtol, atol = module.tolerance
    for got, want in zip(flatten(compiled.example_outputs), flatten(module.reference(*ref_inputs))):
        assert got.is_cuda
        want = want.cuda()
        if got.is_floating_point() and got.element_size() == 1:  # fp8: torch compares those bitwise only
            got, want = got.float(), want.float()
        torch.testing.assert_close(got, want, rtol=max(rtol, 1e-5), atol=max(atol, 1e-5))
    device = torch.cuda.current_device()
    for kernel in compiled.ir.kernels.values():
        if kernel.options.autotune_config is not None:
            assert kernel.options.autotune_choice == "benchmarked"
        jit = resolve_jit(kernel.source)
        jit_ptx = {k.asm["ptx"] for k in jit.device_caches[device][0].values()}
        ours = kernel.binaries[0]
        if any(d for l in compiled.ir.launches for d in l.dispatch if d.kernel == kernel.id) \
                and ours.ptx not in jit_ptx:
            continue  # a guard variant the example never launched: the JIT never compiled it
        assert ours.ptx in jit_ptx, f"{kernel.id}: AOT PTX differs from Triton's JIT PTX"


# --- launches through the handle kernel.warmup(...) returns -------------------------------------
import triton  # noqa: E402
from test_liger_capture import _softmax_kernel  # noqa: E402  (the fused-softmax tutorial's kernel)


def _warm(x, y):
    return _softmax_kernel.warmup(y, x, x.stride(0), y.stride(0), x.shape[0], x.shape[1],
                                  BLOCK_SIZE=triton.next_power_of_2(x.shape[1]), num_stages=2,
                                  num_warps=8, grid=(1,))


class _TutorialSoftmax(torch.nn.Module):
    """Triton's fused-softmax tutorial: warm the kernel up (here, or once before), read its
    registers and shared memory, launch the compiled handle."""

    handle = None

    def forward(self, x):
        n_rows, n_cols = x.shape
        y = torch.empty_like(x)
        kernel = self.handle if self.handle is not None else _warm(x, y)
        kernel._init_handles()
        assert kernel.n_regs > 0 and kernel.metadata.shared >= 0
        self.seen = kernel
        kernel[(n_rows, 1, 1)](y, x, x.stride(0), y.stride(0), n_rows, n_cols,
                               triton.next_power_of_2(n_cols), 2)
        return y


@pytest.mark.parametrize("prewarmed", [False, True])
def test_launch_through_warmup_handle_is_captured_natively(prewarmed):
    x = torch.randn(37, 100, device="cuda")
    model = _TutorialSoftmax()
    if prewarmed:  # warmed up outside the forward: read off Triton's record of the compilation
        model.handle = _warm(x, torch.empty_like(x))
    compiled = kl.compile(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("rows", min=2,
                                                                                   max=4096)}})
    torch.testing.assert_close(compiled.example_outputs, torch.softmax(x, -1))
    (launch,) = compiled.ir.launches
    assert launch.grid == ("rows", "1", "1") and tuple(launch.captured_grid) == (37, 1, 1)
    (kernel,) = compiled.ir.kernels.values()
    assert (kernel.options.num_warps, kernel.options.num_stages) == (8, 2)
    assert kernel.binaries[0].ptx == model.seen.asm["ptx"], "AOT PTX differs from the handle's"
