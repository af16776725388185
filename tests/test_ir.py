"""IR: JSON round-trip (property-tested), schema, versioning, validation."""

from __future__ import annotations

import base64
import json

import pytest
import sympy
from hypothesis import given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.errors import IRError
from kernel_lens.ir.kernel import DIGEST
from kernel_lens.ir import (SCHEMA_VERSION, GraphIR, evaluate, format_expr, json_schema,
                            parse, symbol)

from conftest import EXAMPLES, load_module

S = [symbol(n) for n in ("n", "seq", "s2")]
N = symbol("n")


@pytest.fixture(scope="module")
def toy() -> GraphIR:
    m = load_module(EXAMPLES / "toy_two_kernels.py")
    return kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes, arch=90).ir


def _exprs(symbols):
    return st.recursive(
    st.one_of(st.sampled_from(symbols), st.integers(-50, 2**40).map(sympy.Integer)),
    lambda inner: st.one_of(
        st.tuples(inner, inner).map(lambda t: t[0] + t[1]),
        st.tuples(inner, inner).map(lambda t: t[0] * t[1]),
        st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.floor(t[0] / t[1])),
        st.tuples(inner, st.integers(1, 512)).map(lambda t: sympy.ceiling(t[0] / t[1])),
        st.tuples(inner, st.integers(1, 64)).map(lambda t: sympy.Mod(t[0], t[1])),
        st.tuples(inner, inner).map(lambda t: sympy.Max(t[0], t[1])),
        st.tuples(inner, inner).map(lambda t: sympy.Min(t[0], t[1])),
    ), max_leaves=8)


exprs = _exprs(S)


@settings(max_examples=150, deadline=None)
@given(exprs, st.integers(0, 5000), st.integers(0, 5000), st.integers(0, 5000))
def test_expression_strings_round_trip(expr, a, b, c):
    text = format_expr(parse(format_expr(expr), ["n", "seq", "s2"]))
    again = parse(text, ["n", "seq", "s2"])
    assert format_expr(again) == text  # once normalized, the string is a fixed point
    values = {"n": a, "seq": b, "s2": c}
    assert evaluate(again, values) == evaluate(expr, values)


@settings(max_examples=40, deadline=None)
@given(grid=st.tuples(_exprs([N]), _exprs([N]), _exprs([N])))
def test_graph_json_round_trip_is_exact(toy, grid):
    ir = toy.model_copy(deep=True)
    ir.launches[0].grid = tuple(format_expr(g) for g in grid)
    text = ir.to_json()
    again = GraphIR.from_json(text)
    assert again == ir and again.to_json() == text


def test_required_json_shape_for_third_party_tools(toy):
    doc = json.loads(toy.to_json())
    assert doc["symbols"]["n"]["input"] == 0 and doc["symbols"]["n"]["dim"] == 0
    for launch in doc["launches"]:
        assert isinstance(launch["kernel"], str) and launch["kernel"] in doc["kernels"]
        assert len(launch["grid"]) == 3 and all(isinstance(g, str) for g in launch["grid"])
        sympy.sympify(launch["grid"][0])
        for arg in launch["args"]:
            assert arg["role"] in {"input", "output", "inplace", "scalar", "constexpr"}
            assert isinstance(arg["name"], str)


def test_schema_is_published_and_versioned():
    schema = json_schema()
    assert {"symbols", "launches", "kernels", "schema_version"} <= set(schema["properties"])
    assert SCHEMA_VERSION.startswith("1.")


def test_other_major_version_is_a_clear_error(toy):
    doc = json.loads(toy.to_json())
    doc["schema_version"] = "2.0"
    with pytest.raises(IRError, match="schema version 2.0 is not compatible"):
        GraphIR.from_json(json.dumps(doc))
    with pytest.raises(IRError, match="not valid JSON"):
        GraphIR.from_json("{")


def test_dangling_references_are_rejected(toy):
    doc = json.loads(toy.to_json())
    doc["launches"][0]["kernel"] = "missing_kernel"
    with pytest.raises(IRError, match="missing_kernel"):
        GraphIR.from_json(json.dumps(doc))
    doc = json.loads(toy.to_json())
    doc["launches"][0]["grid"][0] = "undeclared + 1"
    with pytest.raises(IRError, match="undeclared"):
        GraphIR.from_json(json.dumps(doc))


def test_cubin_survives_as_base64(toy):
    kernel = next(iter(toy.kernels.values()))
    doc = json.loads(toy.to_json())
    assert isinstance(doc["kernels"][kernel.id]["binaries"][0]["cubin"], str)
    again = GraphIR.from_json(json.dumps(doc))
    assert again.kernels[kernel.id].binaries[0].cubin == kernel.binaries[0].cubin
    assert kernel.binaries[0].cubin.startswith(b"\x7fELF")


def test_the_fingerprint_keys_every_byte_without_base64_encoding_them(toy):
    """Caches are keyed by GraphIR.fingerprint(): bytes (cubins, weights) enter as their sha256."""
    from kernel_lens.ir.graph import ConstantData
    key = toy.fingerprint()
    assert GraphIR.from_json(toy.to_json()).fingerprint() == key
    kernel = next(iter(toy.kernels.values()))
    binary = kernel.binaries[0]
    flipped = binary.model_copy(update={"cubin": binary.cubin[:-1] + bytes([binary.cubin[-1] ^ 1])})
    other = toy.model_copy(update={"kernels": {**toy.kernels, kernel.id: kernel.model_copy(
        update={"binaries": [flipped, *kernel.binaries[1:]]})}})
    assert other.fingerprint() != key
    weight = ConstantData(dtype="fp32", shape=[2], data=bytes(8))
    with_weight = toy.model_copy(update={"constants": {**toy.constants, "w_extra": weight}})
    changed = weight.model_copy(update={"data": bytes(7) + b"\x01"})
    assert with_weight.fingerprint() != key
    assert toy.model_copy(update={"constants": {**toy.constants, "w_extra": changed}}).fingerprint() \
        != with_weight.fingerprint()
    assert base64.b64encode(binary.cubin).decode()[:40] not in toy.model_dump_json(context=DIGEST)
