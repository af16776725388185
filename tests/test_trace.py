"""Symbolic trace: every symbol tied to the right graph input and dimension."""

from __future__ import annotations

import pytest
import torch
import triton

import kernel_lens as kl
from kernel_lens.errors import TraceError

from conftest import ROOT, load_module

m = load_module(ROOT / "tests" / "models" / "two_inputs.py")


def test_equal_sizes_at_trace_time_stay_distinct_and_grid_uses_second_input():
    x, y = torch.randn(100), torch.randn(100)  # equal at trace time, independent dims
    a, b = torch.export.Dim("a", min=2, max=4096), torch.export.Dim("b", min=2, max=4096)
    ir = kl.compile(m.SecondInputGrid(), (x, y), dynamic_shapes=({0: a}, {0: b}), arch=90).ir
    assert {k: (v.input, v.dim) for k, v in ir.symbols.items()} == {"a": (0, 0), "b": (1, 0)}
    (launch,) = ir.launches
    assert launch.grid[0] == "floor(b/32 + 31/32)"
    assert next(arg.expr for arg in launch.args if arg.name == "m") == "b"


def test_shared_dim_maps_to_first_input_that_has_it():
    x, y = torch.randn(7, 100), torch.randn(100)
    n = torch.export.Dim("n", min=2, max=4096)
    ir = kl.compile(m.SecondInputGrid(), (x, y), dynamic_shapes=({1: n}, {0: n}), arch=90).ir
    assert {k: (v.input, v.dim) for k, v in ir.symbols.items()} == {"n": (0, 1)}
    assert ir.values[ir.inputs[1]].shape == ["n"]


def test_static_model_has_no_symbols_and_constant_grids():
    ir = kl.compile(m.SecondInputGrid(), (torch.randn(100), torch.randn(100)), arch=90).ir
    assert ir.symbols == {}
    assert ir.launches[0].grid == ("4", "1", "1")


# --- guards torch.export cannot prove: deferred to runtime asserts, then checked here ----------
class _Guarded(torch.nn.Module):
    """Branches on a size condition: ``cond(n)`` decides the branch at trace time."""

    def __init__(self, cond):
        super().__init__()
        self.cond = cond

    def forward(self, x):
        from vector_add import add_kernel

        n = x.shape[0]
        y = x * 2 if self.cond(n) else x
        out = torch.empty_like(y)
        add_kernel[(triton.cdiv(n, 64),)](y, x, out, n, BLOCK_SIZE=64)
        return out


def _lift_guarded(cond, max_n=4096):
    load_module(ROOT / "tests" / "corpus" / "vector_add.py")
    dims = ({0: torch.export.Dim("n", min=2, max=max_n)},)
    return kl.lift(_Guarded(cond), (torch.randn(40),), dynamic_shapes=dims, arch=90)


def test_unprovable_but_true_guard_is_deferred_and_verified(caplog):
    # true for every n >= 1, but torch's range analysis cannot prove it (transformers' CUDA mask
    # code makes this very guard): the export is retried with deferred asserts, checked here
    with caplog.at_level("INFO", logger="kernel_lens.frontends.trace.export"):
        ir = _lift_guarded(lambda n: n * (8 + n - n % 8) > 1)
    assert "n" in ir.symbols and any(op.op == "aten.mul.Tensor" for op in ir.ops)
    assert "all hold over the declared ranges" in caplog.text


def test_deferred_guard_that_fails_in_range_is_an_error():
    # n % 8 != 3 holds at the example size (40) but not at n = 3, 11, ...: must not compile
    with pytest.raises(TraceError, match=r"fails at .*=3\b"):
        _lift_guarded(lambda n: n % 8 != 3 and n * (8 + n - n % 8) > 1)


class _Wrapped(torch.nn.Module):
    """torch.export wraps regions that turn autocast off or change grad mode (HF's rotary
    embedding does, on CUDA) in higher-order ops with a submodule body."""

    def __init__(self, enabled: bool = False):
        super().__init__()
        self.enabled = enabled

    @torch.no_grad()  # around the autocast region: a wrapper inside a wrapper, as in HF's RoPE
    def _rotary(self, x):
        with torch.autocast("cpu" if self.enabled else "cuda", enabled=self.enabled):
            e = x.float() * 2
            return e.cos(), e.sin()

    def forward(self, x, y):
        from vector_add import add_kernel

        c, s = self._rotary(x)  # the kernel reads the body's results directly
        out = torch.empty_like(c)
        add_kernel[(triton.cdiv(c.numel(), 256),)](c, s, out, c.numel(), BLOCK_SIZE=256)
        with torch.no_grad():
            return out + y


def test_autocast_off_and_grad_mode_regions_are_inlined():
    load_module(ROOT / "tests" / "corpus" / "vector_add.py")
    x, y = torch.randn(300), torch.randn(300)
    n = torch.export.Dim("n", min=2, max=4096)
    ir = kl.lift(_Wrapped(), (x, y), dynamic_shapes={"x": {0: n}, "y": {0: n}}, arch=90)
    ops = [op.op for op in ir.ops]
    assert {"aten.mul.Tensor", "aten.cos.default", "aten.sin.default", "aten.add.Tensor"} <= set(ops), ops
    from kernel_lens.onnx import lower_to_onnx

    lower_to_onnx(kl.default_pipeline().run(ir, kl.PassContext()))  # the launch reads IR values
    assert not any("wrap_with" in o for o in ops)
    assert len(ir.launches) == 1


def test_an_autocast_region_that_casts_is_refused_in_one_line():
    from kernel_lens.errors import UnsupportedKernelError

    load_module(ROOT / "tests" / "corpus" / "vector_add.py")
    x, y = torch.randn(300), torch.randn(300)
    with pytest.raises(UnsupportedKernelError, match="autocast region"):
        kl.lift(_Wrapped(enabled=True), (x, y), arch=90)


def test_a_deferred_guard_failing_at_one_size_deep_in_a_wide_range_is_found():
    """One bounded size: the check is exact over the range, not sampled (77003, the first size
    where it fails, is none of the sampled sizes of [2, 100000])."""
    with pytest.raises(TraceError, match=r"fails at .*=77003\b"):
        _lift_guarded(lambda n: ((n % 8 != 3) | (n < 77000)) and n * (8 + n - n % 8) > 1, max_n=100000)


class _Guarded2(torch.nn.Module):
    """A size condition on two inputs' sizes."""

    def __init__(self, cond):
        super().__init__()
        self.cond = cond

    def forward(self, x, z):
        from vector_add import add_kernel

        n = x.shape[0]
        y = x * 2 if self.cond(n, z.shape[0]) else x
        out = torch.empty_like(y)
        add_kernel[(triton.cdiv(n, 64),)](y, x, out, n, BLOCK_SIZE=64)
        return out


def test_a_deferred_guard_on_two_sizes_names_the_sizes_where_it_fails():
    """Two sizes: sampled; the error names the first sampled sizes where it fails (3, 3)."""
    load_module(ROOT / "tests" / "corpus" / "vector_add.py")
    dims = ({0: torch.export.Dim("n", min=2, max=4096)}, {0: torch.export.Dim("m", min=2, max=4096)})
    guard = _Guarded2(lambda n, m: ((n % 8 != 3) | (m % 8 != 3)) and n * (8 + n - n % 8) > 1)
    with pytest.raises(TraceError, match=r"fails at \w+=3, \w+=3\b"):
        kl.lift(guard, (torch.randn(40), torch.randn(24)), dynamic_shapes=dims, arch=90)
