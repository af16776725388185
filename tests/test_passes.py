"""PassManager: ordering by requires/provides, checks, verification, timing, dumps, custom passes."""

from __future__ import annotations

import time

import pytest

import kernel_lens as kl
from kernel_lens.errors import PassError, PostconditionError, PreconditionError
from kernel_lens.ir import GraphIR
from kernel_lens.compiler import pass_context
from kernel_lens.passes import (Pass, PassContext, PassManager, PassResult, RoleInference,
                                default_pipeline, dump_to_dir, verify)

from conftest import EXAMPLES, load_module


@pytest.fixture(scope="module")
def toy_ir() -> GraphIR:
    m = load_module(EXAMPLES / "toy_two_kernels.py")
    return kl.lift(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes, arch=90)


def _pass(name, requires=(), provides=(), action=None):
    class P(Pass):
        def run(self, ir, ctx):
            if action:
                action(ir)
            return PassResult(ir, action is not None)
    P.name, P.requires, P.provides = name, frozenset(requires), frozenset(provides)
    return P()


def test_default_order_follows_dependencies():
    names = [p.name for p in default_pipeline().order()]
    assert names == ["role-inference", "grid-canonicalization", "specialization", "ptx-isa-clamp"]


def test_order_is_by_facts_not_insertion():
    pm = PassManager([_pass("c", requires={"b"}), _pass("b", requires={"a"}, provides={"b"}),
                      _pass("a", provides={"a"})])
    assert [p.name for p in pm.order()] == ["a", "b", "c"]


def test_missing_requirement_and_cycle_are_errors():
    with pytest.raises(PreconditionError, match="requires 'x'"):
        PassManager([_pass("a", requires={"x"})]).order()
    with pytest.raises(PassError, match="cycle"):
        PassManager([_pass("a", requires={"b"}, provides={"a"}),
                     _pass("b", requires={"a"}, provides={"b"})]).order()
    with pytest.raises(PassError, match="already"):
        PassManager([_pass("a"), _pass("a")])


def test_pipeline_runs_records_facts_timings_and_does_not_mutate_input(toy_ir):
    before = toy_ir.to_json()
    pm = default_pipeline()
    out = pass_context()  # the default context with a compiler
    start = time.perf_counter()
    ir = pm.run(toy_ir, out)
    wall = time.perf_counter() - start
    assert toy_ir.to_json() == before
    assert ir.passes_run == ["role-inference", "grid-canonicalization", "specialization",
                             "ptx-isa-clamp"]
    assert {"roles", "canonical-symbolic", "guarded-binaries"} <= set(ir.facts)
    assert [t.name for t in pm.timings] == ir.passes_run
    assert all(t.seconds >= 0 for t in pm.timings) and sum(t.seconds for t in pm.timings) <= wall


def test_pass_log_states_each_pass_time_in_milliseconds(toy_ir, caplog):
    import re

    pm = default_pipeline()
    with caplog.at_level("INFO", logger="kernel_lens.passes.base"):
        pm.run(toy_ir, pass_context())
    logged = {m.group(1): float(m.group(2)) for m in
              re.finditer(r"pass (\S+)\s+([0-9.]+) ms", caplog.text)}
    assert list(logged) == [t.name for t in pm.timings]
    for t in pm.timings:
        assert abs(logged[t.name] - t.seconds * 1e3) <= 0.051, (t, logged)


def test_custom_pass_inserted_from_python_with_dump_and_stop(toy_ir, tmp_path):
    seen = []

    def count_launches(ir):
        seen.append(len(ir.launches))
        ir.name = "renamed"
    pm = default_pipeline().add(_pass("count", requires={"roles"}, action=count_launches))
    assert [p.name for p in pm.order()][-1] == "count"
    pm = PassManager([_pass("count", requires={"roles"}, action=count_launches), RoleInference()])
    assert [p.name for p in pm.order()] == ["role-inference", "count"]
    dumps = []
    ir = pm.run(toy_ir, PassContext(), stop_after="count",
                dump_after=["count"], dump=lambda name, ir: dumps.append((name, ir.name)))
    assert seen == [2] and dumps == [("count", "renamed")]
    assert ir.passes_run == ["role-inference", "count"]
    pm2 = default_pipeline()
    pm2.run(toy_ir, pass_context(), dump_after=["role-inference"],
            dump=dump_to_dir(tmp_path))
    files = sorted(p.name for p in tmp_path.iterdir())
    assert files == ["01-role-inference.json"]
    assert GraphIR.load(tmp_path / files[0]).passes_run == ["role-inference"]


