"""Issue 18, second round: loading and running an artifact folder (items 5, 8, 15, 16). Each test
reproduces an attack found on the CPU host and fails without the protection it names.

The folder is built from the session's shared toy IR with a tiny stand-in ONNX graph and a
stand-in library file: nothing here needs a compile of the plugin, a GPU, or opens a library."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import onnx
import pytest
import torch
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens.artifact_folder import MANIFEST
from kernel_lens.artifact_folder import write_manifest as _write_manifest
from kernel_lens.errors import ArtifactError, InputError, IRError
from kernel_lens.ir import GraphIR
from kernel_lens.runtime.ort import OrtModel
from kernel_lens.runtime.signature import CallSignature
from kernel_lens.targets.base import Target

from conftest import EXAMPLES, model_ir, reseal_manifest

LIB = "libkl_ToyModel_ort.so"


@pytest.fixture(scope="module")
def toy_ir() -> GraphIR:
    return model_ir(EXAMPLES / "toy_two_kernels.py")


def _stand_in_onnx(path: Path) -> None:
    """An ONNX graph with the output name OrtModel reads ('output_0'); never run."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])
    out = helper.make_tensor_value_info("output_0", TensorProto.FLOAT, ["n"])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["output_0"])], "g", [x], [out])
    onnx.save(helper.make_model(graph), str(path))


@pytest.fixture
def folder(toy_ir, tmp_path) -> Path:
    """An artifact folder as compile writes it: manifest, IR, ONNX and a plugin library."""
    out = tmp_path / "art"
    out.mkdir()
    toy_ir.save(out / "ToyModel.ir.json")
    _stand_in_onnx(out / "ToyModel.onnx")
    (out / LIB).write_bytes(b"\x7fELF stand-in, never opened")
    _write_manifest(out, toy_ir.name, {"ir": Path("ToyModel.ir.json"), "ort.onnx": Path("ToyModel.onnx"),
                                       "ort.library": Path(LIB)})
    return out


def _manifest(folder: Path, **artifacts: str) -> None:
    doc = json.loads((folder / MANIFEST).read_text())
    doc["artifacts"].update(artifacts)
    (folder / MANIFEST).write_text(json.dumps(doc))


@pytest.fixture
def cuda_ep(monkeypatch):
    """ORT reports a CUDA EP, so an OrtModel gets as far as its own checks on this CPU host."""
    import onnxruntime

    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [*real, "CUDAExecutionProvider"])


class _Echo(Target):
    """A target whose runner records the artifact paths a runner would open."""

    name = "echo_load"
    seen: dict = {}

    def build(self, ir, out_dir):
        return {}

    def runner(self, ir, artifacts, **options):
        _Echo.seen = dict(artifacts)
        return object()


kl.register_target(_Echo)


# --- item 5: bare artifact names reach the dynamic loader's search path ---------------------------
@pytest.mark.parametrize("form", [".", "", "./"])
def test_load_of_the_current_folder_stores_absolute_artifact_paths(folder, monkeypatch, form):
    monkeypatch.chdir(folder)
    model = kl.load(form)
    assert set(model.artifacts) == {"ir", "ort.onnx", "ort.library"}
    for kind, path in model.artifacts.items():
        assert path.is_absolute() and path.parent == folder.resolve(), (kind, path)
    assert model.artifacts["ort.library"] == folder.resolve() / LIB  # never the bare LIB


@pytest.mark.parametrize("form", [".", ""])
def test_runners_are_handed_absolute_paths(folder, monkeypatch, form):
    monkeypatch.chdir(folder)
    model = kl.load(form)
    model.artifacts["echo_load.library"] = model.artifacts["ort.library"]
    model.runner("echo_load")
    assert _Echo.seen == {"library": folder.resolve() / LIB}
    # A model put together by hand with a bare name gets it made absolute too.
    by_hand = kl.CompiledModel(model.ir, artifacts={"echo_load.library": Path(LIB)})
    by_hand.runner("echo_load")
    assert _Echo.seen["library"] == folder.resolve() / LIB


def test_ort_runner_refuses_a_relative_library_name(folder, monkeypatch):
    monkeypatch.chdir(folder)
    with pytest.raises(ArtifactError, match=rf"plugin library path '{LIB}' is not absolute"):
        OrtModel(kl.load(".").ir, folder / "ToyModel.onnx", LIB)


# --- item 15: the manifest as a link, checks re-done later, control characters ------------------
def test_manifest_that_is_a_link_is_refused(folder, tmp_path):
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text((folder / MANIFEST).read_text())  # a manifest that would load fine
    (folder / MANIFEST).unlink()
    os.symlink(elsewhere, folder / MANIFEST)
    with pytest.raises(ArtifactError, match=r"manifest .*kernel_lens.json' is a link"):
        kl.load(folder)


@pytest.mark.parametrize("kind", ["fifo", "folder"])
def test_manifest_that_is_not_a_regular_file_is_refused(folder, kind):
    (folder / MANIFEST).unlink()
    os.mkfifo(folder / MANIFEST) if kind == "fifo" else (folder / MANIFEST).mkdir()
    with pytest.raises(ArtifactError, match="kernel_lens.json"):  # and a fifo never blocks
        kl.load(folder)


