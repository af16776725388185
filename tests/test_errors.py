"""Bad input gets a typed error naming the kernel and argument, and saying what to do."""

from __future__ import annotations

import importlib
import linecache
import sys
import textwrap

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import (UntracedBranchError, CaptureError, KernelLensError, KernelSourceError, TraceError,
                                UnsupportedKernelError)

from conftest import ROOT, eager_on_cpu, load_module

bad = load_module(ROOT / "tests" / "models" / "bad_kernels.py")
X = torch.randn(64)


def test_grid_depending_on_tensor_values_follows_them_at_run_time():
    # int(t.item()) as a grid: a run-time size (the graph computes it), not the example's value
    c = kl.compile(bad.ValueDependentGrid(), (X,), arch=90)
    assert c.ir.runtime_symbols and not c.ir.checks
    flipped = -X if (X > 0).sum() * 2 != X.numel() else X * 0 + 1
    assert torch.equal(c.run(flipped), eager_on_cpu(bad.ValueDependentGrid(), (flipped,)))


def test_control_flow_depending_on_tensor_values_runs_the_traced_branch_only():
    c = kl.compile(bad.ValueDependentBranch(), (X,), arch=90)
    assert c.ir.checks and all("bad_kernels.py" in ch.where for ch in c.ir.checks)
    other = X * 0 - 1 if X.sum() > 0 else X * 0 + 1
    with pytest.raises(UntracedBranchError, match=r"bad_kernels\.py:\d+"):
        c.run(other)


@pytest.mark.parametrize("model, match", [
    (bad.ListArgument, r"kernel copy_kernel: argument 'n' of type list: .*tuples, not lists"),
    (bad.TorchDtypeArgument, r"kernel copy_kernel: argument 'n' of type dtype: .*tl\.float32"),
    (bad.ObjectConstexpr, r"kernel copy_kernel: argument 'BLOCK': constexpr value .* of type "
                          r"function cannot be baked"),
])
def test_argument_kinds_tritons_jit_refuses_name_kernel_argument_and_fix(model, match):
    with pytest.raises(UnsupportedKernelError, match=match) as info:
        kl.compile(model(), (X,), arch=90)
    assert "\n" not in str(info.value)


def test_a_range_from_zero_traces_sizes_zero_and_one_alone_and_is_right_at_both():
    """Issue 38: torch reasons as if a dynamic size were >= 2; a Dim declared from 0 (example
    size 1) makes sizes 0 and 1 pieces of their own (traced static) and the rest one piece, and
    the compiled model, evaluated on the CPU, equals the copy at 0, 1, 2 and 64."""
    n = torch.export.Dim("n", min=0, max=64)
    compiled = kl.compile(bad.Copy(), (torch.randn(1),), dynamic_shapes=({0: n},), arch=90)
    assert [p.when[0].ranges["n"] for p in compiled.ir.pieces] == [(0, 0), (1, 1), (2, 64)]
    for size in (0, 1, 2, 64):
        x = torch.randn(size)
        assert torch.equal(compiled.run(x.clone()), x)


def test_forward_without_kernels():
    with pytest.raises(CaptureError, match="no @triton.jit kernel"):
        kl.compile(bad.NoKernel(), (X,), arch=90)


def test_kernel_without_retrievable_source(tmp_path):
    src = tmp_path / "vanishing_kernel.py"
    src.write_text(textwrap.dedent('''
        import torch, triton, triton.language as tl

        @triton.jit
        def vanishing(x_ptr, out_ptr, BLOCK: tl.constexpr):
            offs = tl.arange(0, BLOCK)
            tl.store(out_ptr + offs, tl.load(x_ptr + offs))

        class M(torch.nn.Module):
            def forward(self, x):
                out = torch.empty_like(x)
                vanishing[(1,)](x, out, BLOCK=16)
                return out
    '''))
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("vanishing_kernel")
        src.unlink()  # source gone after import, as with a deleted or zipped .pyc-only module
        linecache.clearcache()
        with pytest.raises(KernelSourceError, match="vanishing.*cannot be retrieved"):
            kl.compile(module.M(), (torch.randn(16),), arch=90)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("vanishing_kernel", None)


def test_unknown_role_override_target():
    with pytest.raises(UnsupportedKernelError, match="nope"):
        kl.compile(bad.Copy(), (X,), arch=90, roles={"nope": {"x_ptr": "input"}})
    with pytest.raises(UnsupportedKernelError, match="no parameter 'zz'"):
        kl.compile(bad.Copy(), (X,), arch=90, roles={"copy_kernel": {"zz": "input"}})


def test_every_error_is_a_kernel_lens_error():
    for cls in (CaptureError, TraceError, UnsupportedKernelError, KernelSourceError):
        assert issubclass(cls, KernelLensError)