def test_invariants_are_verified_between_passes(toy_ir):
    def corrupt(ir):
        ir.launches[0].args = ir.launches[0].args[:-1]
    pm = PassManager([_pass("corrupt", action=corrupt)], verify=verify)
    with pytest.raises(PostconditionError, match="corrupt"):
        pm.run(toy_ir, PassContext())


def test_ensures_is_checked(toy_ir):
    class Liar(Pass):
        name, provides = "liar", frozenset({"roles"})

        def run(self, ir, ctx):
            return PassResult(ir, False)

        def ensures(self, ir):
            raise PostconditionError("liar did not set roles")
    with pytest.raises(PostconditionError, match="liar"):
        PassManager([Liar()]).run(toy_ir, PassContext())


def test_unknown_dump_or_stop_pass_is_an_error(toy_ir):
    with pytest.raises(PassError, match="no pass named 'nope'"):
        default_pipeline().run(toy_ir, PassContext(), stop_after="nope")


def test_canonical_is_cached_but_errors_name_each_place():
    from kernel_lens.errors import SymbolicError
    from kernel_lens.passes.grid_canonicalization import canonical

    assert canonical("2*(s + 1) - 2", ["s"], "here") == "2*s"
    assert canonical("2*(s + 1) - 2", ["s"], "there") == "2*s"
    for where in ("launch 0 grid", "tensor x shape"):
        with pytest.raises(SymbolicError, match=rf"^{where}: t \+ 1 uses \['t'\]"):
            canonical("t + 1", ["s"], where)


def _canonicalized(ir):
    from kernel_lens.passes.grid_canonicalization import GridCanonicalization

    out = RoleInference().run(ir.model_copy(deep=True), PassContext()).ir
    return GridCanonicalization().run(out, PassContext())


def test_canonicalization_is_reused_across_processes_without_sympy(toy_ir, monkeypatch):
    # a recompile asks the same questions: answered from the cache entry, sympy.simplify unused
    import sympy

    from kernel_lens.passes import grid_canonicalization as gc

    gc._canonical.cache_clear()
    first = _canonicalized(toy_ir)
    gc._canonical.cache_clear()  # as in a new process
    monkeypatch.setattr(sympy, "simplify", lambda *a, **k: pytest.fail("simplified again"))
    again = _canonicalized(toy_ir)
    assert again.ir.model_dump_json() == first.ir.model_dump_json()
    assert again.modified == first.modified


def test_unusable_canonicalization_entry_is_recomputed(toy_ir):
    import json

    from kernel_lens.passes import grid_canonicalization as gc
    from kernel_lens.toolchain import entry_cache

    first = _canonicalized(toy_ir).ir.model_dump_json()
    ir = RoleInference().run(toy_ir.model_copy(deep=True), PassContext()).ir
    names = ir.symbol_names()
    texts = [t for _, o, n in gc._fields(ir) for t in gc._texts(getattr(o, n))]
    for bad in ([], ["1"], list(range(len(texts))), "text", None):  # never applied
        entry_cache.write("canonical", gc._key(names, texts), json.dumps(bad).encode(), ".json")
        assert gc._cached_results(names, texts) is None
        gc._canonical.cache_clear()
        assert _canonicalized(toy_ir).ir.model_dump_json() == first


def test_failing_expressions_are_never_cached(toy_ir):
    from kernel_lens.errors import SymbolicError
    from kernel_lens.passes import grid_canonicalization as gc

    ir = RoleInference().run(toy_ir.model_copy(deep=True), PassContext()).ir
    launch = ir.launches[0]
    launch.grid = ("undeclared_dim + 1", "1", "1")
    names = ir.symbol_names()
    texts = [t for _, o, n in gc._fields(ir) for t in gc._texts(getattr(o, n))]
    for _ in range(2):
        with pytest.raises(SymbolicError, match=r"grid: undeclared_dim \+ 1 uses \['undeclared_dim'\]"):
            gc.GridCanonicalization().run(ir, PassContext())
        assert gc._cached_results(names, texts) is None


