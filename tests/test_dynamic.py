"""``dynamic=True`` / ``--dynamic``: every input dim that can vary becomes dynamic (Dim.AUTO)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

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


# -------------------------------------------------------------- dynamic_shapes checked before any work
def _never_called(*_):
    raise AssertionError("the capture ran")


@pytest.mark.parametrize("shapes,match", [
    ({"x": {0: torch.export.Dim("n", min=2, max=64)}, "z": None}, r"names 'z', which forward does not take; its parameters: x, y"),
    (({0: torch.export.Dim("n", min=2, max=64)},), r"1 entries but there are 2 example inputs"),
    ({"x": (None, None)}, r"dynamic_shapes\['x'\] has 2 entries but the example input has 1 dims"),
    ({"x": {3: torch.export.Dim("n", min=2, max=64)}}, r"names dim 3, but the example input has 1 dims"),
    ({"x": {0: torch.export.Dim("n", min=100, max=200)}}, r"example input 'x' has size 1000 along dim 0, outside its Dim 'n' = \[100, 200\].*min=100, max=1000"),
])
def test_a_dynamic_shapes_mistake_is_one_line_before_the_capture(shapes, match, monkeypatch):
    import kernel_lens.frontends.lift as lift_module

    monkeypatch.setattr(lift_module, "capture", _never_called)
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    with pytest.raises(InputError, match=match) as err:
        kl.compile(module.model, module.example_inputs, dynamic_shapes=shapes)
    assert "\n" not in str(err.value)


def test_a_pass_name_typo_is_refused_before_the_capture(monkeypatch):
    import kernel_lens.frontends.lift as lift_module
    from kernel_lens.errors import PassError

    monkeypatch.setattr(lift_module, "capture", _never_called)
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    with pytest.raises(PassError, match=r"no pass named 'role-inferense' \(did you mean 'role-inference'\?\)"):
        kl.compile(module.model, module.example_inputs, dump_after=["role-inferense"])


MASK_MODEL = '''import torch, triton, triton.language as tl

@triton.jit
def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

class M(torch.nn.Module):
    def forward(self, x):
        sel = x[x > 0]
        out = torch.empty_like(sel)
        copy_kernel[(triton.cdiv(sel.numel(), 64),)](sel, out, sel.numel(), BLOCK=64)
        return out

model = M()
example_inputs = (torch.randn(100),)
dynamic_shapes = {"x": {0: torch.export.Dim("n", min=2, max=4096)}}
'''


def test_a_boolean_mask_selection_is_a_run_time_size(tmp_path):
    from conftest import eager_on_cpu
    from kernel_lens.model_file import load_model_file

    path = tmp_path / "mask_grid.py"
    path.write_text(MASK_MODEL)
    mf = load_model_file(path)
    c = kl.compile(mf.model, mf.example_inputs, dynamic_shapes=mf.dynamic_shapes)
    assert c.ir.runtime_symbols
    for x in (mf.example_inputs[0], torch.linspace(-1, 1, mf.example_inputs[0].numel())):
        got = c.run(x)
        assert got.shape == ((x > 0).sum(),) and torch.equal(got, eager_on_cpu(mf.model, (x,)))


class _HalfOfOdd(torch.nn.Module):
    """Its one input is 2n+1 long; the graph sizes a tensor by n (read as (size - 1) / 2)."""

    def forward(self, x):
        from vector_add import add_kernel

        n = (x.shape[0] - 1) // 2
        head = x[:n] * 3
        out = torch.empty(n)
        add_kernel[(triton.cdiv(n, 64),)](head, head, out, n, BLOCK_SIZE=64)
        return out


def test_a_size_read_from_a_derived_dim_is_computed_by_the_graph_at_every_size():
    from conftest import eager_on_cpu
    load_module(CORPUS / "vector_add.py")
    n = torch.export.Dim("n", min=2, max=64)
    model = _HalfOfOdd()
    c = kl.compile(model, (torch.randn(41),), dynamic_shapes=({0: 2 * n + 1},), arch=90)
    info = c.ir.symbols["n"]
    assert (info.scale, info.offset) == (2, 1)
    for size in (5, 41, 129):
        x = torch.randn(size)
        got = c.run(x)
        assert got.shape == ((size - 1) // 2,) and torch.equal(got, eager_on_cpu(model, (x,)))


@triton.jit
def _fill_index(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, offs.to(tl.float32) + tl.load(x_ptr) * 0, mask=offs < n)


class _PaddedDown(torch.nn.Module):
    """A buffer of (max(2n, 2m + 2) // 6) * 6 elements: sympy 1.14 called Max(2*n, 2*m + 2)/6 an
    integer (an even expression over 2 x 3), dropped the floor and sized it max(2n, 2m + 2)."""

    def forward(self, x, y):
        size = (max(2 * x.shape[0], 2 * y.shape[0] + 2) // 6) * 6
        out = torch.empty(size + 1, device=x.device)
        _fill_index[(triton.cdiv(size + 1, 64),)](x, out, size + 1, BLOCK=64)
        return out, x * 2, y * 2


def test_a_floor_sympy_would_drop_keeps_its_value_at_every_size():
    n, m = torch.export.Dim("n", min=1, max=64), torch.export.Dim("m", min=1, max=64)
    c = kl.compile(_PaddedDown(), (torch.randn(7), torch.randn(5)), dynamic_shapes=({0: n}, {0: m}), arch=90)
    for rows, cols in ((1, 1), (2, 1), (3, 4), (7, 2), (9, 9), (1, 5)):
        out = c.run(torch.randn(rows), torch.randn(cols))[0]
        size = (max(2 * rows, 2 * cols + 2) // 6) * 6
        assert out.shape == (size + 1,) and torch.equal(out, torch.arange(size + 1, dtype=torch.float32)), (rows, cols)
