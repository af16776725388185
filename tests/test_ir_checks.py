"""Hardening round 4 (issue 42, items 1-4): what an IR document's fields may say is checked when
it is loaded, typed and naming the field, before any C++ is generated from it. Each test takes a
real compiled IR, changes one field as a crafted or corrupted folder could, and fails without the
check it names."""

from __future__ import annotations

import json
import time

import pytest

from kernel_lens.errors import IRError
from kernel_lens.ir import GraphIR

from conftest import CORPUS, EXAMPLES, model_ir


@pytest.fixture(scope="module")
def desc_doc() -> dict:
    return json.loads(model_ir(CORPUS / "arg_tensor_descriptor.py").to_json())


@pytest.fixture(scope="module")
def toy_doc() -> dict:
    return json.loads(model_ir(EXAMPLES / "toy_two_kernels.py").to_json())


def _refused(doc: dict, match: str) -> None:
    with pytest.raises(IRError, match=match) as info:
        GraphIR.from_json(json.dumps(doc))
    assert str(info.value).splitlines()[0].startswith("IR ")  # one typed line first


def _copy(doc: dict) -> dict:
    return json.loads(json.dumps(doc))


def _binary(doc: dict, k: int = 0) -> dict:
    return next(iter(doc["kernels"].values()))["binaries"][k]


def test_the_unchanged_documents_load(desc_doc, toy_doc):
    for doc in (desc_doc, toy_doc):
        assert GraphIR.from_json(json.dumps(doc)).to_json() == GraphIR.from_json(json.dumps(doc)).to_json()


# --- item 1: tensor descriptors and TMA -----------------------------------------------------------
@pytest.mark.parametrize("dim", [2, 7, -1])
def test_a_descriptor_abi_dim_past_its_rank_is_refused(desc_doc, dim):
    doc = _copy(desc_doc)
    entry = next(a for a in _binary(doc)["abi"] if a["part"] == "shape")
    entry["dim"] = dim
    _refused(doc, rf"ABI parameter 'x_desc' \(shape\): dim {dim} outside the descriptor's rank 2")


def test_a_tma_block_longer_than_the_descriptor_rank_is_refused(desc_doc):
    doc = _copy(desc_doc)
    _binary(doc)["tensordesc_meta"][0]["block_size"] = [16, 32, 8]
    _refused(doc, r"TMA block size \[16, 32, 8\] for tensor descriptor 'x_desc' of rank 2")
    doc = _copy(desc_doc)
    _binary(doc)["tensordesc_meta"][0]["block_size"] = [16] * 9  # past any rank
    _refused(doc, r"tensordesc_meta\.0\.block_size")


def test_tma_metadata_for_another_number_of_descriptors_is_refused(desc_doc):
    doc = _copy(desc_doc)
    _binary(doc)["tensordesc_meta"].pop()
    _refused(doc, "tensordesc_meta has 1 entries for 2 tensor descriptors")


def test_a_tma_part_without_tma_metadata_is_refused(desc_doc):
    doc = _copy(desc_doc)
    _binary(doc)["tensordesc_meta"] = None
    _refused(doc, r"ABI parameter 'x_desc' \(tma\): a TMA descriptor is a CUtensorMap with TMA metadata")


def test_a_descriptor_argument_with_the_wrong_rank_is_refused(desc_doc):
    doc = _copy(desc_doc)
    arg = next(a for a in doc["launches"][0]["args"] if a["name"] == "x_desc")
    arg["desc_shape"] = arg["desc_shape"] + ["64"]
    _refused(doc, r"tensor descriptor 'x_desc' of rank 2 has 3 shape and 2 stride entries")


@pytest.mark.parametrize("change, match", [
    ({"name": "BM"}, r"ABI parameter 'BM' \(value\) is not a run-time parameter"),  # a constexpr
    ({"name": "nope"}, r"ABI parameter 'nope' \(value\) is not a run-time parameter"),
    ({"c_type": "float"}, r"a pointer's C type is void\*, not float"),
    ({"part": "stride", "dim": 0}, "only tensor descriptors have parts"),
    ({"hidden": True}, "hidden parameters are Triton's global_scratch and profile_scratch"),
])
def test_an_abi_entry_that_does_not_fit_the_signature_is_refused(desc_doc, change, match):
    doc = _copy(desc_doc)
    entry = next(a for a in _binary(doc)["abi"] if a["name"] == "b_ptr")
    entry.update(change)
    _refused(doc, match)


# --- item 2: cross-checks ---------------------------------------------------------------------
@pytest.mark.parametrize("arch", [-1, 0, 999, 2 ** 70])
def test_an_arch_outside_the_known_ones_is_refused_naming_the_field(toy_doc, arch):
    doc = _copy(toy_doc)
    doc["arch"] = arch
    _refused(doc, rf"invalid at arch: .*arch {arch} is not a GPU architecture kernel_lens builds for")
    doc = _copy(toy_doc)
    _binary(doc)["arch"] = arch
    _refused(doc, rf"invalid at kernels\.\w+\.binaries\.0\.arch: .*arch {arch} is not a GPU architecture")


def test_a_kernel_without_the_binaries_the_others_have_is_refused(toy_doc):
    doc = _copy(toy_doc)
    first, second = doc["kernels"]
    doc["kernels"][second]["binaries"] = []
    _refused(doc, rf"kernel '{second}' has no binaries; kernel '{first}' has binaries for sm_90")