def test_order_without_networkx_matches_the_dependency_graph():
    class Make(Pass):
        def run(self, ir, ctx):
            return PassResult(ir, False)

    def make(name, requires=(), provides=()):
        return type(name, (Make,), {"name": name, "requires": frozenset(requires),
                                    "provides": frozenset(provides)})()

    pm = PassManager([make("late", requires={"b"}), make("b-maker", requires={"a"}, provides={"b"}),
                      make("free"), make("a-maker", provides={"a"})])
    assert [p.name for p in pm.order()] == ["free", "a-maker", "b-maker", "late"]
    pm.add(make("loop", requires={"c"}, provides={"a"}), after="late")
    pm.add(make("c-maker", requires={"b"}, provides={"c"}))
    with pytest.raises(PassError, match="cycle"):
        pm.order()


def test_before_places_a_pass_ahead_of_the_named_ones():
    pm = default_pipeline()
    pm.add(_pass("my-check"), before="specialization")
    names = [p.name for p in pm.order()]
    assert names.index("my-check") < names.index("specialization")
    pm.add(_pass("late"), after="specialization", before="ptx-isa-clamp")
    names = [p.name for p in pm.order()]
    assert names.index("specialization") < names.index("late") < names.index("ptx-isa-clamp")
    with pytest.raises(PassError, match="to run before unknown pass 'nope'"):
        PassManager([_pass("x")]).add(_pass("y"), before="nope").order()


def test_the_first_model_guide_s_pass_runs_as_written(capsys):
    """docs/first_model.md, section 5: its code block, executed against the toy example."""
    import re

    from conftest import EXAMPLES, ROOT, load_module

    text = (ROOT / "docs" / "first_model.md").read_text()
    section = text.split("## 5.", 1)[1].split("## 6.", 1)[0]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    toy = load_module(EXAMPLES / "toy_two_kernels.py")
    scope = {"model": toy.model, "example_inputs": toy.example_inputs,
             "dynamic_shapes": toy.dynamic_shapes}
    exec(compile(code, "first_model.md", "exec"), scope)
    out = capsys.readouterr().out
    assert "ToyModel: 2 launches" in out and "count-launches" in out
    names = [p.name for p in scope["pm"].order()]
    assert names.index("role-inference") < names.index("count-launches") < names.index("specialization")


def test_pass_options_are_declared_by_the_passes_and_checked_before_the_capture(monkeypatch):
    """Issue 28: options live on the pass that reads them; the manager refuses an unknown name or
    type and lets the pass refuse a bad value, before the front half runs."""
    import kernel_lens as kl
    import kernel_lens.frontends.lift as lift_module
    from kernel_lens.errors import PtxIsaError

    from conftest import EXAMPLES, load_module

    ir = model_ir_for_options()

    def never(*_):
        raise AssertionError("the capture ran")
    monkeypatch.setattr(lift_module, "capture", never)
    toy = load_module(EXAMPLES / "toy_two_kernels.py")
    for options, error, match in [
        ({"ptx_verison": "8.4"}, PassError, r"option 'ptx_verison' is read by no pass of the pipeline \(did you mean 'ptx_version'\?\); options: cuda_version, ptx_version"),
        ({"ptx_version": 8.4}, PassError, r"option 'ptx_version' of pass 'ptx-isa-clamp' must be a str, got float 8.4"),
        ({"cuda_version": "twelve"}, PtxIsaError, r"cuda_version 'twelve' is not of the form MAJOR.MINOR"),
    ]:
        with pytest.raises(error, match=match):
            kl.compile(toy.model, toy.example_inputs, options=options)
    pm = PassManager([_pass("x")])
    with pytest.raises(PassError, match="read by no pass"):
        pm.run(ir, PassContext(options={"ptx_version": "8.4"}))


def model_ir_for_options():
    from conftest import EXAMPLES, model_ir

    return model_ir(EXAMPLES / "toy_two_kernels.py")
