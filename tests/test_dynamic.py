"""``dynamic=True`` / ``--dynamic``: every input dim that can vary becomes dynamic (Dim.AUTO)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import InputError
from kernel_lens.frontends.lift import describe_dims

from conftest import CORPUS, EXAMPLES, ROOT, load_module


def test_dynamic_true_makes_free_dims_dynamic_and_pins_constexpr_dims():
    # rmsnorm: BLOCK_N = next_power_of_2(hidden) is a constexpr, so hidden must stay static;
    # batch and seq are free.
    module = load_module(CORPUS / "rmsnorm.py")
    x = module.example_inputs[0]
    ir = kl.compile(module.model, (x,), dynamic=True, arch=90).ir
    dims = {(ir.inputs[i.input], i.dim): (name, i) for name, i in ir.symbols.items()}
    assert set(dims) == {("x", 0), ("x", 1)}
    assert ir.values["x"].shape[2] == str(x.shape[2])
    for (_, d), (name, info) in dims.items():
        assert info.example == x.shape[d] and info.min >= 2
        assert name == f"x_{d}"
    assert ir.launches[0].grid[0] == "x_0*x_1"
    text = describe_dims(ir)
    assert "x_0 = x.shape[0] in [2, inf] (example 2)" in text
    assert "x_1 = x.shape[1] in [2, inf] (example 8)" in text


def test_dynamic_true_and_dynamic_shapes_together_are_refused():
    module = load_module(CORPUS / "vector_add.py")
    with pytest.raises(InputError, match="either dynamic=True or dynamic_shapes"):
        kl.compile(module.model, module.example_inputs, dynamic=True,
                   dynamic_shapes=module.dynamic_shapes, arch=90)


def test_dynamic_true_keeps_size_one_dims_static():
    module = load_module(EXAMPLES / "llama_block.py")
    (x,) = module.example_inputs
    assert x.shape[0] == 1
    ir = kl.compile(module.model, (x,), dynamic=True, arch=90).ir
    assert ir.values["x"].shape == ["1", "x_1", "64"]
    assert [(n, i.dim) for n, i in ir.symbols.items()] == [("x_1", 1)]


def test_cli_dynamic_prints_the_settled_ranges():
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "dump-ir",
                           str(CORPUS / "rmsnorm.py"), "--dynamic"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "dynamic dims (--dynamic):" in proc.stderr
    assert "x_1 = x.shape[1] in [2, inf]" in proc.stderr
    assert "x_1 = x.shape[1]" in proc.stdout  # the summary's symbol table