def test_dispatch_and_assumption_names_that_name_nothing_are_refused(toy_doc):
    doc = _copy(toy_doc)
    launch = doc["launches"][0]
    launch["dispatch"] = [{"when": {"EVEN": True}, "kernel": launch["kernel"]}]
    _refused(doc, r"dispatch on \['EVEN'\], which are not guards of the launch")
    doc = _copy(toy_doc)
    _binary(doc)["assumptions"] = {"nope": {"aligned16": True}}
    _refused(doc, "assumptions names 'nope', which is not a parameter of the kernel")
    doc = _copy(toy_doc)
    _binary(doc)["assumptions"] = {"BLOCK_SIZE": {"divisible16": True}}
    _refused(doc, "assumptions names 'BLOCK_SIZE', which is not a run-time parameter of the kernel")
    doc = _copy(toy_doc)
    launch = doc["launches"][0]
    launch["guards"] = {"g": "n + ghost"}
    _refused(doc, r"guards uses undeclared symbols \['ghost'\]")
    doc = _copy(toy_doc)
    doc["launches"][0]["args"][0]["shape"] = ["ghost"]
    _refused(doc, r"argument 'x_ptr' uses undeclared symbols \['ghost'\]")
    doc = _copy(toy_doc)
    doc["launches"][0]["grid"][0] = "ghost + 1"
    _refused(doc, r"grid uses undeclared symbols \['ghost'\]")


def test_a_launch_argument_that_is_no_parameter_bound_twice_or_missing_is_refused(toy_doc):
    doc = _copy(toy_doc)
    doc["launches"][0]["args"][0]["name"] = "nope"
    _refused(doc, r"binds \['nope', .*; the kernel's parameters are \['x_ptr', ")
    doc = _copy(toy_doc)
    args = doc["launches"][0]["args"]
    args.append(dict(args[0]))
    _refused(doc, r"binds \['x_ptr', .*'x_ptr'\]; the kernel's parameters")
    doc = _copy(toy_doc)
    doc["launches"][0]["args"].pop()
    _refused(doc, "one argument each, in signature order")


@pytest.mark.parametrize("name, role, match", [
    ("x_ptr", "scalar", "a tensor parameter takes input or output or inplace"),
    ("n_elements", "input", "a scalar parameter takes scalar"),
    ("BLOCK_SIZE", "scalar", "a constexpr parameter takes constexpr"),
])
def test_a_role_the_parameter_kind_cannot_take_is_refused(toy_doc, name, role, match):
    doc = _copy(toy_doc)
    arg = next(a for a in doc["launches"][0]["args"] if a["name"] == name)
    arg["role"] = role
    _refused(doc, rf"argument {name!r} has role {role!r}; {match}")


# --- item 4: bounded costs ---------------------------------------------------------------------
@pytest.mark.parametrize("depth", [65, 300, 900, 100_000])
def test_a_deeply_nested_constexpr_is_refused_at_once(toy_doc, depth):
    doc = _copy(toy_doc)
    param = next(p for k in doc["kernels"].values() for p in k["params"] if p["kind"] == "constexpr")
    param["constexpr_value"] = "@@"
    text = json.dumps(doc).replace('"@@"', '{"items": [' * depth + "1" + "]}" * depth)
    start = time.perf_counter()
    with pytest.raises(IRError, match=r"nests \d+ levels deep; an IR nests at most 64|nested too deeply"):
        GraphIR.from_json(text)
    assert time.perf_counter() - start < 2 * max(1.0, len(text) / 1e6)


def test_a_wide_tuple_constexpr_loads_in_linear_time(toy_doc):
    """≤ 2 s per MB on an idle machine (0.8 s measured); twice the items cost about twice the time."""
    param = next(p for k in toy_doc["kernels"].values() for p in k["params"] if p["kind"] == "constexpr")
    took = []
    for n in (20_000, 40_000):
        doc = _copy(toy_doc)
        param = next(p for k in doc["kernels"].values() for p in k["params"] if p["kind"] == "constexpr")
        param["constexpr_value"] = {"items": [{"items": [1, 2, {"items": [3]}]}] * n}
        text = json.dumps(doc)
        start = time.perf_counter()
        GraphIR.from_json(text)
        took.append(time.perf_counter() - start)
        assert took[-1] < 6 * len(text) / 1e6  # 3x the bar: a loaded CI machine
    assert took[1] < 3.5 * took[0]


@pytest.mark.parametrize("change, match", [
    (lambda d: d["values"][d["outputs"][0]]["strides"].append("1"), r"1 dims but 2 strides"),
    (lambda d: d["launches"][0]["args"][0].update(strides=[]), r"argument 'x_ptr' has 1 dims but 0 strides"),
])
def test_shapes_and_strides_of_different_lengths_are_refused(toy_doc, change, match):
    doc = _copy(toy_doc)
    change(doc)
    _refused(doc, match)


def test_a_constant_whose_bytes_do_not_fill_its_shape_is_refused():
    import base64

    doc = json.loads(model_ir(EXAMPLES / "llama_block.py").to_json())
    name, const = next(iter(doc["constants"].items()))
    data = base64.b64decode(const["data"])
    const["data"] = base64.b64encode(data[:-4]).decode()
    _refused(doc, rf"constants\.{name}.*holds {len(data)} bytes, not {len(data) - 4}")