def test_ir_swapped_for_a_link_after_the_checks_is_not_read(folder, tmp_path, monkeypatch, toy_ir):
    """The IR is swapped for a link out of the folder right after load() looked at it: what is
    read is checked on the open descriptor, so the swap is refused."""
    outside = tmp_path / "outside.ir.json"
    outside.write_text(toy_ir.to_json())
    ir_path = folder / "ToyModel.ir.json"
    real_is_file = Path.is_file

    def is_file_then_swap(self):
        answer = real_is_file(self)
        if self.name == ir_path.name and not os.path.islink(ir_path):
            ir_path.unlink()
            os.symlink(outside, ir_path)
        return answer

    monkeypatch.setattr(Path, "is_file", is_file_then_swap)
    with pytest.raises(ArtifactError, match="outside"):
        kl.load(folder)


def test_library_swapped_after_load_is_refused_when_the_runner_is_made(folder, tmp_path):
    model = kl.load(folder)
    model.artifacts["echo_load.library"] = model.artifacts["ort.library"]
    evil = tmp_path / "evil.so"
    evil.write_bytes(b"planted")
    (folder / LIB).unlink()
    os.symlink(evil, folder / LIB)
    with pytest.raises(ArtifactError, match=r"now resolves outside"):
        model.runner("echo_load")
    (folder / LIB).unlink()  # gone altogether
    with pytest.raises(ArtifactError, match="missing or not a regular file"):
        model.runner("echo_load")


def test_ort_rechecks_its_files_right_before_opening_them(folder, tmp_path, cuda_ep):
    model = kl.load(folder)
    runner = OrtModel(model.ir, model.artifacts["ort.onnx"], model.artifacts["ort.library"])
    evil = tmp_path / "evil.so"
    evil.write_bytes(b"planted")
    (folder / LIB).unlink()
    os.symlink(evil, folder / LIB)
    with pytest.raises(ArtifactError, match="plugin library .* changed since the model was loaded"):
        runner.session(0, 0)


def test_error_messages_escape_control_characters(folder, tmp_path):
    evil = tmp_path / "x\x1b[2J\x1b]0;owned\x07\nfake: ok"
    evil.mkdir()
    with pytest.raises(ArtifactError) as info:
        kl.load(evil)
    message = str(info.value)
    assert "\x1b" not in message and "\n" not in message and "\x07" not in message
    assert r"\x1b[2J" in message
    _manifest(folder, extra="lib\x1b[31m.so")  # a normalized name of a file that is not there
    with pytest.raises(ArtifactError, match="artifacts missing") as info:
        kl.load(folder)
    assert "\x1b" not in str(info.value) and r"lib\x1b[31m.so" in str(info.value)


# --- item 16: symbols read out of range, backend types, out= aliasing ------------------------------
@pytest.mark.parametrize("field,value,message", [
    ("input", 5, r"symbol 'n' reads input 5; the graph has 2 inputs"),
    ("input", -1, r"symbol 'n' reads input -1; the graph has 2 inputs"),
    ("dim", 3, r"symbol 'n' reads dim 3 of input 'x', which has rank 1"),
    ("dim", -1, r"symbol 'n' reads dim -1 of input 'x', which has rank 1"),
])
def test_symbol_reading_outside_the_inputs_is_refused_at_load(folder, toy_ir, field, value, message):
    doc = json.loads(toy_ir.to_json())
    doc["symbols"]["n"][field] = value
    with pytest.raises(IRError, match=message):
        GraphIR.from_json(json.dumps(doc))
    (folder / "ToyModel.ir.json").write_text(json.dumps(doc))
    reseal_manifest(folder)  # as a hostile folder's author would: past the sha256 check
    with pytest.raises(ArtifactError, match=message):
        kl.load(folder)


@pytest.mark.parametrize("backend", [["ort"], ("ort",), 1, b"ort"])
def test_backend_must_be_a_name(folder, backend):
    model = kl.load(folder)
    x = torch.zeros(8)
    with pytest.raises(InputError, match="backend must be a target name"):
        model.run(x, x, backend=backend)


def test_unknown_backend_is_an_input_error(folder):
    with pytest.raises(InputError, match="not built for backend 'nope'"):
        kl.load(folder).run(torch.zeros(8), torch.zeros(8), backend="nope")


