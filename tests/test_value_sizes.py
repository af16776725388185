"""Host code that reads tensor values (issue 40): sizes from values are run-time symbols, and a
branch on a value is checked at run time (the other branch is a typed refusal naming the line).
Every case is compiled once and evaluated on the CPU against the eager model."""

import json
from pathlib import Path

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import InputError, IRError, UnsupportedKernelError, UntracedBranchError
from kernel_lens.ir import GraphIR

from conftest import eager_on_cpu, load_module

MODELS = load_module(Path(__file__).parent / "models" / "value_sizes.py")
SOURCE = Path(MODELS.__file__).read_text().splitlines()


def line_of(marker: str) -> str:
    return f"value_sizes.py:{next(i for i, l in enumerate(SOURCE, 1) if marker in l)}"


def mask(*bits):
    return torch.tensor(bits, dtype=torch.bool)


@pytest.fixture(scope="module")
def compiled():
    made = {}

    def get(name, *example):
        if name not in made:
            made[name] = (getattr(MODELS, name)(), kl.compile(getattr(MODELS, name)(), example))
        return made[name]
    return get


def test_a_nonzero_count_sets_the_grid_and_the_rows_at_run_time(compiled):
    x = torch.randn(8, 16)
    model, c = compiled("NonzeroRows", x, mask(1, 0, 1, 1, 0, 0, 1, 0))
    (name, info), = c.ir.runtime_symbols.items()
    assert (info.dim, info.example, info.min) == (0, 4, 1)
    assert c.ir.launches[0].grid[0] == name
    for bits in [(1, 0, 1, 1, 0, 0, 1, 0), (1, 1, 1, 1, 1, 1, 1, 1), (0, 0, 0, 0, 0, 0, 0, 1)]:
        got = c.run(x, mask(*bits))
        want = eager_on_cpu(model, (x, mask(*bits)))
        assert got.shape == (sum(bits), 16) and torch.equal(got, want)


def test_a_zero_count_the_example_never_took_is_refused_naming_the_branch(compiled):
    x = torch.randn(8, 16)
    _, c = compiled("NonzeroRows", x, mask(1, 0, 1, 1, 0, 0, 1, 0))
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-NONZERO")):
        c.run(x, mask(0, 0, 0, 0, 0, 0, 0, 0))


def test_an_item_used_as_a_size_follows_the_value(compiled):
    model, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    (name, info), = c.ir.runtime_symbols.items()
    assert info.dim is None and info.carrier and info.example == 12
    assert not c.ir.checks  # nothing branched on it
    for lengths in ([3, 4, 5], [100, 1, 5], [0, 0, 0], [1, 0, 0]):
        t = torch.tensor(lengths)
        got = c.run(t)
        assert got.shape == (sum(lengths),) and torch.equal(got, eager_on_cpu(model, (t,)))


def test_out_is_refused_for_an_output_shaped_by_values(compiled):
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    with pytest.raises(InputError, match="depends on tensor values"):
        c.run(torch.tensor([3, 4, 5]), out=[torch.empty(12)])


def test_a_branch_on_a_value_runs_the_traced_branch_and_refuses_the_other(compiled):
    x = torch.randn(100)
    model, c = compiled("ItemBranch", x, torch.zeros(100, dtype=torch.bool))
    assert [ch.where.split(": ")[0].endswith(line_of("BRANCH-ANY")) for ch in c.ir.checks] == [True]
    got = c.run(x, torch.zeros(100, dtype=torch.bool))
    assert torch.equal(got, eager_on_cpu(model, (x, torch.zeros(100, dtype=torch.bool))))
    other = torch.zeros(100, dtype=torch.bool)
    other[7] = True
    with pytest.raises(UntracedBranchError, match=line_of("BRANCH-ANY")):
        c.run(x, other)


def test_int_of_a_tensor_is_pinned_and_another_value_is_refused(compiled):
    model, c = compiled("IntSize", torch.tensor([3, 4, 5]))
    assert [ch.cond for ch in c.ir.checks] == [f"Eq({next(iter(c.ir.runtime_symbols))}, 12)"]
    t = torch.tensor([2, 5, 5])  # the same total: served
    assert torch.equal(c.run(t), eager_on_cpu(model, (t,)))
    with pytest.raises(UntracedBranchError, match=line_of("PINNED")):
        c.run(torch.tensor([1, 1, 5]))


def test_the_ir_keeps_sizes_and_checks_through_json(compiled):
    _, c = compiled("ItemBranch", torch.randn(100), torch.zeros(100, dtype=torch.bool))
    again = GraphIR.from_json(c.ir.to_json())
    assert again == c.ir and again.runtime_symbols and again.checks


def test_ir_refuses_run_time_symbols_that_read_nothing(compiled):
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    name = next(iter(c.ir.runtime_symbols))
    raw = c.ir.model_dump(mode="json")
    bad = dict(raw, runtime_symbols={name: {**raw["runtime_symbols"][name], "value": "nowhere"}})
    with pytest.raises(IRError, match="nowhere"):
        GraphIR.from_json(json.dumps(bad))
    bad = dict(raw, values={**raw["values"], f"{name}_carrier": {
        **raw["values"][f"{name}_carrier"], "shape": ["7", "0"]}})
    with pytest.raises(IRError, match="carrier"):
        GraphIR.from_json(json.dumps(bad))
    bad = dict(raw, checks=[{"order": 1, "cond": "Eq(zz9, 1)", "where": ""}])
    with pytest.raises(IRError, match="undeclared symbols"):
        GraphIR.from_json(json.dumps(bad))


def test_tensorrt_targets_refuse_sizes_from_values_in_one_line(compiled, tmp_path):
    from kernel_lens.targets.base import get_target
    _, c = compiled("ItemSize", torch.tensor([3, 4, 5]))
    with pytest.raises(UnsupportedKernelError, match="build --target ort") as info:
        get_target("trt-v3").build_until(c.ir, tmp_path, "lower")
    assert "\n" not in str(info.value)
