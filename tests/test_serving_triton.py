"""Triton Inference Server export on a CPU-only host.

- Every corpus model and example, compiled with the ort target, is exported for both backends;
  each config.pbtxt is parsed with Triton's own protobuf schema (tritonclient's model_config_pb2)
  and checked field by field against the ONNX graph the server would run: input and output
  names in order, data types, dims (-1 where the graph has a symbol), batching; every file name
  in it resolves inside REPO/NAME/1 to a copy of the compiled artifact.
- A real tritonserver (PyPI nvidia-pytriton 0.7.0, fetched and cached by
  scripts/fetch_tritonserver.py) starts on a repository holding an exported python-backend model
  and two CPU toy models: the server stays live, the exported model's load fails with its own
  message that it needs a CUDA GPU and onnxruntime-gpu (never an import error), and the toy
  models answer HTTP (JSON and binary) and gRPC requests through the DLPack tensor path.
Serving the compiled model needs a GPU: tests/gpu/test_gpu_serving.py."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import json_format, text_format
from tritonclient.grpc import model_config_pb2 as mc

import kernel_lens as kl
from kernel_lens.errors import InputError, OutputPathError
from kernel_lens.serving import export_triton
from kernel_lens.serving.tritonserver import TritonServer, find_install

from conftest import ROOT, corpus_files, example_files, load_module, reseal_manifest

MODELS = {p.stem: p for p in [*corpus_files(), *example_files()]}
SERVING = ROOT / "tests" / "serving"
MODEL_PY = ROOT / "src" / "kernel_lens" / "serving" / "triton_python_model.py"
# ONNX element type -> Triton data type, written out here independently of kernel_lens.serving.
TRITON = {1: "TYPE_FP32", 2: "TYPE_UINT8", 3: "TYPE_INT8", 5: "TYPE_INT16", 6: "TYPE_INT32",
          7: "TYPE_INT64", 9: "TYPE_BOOL", 10: "TYPE_FP16", 11: "TYPE_FP64", 16: "TYPE_BF16"}
NEEDS_GPU = "needs a CUDA GPU and onnxruntime-gpu"


@pytest.fixture(autouse=True)
def _headers(ort_headers):
    """Compiling with the ort target builds the custom-op library: the ORT headers first."""
    return ort_headers


@pytest.fixture(scope="module", params=sorted(MODELS))
def compiled(request, tmp_path_factory):
    module = load_module(MODELS[request.param])
    out = tmp_path_factory.mktemp(f"kl_{request.param}")
    kl.compile(module.model, tuple(t.clone() for t in module.example_inputs),
               dynamic_shapes=getattr(module, "dynamic_shapes", None), arch=90,
               roles=getattr(module, "roles", None), targets=["ort"], output_dir=out)
    return request.param, out


def _parse(path: Path) -> mc.ModelConfig:
    return text_format.Parse(path.read_text(), mc.ModelConfig())


def _strings(message) -> list[str]:
    """Every string anywhere in a protobuf message (map keys included), through its JSON form."""
    def walk(value):
        if isinstance(value, dict):
            return [s for k, v in value.items() for s in [k, *walk(v)]]
        if isinstance(value, list):
            return [s for v in value for s in walk(v)]
        return [value] if isinstance(value, str) else []
    return walk(json_format.MessageToDict(message, preserving_proto_field_name=True))


def _expected(values) -> list[tuple[str, str, list[int]]]:
    out = []
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        out.append((v.name, TRITON[t.elem_type], dims or [1]))
    return out


def _served(tensors) -> list[tuple[str, str, list[int]]]:
    return [(t.name, mc.DataType.Name(t.data_type), list(t.dims)) for t in tensors]


def _check_files_inside(config: mc.ModelConfig, model_dir: Path) -> list[str]:
    """Every file-like string of the config names a file in model_dir/1, by a bare name."""
    names = [s for s in _strings(config) if re.search(r"\.(onnx|so|py|data)$", s)]
    for name in names:
        assert "/" not in name and not Path(name).is_absolute(), name
        path = (model_dir / "1" / name).resolve()
        assert path.is_file() and path.is_relative_to(model_dir.resolve()), name
    assert not any(s.startswith("/") for s in _strings(config))
    return names


@pytest.mark.parametrize("backend", ["onnxruntime", "python"])
def test_config_agrees_with_the_onnx_graph(compiled, backend, tmp_path):
    stem, out = compiled
    manifest = json.loads((out / "kernel_lens.json").read_text())["artifacts"]
    graph_path, library = out / manifest["ort.onnx"], out / manifest["ort.library"]
    graph = onnx.load(str(graph_path), load_external_data=False).graph
    if any(v.type.tensor_type.elem_type not in TRITON for v in [*graph.input, *graph.output]):
        with pytest.raises(InputError, match="has no data type for") as err:
            export_triton(out, tmp_path / "repo", backend=backend)
        bad = next(v.name for v in [*graph.input, *graph.output] if v.type.tensor_type.elem_type not in TRITON)
        assert repr(bad) in str(err.value)
        assert not (tmp_path / "repo" / manifest_name(out)).exists()
        return
    result = export_triton(out, tmp_path / "repo", backend=backend, instances=2)
    model_dir = tmp_path / "repo" / result.name
    assert result.model_dir == model_dir and result.config == model_dir / "config.pbtxt"
    config = _parse(model_dir / "config.pbtxt")

    assert config.name == result.name == json.loads((out / "kernel_lens.json").read_text())["name"]
    assert config.max_batch_size == 0
    assert _served(config.input) == _expected(graph.input)
    assert _served(config.output) == _expected(graph.output)
    assert [(g.count, g.kind) for g in config.instance_group] == [
        (2, mc.ModelInstanceGroup.KIND_GPU if backend == "onnxruntime" else mc.ModelInstanceGroup.KIND_AUTO)]
    names = _check_files_inside(config, model_dir)
    version = model_dir / "1"
    shared = f"{library.stem}_{hashlib.sha256(library.read_bytes()).hexdigest()[:12]}.so"
    assert (version / "model.onnx").read_bytes() == graph_path.read_bytes()
    assert (version / shared).read_bytes() == library.read_bytes()
    if backend == "onnxruntime":
        assert config.platform == "onnxruntime_onnx" and not config.backend
        assert config.default_model_filename == "model.onnx"
        assert list(config.model_operations.op_library_filename) == [shared]
        (cuda,) = config.optimization.execution_accelerators.gpu_execution_accelerator
        assert cuda.name == "cuda" and dict(cuda.parameters) == {"use_tf32": "0"}
        assert sorted(names) == sorted(["model.onnx", shared])
        assert not (version / "model.py").exists()
    else:
        assert config.backend == "python" and not config.platform
        params = {k: v.string_value for k, v in config.parameters.items()}
        assert params == {"FORCE_CPU_ONLY_INPUT_TENSORS": "no", "kernel_lens_onnx": "model.onnx",
                          "kernel_lens_op_library": shared, "kernel_lens_use_tf32": "0"}
        if not os.environ.get("MUTANT_UNDER_TEST"):  # mutmut's trampolines rewrite the module
            assert (version / "model.py").read_text() == MODEL_PY.read_text()
    assert sorted(p.name for p in version.iterdir()) == sorted(result.files)


def manifest_name(out: Path) -> str:
    return json.loads((out / "kernel_lens.json").read_text())["name"]


def _toy(tmp_path_factory):
    """The toy example, compiled with the ort target (its n is dynamic, 2..2^20)."""
    module = load_module(MODELS["toy_two_kernels"])
    out = tmp_path_factory.mktemp("kl_toy")
    kl.compile(module.model, module.example_inputs, dynamic_shapes=module.dynamic_shapes,
               targets=["ort"], output_dir=out)
    return out


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    return _toy(tmp_path_factory)


def test_batch_dim_only_when_asked_and_checked_against_the_symbol_range(toy, tmp_path, caplog):
    plain = _parse(export_triton(toy, tmp_path / "a").config)
    assert plain.max_batch_size == 0 and [list(t.dims) for t in plain.input] == [[-1], [-1]]
    with caplog.at_level("WARNING"):
        batched = _parse(export_triton(toy, tmp_path / "b", max_batch_size=8).config)
    assert "refuses requests with a batch smaller than 2" in caplog.text  # n was compiled for 2..
    assert batched.max_batch_size == 8
    for t in [*batched.input, *batched.output]:  # [n] is the batch dim alone: dims [1], reshape []
        assert list(t.dims) == [1] and t.HasField("reshape") and list(t.reshape.shape) == []
    with pytest.raises(InputError, match=r"exceeds the range of the batch dim 'n' \(2\.\.1048576\)"):
        export_triton(toy, tmp_path / "c", max_batch_size=(1 << 20) + 1)
    llama = load_module(MODELS["llama_block"])
    out = tmp_path / "llama"
    kl.compile(llama.model, llama.example_inputs, dynamic_shapes=llama.dynamic_shapes,
               targets=["ort"], output_dir=out)
    with pytest.raises(InputError, match=r"leading dims are x: 1, output_0: 1; export with --max-batch-size 0"):
        export_triton(out, tmp_path / "d", max_batch_size=4)  # its batch dim is the static 1


def test_names_are_validated_and_foreign_folders_kept(toy, tmp_path):
    repo = tmp_path / "repo"
    for bad in ("../evil", "a/b", "", ".hidden", "x" * 200, "name with space"):
        with pytest.raises(InputError, match="not a safe name.*pass --name"):
            export_triton(toy, repo, name=bad)
    assert not repo.exists() or not any(repo.iterdir())
    with pytest.raises(InputError, match="unknown Triton backend 'tensorflow'"):
        export_triton(toy, repo, backend="tensorflow")
    with pytest.raises(InputError, match="--instances must be a positive"):
        export_triton(toy, repo, instances=0)
    (repo / "mine" / "1").mkdir(parents=True)
    (repo / "mine" / "config.pbtxt").write_text("keep me")
    with pytest.raises(OutputPathError, match="was not written by kernel_lens export-triton"):
        export_triton(toy, repo, name="mine")
    assert (repo / "mine" / "config.pbtxt").read_text() == "keep me"
    # A re-export replaces its own folder whole: nothing of the other backend stays behind.
    export_triton(toy, repo, name="toy", backend="python")
    export_triton(toy, repo, name="toy", backend="onnxruntime")
    library, onnx_file = sorted(p.name for p in (repo / "toy" / "1").iterdir())
    assert re.fullmatch(r"libkl_ToyModel_ort_[0-9a-f]{12}\.so", library) and onnx_file == "model.onnx"
    assert sorted(p.name for p in repo.iterdir()) == ["mine", "toy"]  # no staging folder left


def test_two_models_of_one_class_name_share_no_library_name(toy, tmp_path):
    """A server finds an op library by its bare name and loads a name once: two models of one
    class name whose libraries differ get two names; the same library, one name."""
    other = tmp_path / "other"
    shutil.copytree(toy, other)
    manifest = json.loads((other / "kernel_lens.json").read_text())
    library = other / manifest["artifacts"]["ort.library"]
    library.write_bytes(library.read_bytes() + b"\0")  # another model's library, same class name
    reseal_manifest(other)
    repo = tmp_path / "repo"
    first, second = export_triton(toy, repo, name="first"), export_triton(other, repo, name="second")
    again = export_triton(toy, repo, name="again")
    names = [[lib for lib in e.files if lib.endswith(".so")] for e in (first, second, again)]
    assert names[0] == names[2] != names[1] and len(names[0]) == 1
    for export in (first, second, again):
        (lib,) = [f for f in export.files if f.endswith(".so")]
        config = _parse(export.config)
        assert list(config.model_operations.op_library_filename) == [lib]
        assert hashlib.sha256(export.files[lib].read_bytes()).hexdigest()[:12] in lib


def test_cli_export_triton(toy, tmp_path):
    cli = [sys.executable, "-m", "kernel_lens.cli", "export-triton"]
    proc = subprocess.run([*cli, str(toy), "-o", str(tmp_path / "repo"), "--name", "toy", "--instances", "3"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"config: {tmp_path / 'repo' / 'toy' / 'config.pbtxt'}" in proc.stdout
    # no trailing ':' when LD_LIBRARY_PATH is unset (an empty entry searches the current folder)
    assert (f"LD_LIBRARY_PATH={tmp_path / 'repo' / 'toy' / '1'}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"
            in proc.stderr)
    assert ":$LD_LIBRARY_PATH " not in proc.stderr
    form = proc.stderr.split("LD_LIBRARY_PATH=", 1)[1].split(" ", 1)[0]  # as a shell runs it
    for before, after in ((None, ""), ("/opt/lib", ":/opt/lib")):
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        if before:
            env["LD_LIBRARY_PATH"] = before
        shown = subprocess.run(["bash", "-c", f"LD_LIBRARY_PATH={form} bash -c 'echo $LD_LIBRARY_PATH'"],
                               capture_output=True, text=True, env=env).stdout.strip()
        assert shown == f"{tmp_path / 'repo' / 'toy' / '1'}{after}"
    assert _parse(tmp_path / "repo" / "toy" / "config.pbtxt").instance_group[0].count == 3
    bad = subprocess.run([*cli, str(toy), "-o", str(tmp_path / "repo"), "--name", "a/b"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "model name 'a/b' is not a safe name" in bad.stderr
    nowhere = subprocess.run([*cli, str(tmp_path / "nowhere"), "-o", str(tmp_path / "repo")],
                             capture_output=True, text=True, timeout=300)
    assert nowhere.returncode == 2 and "is not a kernel_lens output folder" in nowhere.stderr
    no_ort = tmp_path / "no_ort"
    subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile", str(MODELS["toy_two_kernels"]),
                    "-o", str(no_ort)], check=True, capture_output=True, timeout=600)
    refused = subprocess.run([*cli, str(no_ort), "-o", str(tmp_path / "repo")], capture_output=True,
                             text=True, timeout=300)
    assert refused.returncode == 2 and "--target ort" in refused.stderr


def _model_py(monkeypatch):
    """The python backend's model.py, imported with a stand-in for the stub's pb_utils module."""
    import importlib.util
    import types

    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("kl_triton_model_under_test", MODEL_PY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.TritonPythonModel()


def test_model_py_refuses_a_host_without_gpu_or_packages_with_its_own_message(monkeypatch, tmp_path):
    parameters = {"kernel_lens_onnx": {"string_value": "model.onnx"},
                  "kernel_lens_op_library": {"string_value": "libkl_M_ort.so"}}
    args = {"model_name": "m", "model_config": json.dumps({"parameters": parameters}), "model_version": "1",
            "model_repository": str(tmp_path), "model_instance_kind": "GPU", "model_instance_device_id": "0"}
    model = _model_py(monkeypatch)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # `import onnxruntime` raises ImportError
    with pytest.raises(RuntimeError, match=r"'m' needs a CUDA GPU and onnxruntime-gpu .*, and torch: .*onnxruntime"):
        model.initialize(args)
    monkeypatch.delitem(sys.modules, "onnxruntime")  # this host's onnxruntime (CPU) and torch (CPU)
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU .*placed this instance on GPU and torch sees 0 CUDA"):
        model.initialize(args)
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU .*placed this instance on CPU"):
        model.initialize({**args, "model_instance_kind": "CPU"})


# --- a real tritonserver ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def tritonserver():
    """nvidia-pytriton's tritonserver, fetched and cached by the repo's own script."""
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_tritonserver.py")],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    root = re.search(r"^TRITONSERVER_ROOT=(.+)$", proc.stdout, re.M).group(1)
    return find_install(root)


@pytest.fixture(scope="module")
def server(tritonserver, toy, tmp_path_factory):
    import shutil

    repo = tmp_path_factory.mktemp("repo")
    for name in ("toy_dlpack", "toy_numpy"):
        shutil.copytree(SERVING / name, repo / name)
    export_triton(toy, repo, backend="python")
    running = TritonServer.start(repo, install=tritonserver)
    try:
        yield running
    finally:
        running.stop()
    assert running.process.poll() is not None


def test_exported_python_model_fails_to_load_with_its_own_message(server):
    states = server.wait_models(["ToyModel", "toy_dlpack", "toy_numpy"])
    assert server.is_live()  # the failed model does not take the server down
    entry = states["ToyModel"]
    if entry["state"] == "READY":  # a GPU host with onnxruntime-gpu in the stub's environment
        return
    assert entry["state"] == "UNAVAILABLE"
    assert NEEDS_GPU in entry["reason"] and "RuntimeError" in entry["reason"], entry
    assert "ImportError" not in entry["reason"] and "ModuleNotFoundError" not in entry["reason"]
    assert "Triton placed this instance on CPU" in entry["reason"]  # KIND_AUTO with no GPU
    assert NEEDS_GPU in server.log()
    assert states["toy_dlpack"]["state"] == states["toy_numpy"]["state"] == "READY"


def _toy_inputs(module, rng, size):
    x = rng.standard_normal(size).astype(np.float32)
    h = rng.standard_normal((2, size)).astype(np.float16)
    n = rng.integers(-1000, 1000, size, dtype=np.int64)
    b = rng.integers(0, 2, size).astype(bool)
    arrays = {"x": x, "h": h, "n": n, "b": b}
    types = {"x": "FP32", "h": "FP16", "n": "INT64", "b": "BOOL"}
    return arrays, {"y": x + 1, "g": h * 2, "m": n * 3 - 1, "c": ~b}, [
        module.InferInput(k, list(a.shape), types[k]) for k, a in arrays.items()]


@pytest.mark.parametrize("protocol,binary", [("http", False), ("http", True), ("grpc", True)])
def test_toy_model_tensor_path_through_dlpack(server, protocol, binary):
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    module = httpclient if protocol == "http" else grpcclient
    url = server.url if protocol == "http" else server.grpc_url
    client = module.InferenceServerClient(url)
    rng = np.random.default_rng(7)
    for size in (1, 5, 1000, 4099):
        arrays, expected, inputs = _toy_inputs(module, rng, size)
        # Triton's HTTP JSON has no FP16: h and g travel as binary data even in JSON requests.
        http = (lambda name: {"binary_data": binary or name in "hg"}) if protocol == "http" else (lambda name: {})
        for tensor in inputs:
            tensor.set_data_from_numpy(arrays[tensor.name()], **http(tensor.name()))
        outputs = [module.InferRequestedOutput(k, **http(k)) for k in expected]
        result = client.infer("toy_dlpack", inputs, outputs=outputs)
        for name, want in expected.items():
            got = result.as_numpy(name)
            assert got.dtype == want.dtype and got.shape == want.shape, name
            np.testing.assert_array_equal(got, want)
    client.close()


def test_toy_model_through_numpy_depends_on_numpy(server):
    """The stub's NumPy path (as_numpy, pb_utils.Tensor(name, ndarray)) is right with NumPy 1.x
    and wrong with NumPy 2: the output arrives empty (0 bytes) or is refused for its size. That
    is why model.py passes tensors through DLPack."""
    import tritonclient.http as httpclient
    from tritonclient.utils import InferenceServerException

    client = httpclient.InferenceServerClient(server.url)
    x = np.array([1.0, 2.0, 3.0], np.float32)
    tensor = httpclient.InferInput("x", [3], "FP32")
    tensor.set_data_from_numpy(x)
    output = [httpclient.InferRequestedOutput("y", binary_data=True)]
    if int(np.__version__.split(".")[0]) < 2:
        np.testing.assert_array_equal(client.infer("toy_numpy", [tensor], outputs=output).as_numpy("y"), x + 1)
    else:
        try:
            result = client.infer("toy_numpy", [tensor], outputs=output)
        except InferenceServerException as exc:
            assert "output tensor shape does not match size of output" in str(exc)
        else:
            assert result.get_output("y")["parameters"]["binary_data_size"] == 0
    client.close()


def test_max_batch_size_at_the_dims_max_is_accepted_and_a_negative_one_refused(toy, tmp_path):
    at_max = _parse(export_triton(toy, tmp_path / "max", max_batch_size=1 << 20).config)
    assert at_max.max_batch_size == 1 << 20  # n was compiled for 2..2**20: the max itself is fine
    with pytest.raises(InputError, match=r"--max-batch-size must be 0 \(no batching\) or positive, got -1"):
        export_triton(toy, tmp_path / "neg", max_batch_size=-1)


def test_the_advised_library_path_survives_spaces_and_shell_characters(tmp_path):
    from types import SimpleNamespace

    from kernel_lens.serving.backends import OnnxRuntimeBackend

    model_dir = tmp_path / "my repo" / "it's $HOME; `x`"
    (model_dir / "1").mkdir(parents=True)
    (note,) = OnnxRuntimeBackend().deployment_notes(model_dir, SimpleNamespace(library_name="libkl_x_ort_0123456789ab.so"))
    form = note.split("LD_LIBRARY_PATH=", 1)[1].split(" (ONNX Runtime", 1)[0]
    for before, after in ((None, ""), ("/opt/lib", ":/opt/lib")):
        env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
        if before:
            env["LD_LIBRARY_PATH"] = before
        shown = subprocess.run(["bash", "-c", f"LD_LIBRARY_PATH={form} bash -c 'printf %s \"$LD_LIBRARY_PATH\"'"],
                               capture_output=True, text=True, env=env)
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout == f"{(model_dir / '1').absolute()}{after}"


def test_an_export_stages_outside_the_repository_and_clears_what_a_killed_one_left(toy, tmp_path, monkeypatch):
    """A server indexes every folder of its repository: an export killed half-way must leave none
    there (issue 30, item 5), and the next export removes its leftovers."""
    from kernel_lens.serving import export as export_module

    repo = tmp_path / "repo"
    repo.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    left_beside = tmp_path / f".kl-export-repo-toy-new-{dead.pid}-abc123"
    left_inside = repo / f".kl-export-repo-toy-old-{dead.pid}-def456"
    alive = tmp_path / f".kl-export-repo-toy-new-{os.getpid()}-ghi789"  # an export running now
    for folder in (left_beside, left_inside, alive):
        folder.mkdir()
    seen = []
    real = export_module.atomic_copy
    monkeypatch.setattr(export_module, "atomic_copy", lambda src, dst, **kw: seen.append(Path(dst)) or real(src, dst, **kw))
    export_triton(toy, repo, name="toy")
    assert seen and not any(p.is_relative_to(repo) for p in seen)  # written beside, then swapped in
    assert sorted(p.name for p in repo.iterdir()) == ["toy"]
    assert not left_beside.exists() and not left_inside.exists() and alive.exists()