def test_out_sharing_memory_with_an_input_is_refused(toy_ir):
    sig = CallSignature(toy_ir, device_type="cpu")
    x, y = torch.randn(64), torch.randn(64)
    shapes = sig.output_shapes(sig.symbol_values([x, y]))
    cpu = torch.device("cpu")
    with pytest.raises(InputError, match=r"out\[0\] shares memory with input 'x'"):
        sig.check_out([x], shapes, cpu, [x, y])
    buffer = torch.randn(96)
    a, overlapping = buffer[:64], buffer[32:]
    with pytest.raises(InputError, match=r"out\[0\] shares memory with input 'y'"):
        sig.check_out([overlapping], shapes, cpu, [x, a])
    sig.check_out([torch.empty(64)], shapes, cpu, [x, y])  # a separate tensor is fine
    halves = torch.randn(128)
    sig.check_out([halves[64:]], shapes, cpu, [halves[:64], y])  # adjacent, not overlapping
    strided = torch.randn(192)  # input x = every other element of [0, 128): it reaches 126
    with pytest.raises(InputError, match=r"out\[0\] shares memory with input 'x'"):
        sig.check_out([strided[64:128]], shapes, cpu, [strided[:128:2], y])
    sig.check_out([strided[127:191]], shapes, cpu, [strided[:128:2], y])  # just past its last element
    column = torch.randn(64, 3)  # a column view: 64 elements 3 apart
    with pytest.raises(InputError, match=r"out\[0\] shares memory with input 'y'"):
        sig.check_out([column.view(-1)[100:164]], shapes, cpu, [x, column[:, 0]])


def test_ort_run_checks_out_aliasing_before_ort_is_reached(folder, cuda_ep):
    model = kl.load(folder)
    runner = OrtModel(model.ir, model.artifacts["ort.onnx"], model.artifacts["ort.library"])
    runner.signature = CallSignature(model.ir, device_type="cpu")  # CPU tensors, as far as checks go
    x, y = torch.randn(64), torch.randn(64)
    with pytest.raises(InputError, match=r"out\[0\] shares memory with input 'y'"):
        runner.run(x, y, out=[y])


# --- item 8 (part): deeply nested JSON is an ArtifactError naming the file -------------------------
def test_deeply_nested_ir_is_an_artifact_error(folder):
    deep = "[" * 100_000 + "]" * 100_000
    with pytest.raises(IRError, match="nested too deeply"):
        GraphIR.from_json(deep)
    (folder / "ToyModel.ir.json").write_text(deep)
    reseal_manifest(folder)
    with pytest.raises(ArtifactError, match=r"ToyModel.ir.json.*nested too deeply"):
        kl.load(folder)
    (folder / "ToyModel.ir.json").write_text('{"schema_version": "1.2", "arch": ' + "9" * 5000 + "}")
    reseal_manifest(folder)
    with pytest.raises(ArtifactError, match=r"ToyModel.ir.json.*not valid JSON"):
        kl.load(folder)


def test_deeply_nested_manifest_is_an_artifact_error(folder):
    (folder / MANIFEST).write_text('{"artifacts": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(ArtifactError, match=r"kernel_lens.json' is not a valid manifest \(RecursionError"):
        kl.load(folder)


def test_a_manifest_naming_too_many_artifacts_is_refused(folder):
    _manifest(folder, **{f"extra{i}": "ToyModel.onnx" for i in range(100_000)})
    start = time.perf_counter()
    with pytest.raises(ArtifactError, match=r"names 100003 artifacts; a kernel_lens folder holds at most 64"):
        kl.load(folder)
    assert time.perf_counter() - start < 5


def test_an_input_written_in_place_sharing_memory_with_another_input_is_refused(toy_ir):
    """issue 30, item 10 (its CPU part): the same tensor passed as two inputs while the model
    updates one in place is refused before anything runs."""
    sig = CallSignature(toy_ir, device_type="cpu")
    x = torch.randn(64)
    with pytest.raises(InputError, match=r"input 'x' is written in place by the model and shares "
                                         r"memory with input 'y'"):
        sig.check_written_inputs([x, x], [0])
    base = torch.randn(96)
    with pytest.raises(InputError, match="input 'y' is written in place"):
        sig.check_written_inputs([base[:64], base[32:]], [1])
    sig.check_written_inputs([torch.randn(64), torch.randn(64)], [0, 1])  # separate tensors


def test_launch_settings_cuda_would_refuse_are_refused_at_load(toy_ir):
    doc = json.loads(toy_ir.to_json())
    binary = next(iter(doc["kernels"].values()))["binaries"][0]
    for field, value in (("num_warps", -4), ("shared_mem", -1), ("num_ctas", 0), ("num_warps", 64)):
        spoiled = json.loads(json.dumps(doc))
        next(iter(spoiled["kernels"].values()))["binaries"][0][field] = value
        with pytest.raises(IRError, match=rf"binaries\.0\.{field}"):
            GraphIR.from_json(json.dumps(spoiled))
    assert binary["num_warps"] >= 1


def test_the_ort_runner_reads_each_written_input_from_its_mutated_output(tmp_path, cuda_ep):
    # the graph's "mutated_<input>" outputs are what the runner copies back (or binds in place)
    from kernel_lens.onnx.lower import lower_to_onnx, save_onnx
    from conftest import CORPUS

    ir = model_ir(CORPUS / "inplace_input.py")
    path = tmp_path / "m.onnx"
    save_onnx(lower_to_onnx(ir), path)
    (tmp_path / "libm.so").write_bytes(b"\x7fELF stand-in, never opened")
    runner = OrtModel(ir, path, tmp_path / "libm.so")
    written = ir.inputs.index("y")
    assert [(m.output, m.input) for m in runner._mutated] == [("mutated_y", written)]
    assert runner.in_place == ["y"]
