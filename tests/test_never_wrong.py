"""Issue 38: never a silently wrong model. The models that compiled wrong (a value computed from a
size inside a piece, a size-1 path, a kernel writing part of a buffer torch filled) and the partial
write patterns, each compiled on this CPU host and evaluated against eager (kernels in Triton's
interpreter on both sides) at every size tried in its declared range: all sizes up to 9 and around
each power of two up to the maximum."""

from __future__ import annotations

import pytest
import torch

import kernel_lens as kl
from kernel_lens.codegen.launch_io import launch_io
from kernel_lens.frontends.capture.recorder import capture

from conftest import ROOT, load_module

never_wrong = load_module(ROOT / "tests" / "models" / "never_wrong.py")


@pytest.fixture(scope="module", params=sorted(never_wrong.CASES))
def case(request):
    model, inputs, dims = never_wrong.CASES[request.param]
    compiled = kl.compile(model, tuple(t.clone() for t in inputs), dynamic_shapes=dims, arch=90)
    return request.param, model, inputs, compiled


def _at(inputs: tuple, rows: int) -> tuple:
    g = torch.Generator().manual_seed(rows)
    return (torch.randn(rows, inputs[0].shape[1], generator=g),)


def test_compiled_equals_eager_at_every_size_tried(case):
    name, model, inputs, compiled = case
    (symbol, info), = compiled.ir.symbols.items()
    scale = 2 if name == "strided_view_write" else 1
    tried = never_wrong.sizes_to_try(info.min, info.max)
    assert tried[0] == info.min and tried[-1] == info.max and len(tried) >= 9
    for size in tried:
        x = _at(inputs, size * scale)
        want = capture(model, tuple(t.clone() for t in x), 90).outputs
        got = compiled.run(*[t.clone() for t in x])
        assert torch.equal(got, want), (name, symbol, size, (got - want).abs().max())


def test_a_size_one_branch_and_a_table_of_sizes_are_pieces_of_their_own():
    """The size-1 path and each value of min(batch, 3) are traced where they hold (torch's 0/1
    assumption is off for a size declared to reach 1)."""
    def pieces(name):
        model, inputs, dims = never_wrong.CASES[name]
        ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
        return [p.when[0].ranges["batch"] for p in ir.pieces]
    assert pieces("size_one_fast_path") == [(1, 1), (2, 256)]
    assert pieces("table_scale") == [(1, 1), (2, 2), (3, 256)]


@pytest.mark.parametrize("name", ["partial_rotary", "zeros_first_rows", "every_other_row",
                                  "slice_write", "strided_view_write", "several_launches_one_buffer"])
def test_a_kernel_writing_part_of_a_buffer_takes_its_contents_in(name):
    """The launch node of every partial write reads the buffer's current contents (in/out): none
    is a fresh output, since torch wrote the buffer (or the kernel writes through a view)."""
    model, inputs, dims = never_wrong.CASES[name]
    ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
    for graph in ir.graphs():
        for launch in graph.launches:
            io = launch_io(graph, launch, "__v")
            assert io.outputs and all(io.copy_from[v] is not None for v, _ in io.outputs), \
                (name, launch.kernel, io.copy_from)


def test_a_kernel_filling_a_fresh_buffer_alone_is_still_a_fresh_output():
    """The other side of the rule: torch.empty written only by the kernel stays a fresh output
    (no copy of undefined contents into the node)."""
    model, inputs, dims = never_wrong.CASES["size_arithmetic"]
    ir = kl.compile(model, inputs, dynamic_shapes=dims, arch=90).ir
    launch = ir.graphs()[0].launches[0]
    io = launch_io(ir.graphs()[0], launch, "__v")
    assert [io.copy_from[v] for v, _ in io.outputs] == [None]
