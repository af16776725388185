"""The run path on the CPU host: exact shape evaluators, backend choice through the targets'
runners, compile without a folder (content-addressed cache), save and load."""

from __future__ import annotations

import json

import pytest
import sympy
from hypothesis import given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.errors import KernelLensError
from kernel_lens.ir import evaluate, format_expr, parse, symbol
from kernel_lens.runtime.evaluate import evaluator
from kernel_lens.targets.base import Target, get_target

from conftest import EXAMPLES, load_module

n, m = symbol("n"), symbol("m")
leaf = st.one_of(st.sampled_from([n, m]), st.integers(-50, 300).map(sympy.Integer))
ints = st.recursive(leaf, lambda inner: st.one_of(
    st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
    st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
    st.tuples(inner, st.integers(1, 3)).map(lambda t: t[0] ** t[1]),
    st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.floor(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.ceiling(t[0] / t[1])),
    st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.Mod(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Min(t[0], t[1])),
    st.tuples(inner, inner).map(lambda t: sympy.Max(t[0], t[1])),
), max_leaves=8)


@settings(max_examples=400, deadline=None)
@given(expr=ints, nv=st.integers(0, 2 ** 62), mv=st.integers(0, 2 ** 40))
def test_evaluator_is_exact_for_any_size(expr, nv, mv):
    expr = parse(format_expr(expr))  # as the runtime sees it: read back from the IR
    try:
        want = evaluate(expr, {"n": nv, "m": mv})
    except KernelLensError:  # sympy may fold the strategy's output into a non-integer
        with pytest.raises(KernelLensError, match="not an integer"):
            evaluator(expr, ["n", "m"])([nv, mv])
        return
    assert evaluator(expr, ["n", "m"])([nv, mv]) == want


def test_evaluator_refuses_non_integer_results():
    with pytest.raises(KernelLensError):
        evaluator(n / 2, ["n"])([3])
    assert evaluator(n / 2, ["n"])([4]) == 2


toy = load_module(EXAMPLES / "toy_two_kernels.py")


@pytest.fixture(scope="module")
def cached(ort_headers):
    return kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                      targets=["ort"])


def test_compile_without_a_folder_builds_into_the_cache(cached):
    from kernel_lens.compiler import artifact_cache_dir

    root = artifact_cache_dir()
    assert cached.artifacts["ort.library"].is_file()
    assert cached.artifacts["ort.onnx"].resolve().is_relative_to(root.resolve())
    again = kl.compile(toy.model, toy.example_inputs, dynamic_shapes=toy.dynamic_shapes, arch=90,
                       targets=["ort"])
    assert again.artifacts == cached.artifacts  # same content key: the same folder, reused
    assert again.ir == cached.ir


def test_save_copies_the_artifacts_and_load_reads_them(cached, tmp_path):
    saved = cached.save(tmp_path / "saved")
    manifest = json.loads((tmp_path / "saved" / "kernel_lens.json").read_text())
    assert set(manifest["artifacts"]) == set(cached.artifacts)
    for kind, path in saved.artifacts.items():
        assert path.parent == tmp_path / "saved"
        assert path.read_bytes() == cached.artifacts[kind].read_bytes()
    loaded = kl.load(tmp_path / "saved", cuda_graph=True)
    assert loaded.ir == cached.ir and loaded.cuda_graph
    assert kl.load(cached.artifacts["ir"].parent).ir == cached.ir  # the cache folder loads too


def test_backend_choice(cached, monkeypatch):
    assert cached.backends() == ["ort"]
    with pytest.raises(KernelLensError, match="not built for backend 'trt-v3'"):
        cached.run(*toy.example_inputs, backend="trt-v3")
    bare = kl.CompiledModel(cached.ir)
    with pytest.raises(KernelLensError, match="no target was built"):
        bare.run(*toy.example_inputs)
    # The runner comes from the target (no backend names in the driver): a registered target's.
    seen = {}

    class Echo(Target):
        name = "echo"

        def build(self, ir, out_dir):
            return {}

        def runner(self, ir, artifacts, **options):
            seen.update(artifacts=artifacts, options=options)

            class R:
                def run(self, *tensors, out=None):
                    return ("echo", len(tensors))
            return R()

    kl.register_target(Echo)
    model = kl.CompiledModel(cached.ir, artifacts={**cached.artifacts, "echo.file": cached.artifacts["ir"]})
    with pytest.raises(KernelLensError, match="pick one with backend="):
        model.run(*toy.example_inputs)
    assert model.run(*toy.example_inputs, backend="echo", cuda_graph=True) == ("echo", 2)
    assert seen == {"artifacts": {"file": cached.artifacts["ir"]}, "options": {"cuda_graph": True}}


def test_ort_runner_without_cuda_ep_is_a_clear_error(cached):
    with pytest.raises(KernelLensError, match="CUDAExecutionProvider|onnxruntime-gpu"):
        cached.run(*toy.example_inputs)
    with pytest.raises(KernelLensError, match="unknown options"):
        get_target("ort").runner(cached.ir, {}, speed="fast")
