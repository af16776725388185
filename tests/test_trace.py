"""Symbolic trace: every symbol tied to the right graph input and dimension."""

from __future__ import annotations

import torch

import kernel_lens as kl

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
