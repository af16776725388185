"""Issue 18 (second round): attacks on serving exports and the tritonserver launcher, each
reproduced here and refused with a typed one-line error. No GPU, no real tritonserver: the
launcher runs tests/serving/fake_tritonserver.py laid out as an nvidia-pytriton install.

- config.pbtxt injection through an artifact's file name (item 2);
- artifact names that clash with the files the export writes (item 3);
- an export marker that is a link (item 14); a corrupt ONNX graph (item 8);
- SIGTERM / SIGHUP on ``python -m kernel_lens.serving.tritonserver`` (item 9);
- a local impostor answering /v2/health/live, a child that exits, OS-picked ports (item 10);
- a planted, shared, linked or foreign ``work=`` folder (item 11).
"""

from __future__ import annotations

import http.server
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import onnx
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

import kernel_lens as kl
from kernel_lens.errors import ArtifactError, OutputPathError, ServerError
from kernel_lens.serving import export_triton, tritonserver
from kernel_lens.serving.backends import BackendConfig, CompiledArtifacts
from kernel_lens.serving.export import render_config
from kernel_lens.serving.interface import ModelInterface
from kernel_lens.serving.tritonserver import TritonInstall, TritonServer, group_sockets, listening_sockets

from conftest import EXAMPLES, ROOT, load_module, reseal_manifest
from test_serving_triton import _model_py

FAKE = ROOT / "tests" / "serving" / "fake_tritonserver.py"
MODEL_PY = ROOT / "src" / "kernel_lens" / "serving" / "triton_python_model.py"


# --- exports -----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def toy(tmp_path_factory, ort_headers):
    """The toy example compiled with the ort target, once; tests tamper with copies."""
    module = load_module(EXAMPLES / "toy_two_kernels.py")
    out = tmp_path_factory.mktemp("kl_toy")
    kl.compile(module.model, module.example_inputs, dynamic_shapes=module.dynamic_shapes,
               targets=["ort"], output_dir=out)
    return out


@pytest.fixture
def compiled(toy, tmp_path):
    copy = tmp_path / "compiled"
    shutil.copytree(toy, copy)
    return copy


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "kernel_lens.json").read_text())


def _rename_artifact(folder: Path, kind: str, new_name: str) -> None:
    """Rename an artifact and point the manifest at it, as an attacker with the folder can."""
    manifest = _manifest(folder)
    (folder / manifest["artifacts"][kind]).rename(folder / new_name)
    manifest["artifacts"][kind] = new_name
    (folder / "kernel_lens.json").write_text(json.dumps(manifest))


# The op library's name ends its config.pbtxt string and opens a second op_library_filename with
# an absolute path: '/' is written as the text-format escape \057 (a file name has no '/'), and
# the stem before the first '.' is still a safe name.
INJECTED = 'libkl_ToyModel_ort.so"\n  op_library_filename: "\\057tmp\\057evil\\056so'


@pytest.mark.parametrize("backend", ["onnxruntime", "python"])
def test_a_library_name_cannot_inject_config_fields(compiled, tmp_path, backend):
    _rename_artifact(compiled, "ort.library", INJECTED)
    with pytest.raises(ArtifactError, match=r"library file name .* is not a plain file name") as err:
        export_triton(compiled, tmp_path / "repo", name="toy", backend=backend)
    assert "\n" not in str(err.value).replace(repr(INJECTED), "")  # one line (the name is repr'd)
    assert not (tmp_path / "repo" / "toy").exists()


def test_config_strings_are_escaped_as_protobuf_text(tmp_path):
    """Every string in config.pbtxt is a protobuf text literal: whatever it holds, the parser
    reads back that one string, and comment lines stay comments."""
    evil = 'x"\n}\nparameters { key: "k2" value: { string_value: "\\057bin" } }\n# \\'
    source = CompiledArtifacts(name='Model\nname: "other"', onnx=tmp_path / "m.onnx", onnx_data={},
                               library=tmp_path / "lib.so")
    config = BackendConfig(instance_kind="KIND_GPU", platform="onnxruntime_onnx",
                           default_model_filename="model.onnx", parameters={"k": evil},
                           cuda_options={"use_tf32": evil}, op_libraries=[evil],
                           notes=['note\nop_library_filename: "/tmp/evil.so"'])
    interface = ModelInterface(max_batch_size=0, batch_symbol=None, inputs=[], outputs=[])
    text = render_config("toy", source, interface, config, "onnxruntime", 1)
    parsed = text_format.Parse(text, mc.ModelConfig())
    assert parsed.name == "toy"
    assert list(parsed.model_operations.op_library_filename) == [evil]
    assert {k: v.string_value for k, v in parsed.parameters.items()} == {"k": evil}
    (cuda,) = parsed.optimization.execution_accelerators.gpu_execution_accelerator
    assert dict(cuda.parameters) == {"use_tf32": evil}




@pytest.mark.parametrize("key,value", [("kernel_lens_op_library", "/tmp/evil.so"),
                                       ("kernel_lens_op_library", "../../evil.so"),
                                       ("kernel_lens_onnx", "../other/model.onnx"),
                                       ("kernel_lens_op_library", ".hidden.so")])
def test_model_py_opens_only_plain_file_names_of_its_folder(monkeypatch, tmp_path, key, value):
    """Defence in depth: a config.pbtxt naming a library elsewhere never reaches dlopen."""
    parameters = {"kernel_lens_onnx": "model.onnx", "kernel_lens_op_library": "libkl_M_ort.so", key: value}
    args = {"model_name": "m", "model_version": "1", "model_repository": str(tmp_path),
            "model_instance_kind": "GPU", "model_instance_device_id": "0",
            "model_config": json.dumps({"parameters": {k: {"string_value": v} for k, v in parameters.items()}})}
    with pytest.raises(RuntimeError, match=rf"parameter {key} is .*not a plain file name"):
        _model_py(monkeypatch).initialize(args)


@pytest.mark.parametrize("backend,kind,clash", [("python", "ort.library", "model.py"),
                                                ("onnxruntime", "ort.library", "model.onnx"),
                                                ("python", "ort.library", "model.onnx")])
def test_an_artifact_named_like_an_export_file_is_refused(compiled, tmp_path, backend, kind, clash):
    _rename_artifact(compiled, kind, clash)
    with pytest.raises(ArtifactError, match=rf"the op library '{re.escape(clash)}' is not named as a shared library"):
        export_triton(compiled, tmp_path / "repo", name="toy", backend=backend)
    assert not (tmp_path / "repo" / "toy").exists()


def test_an_external_data_file_named_like_the_graph_is_refused(compiled, tmp_path):
    graph_path = compiled / _manifest(compiled)["artifacts"]["ort.onnx"]
    model = onnx.load(str(graph_path))
    tensor = onnx.TensorProto(name="w", data_type=onnx.TensorProto.FLOAT, dims=[1],
                              data_location=onnx.TensorProto.EXTERNAL)
    tensor.external_data.add(key="location", value="model.onnx")
    model.graph.initializer.append(tensor)
    onnx.save(model, str(graph_path))
    (compiled / "model.onnx").write_bytes(b"\0\0\0\0")
    reseal_manifest(compiled)  # past load's sha256 check, to the export's own
    with pytest.raises(ArtifactError, match=r"the external data file .*model\.onnx of .* is named "
                                            r"'model.onnx', as is the ONNX graph's copy model.onnx"):
        export_triton(compiled, tmp_path / "repo", name="toy", backend="python")
    assert not (tmp_path / "repo" / "toy").exists()


def test_a_marker_link_does_not_make_a_user_folder_an_export(toy, tmp_path):
    repo = tmp_path / "repo"
    export_triton(toy, repo, name="earlier")
    mine = repo / "mine"
    mine.mkdir()
    (mine / "config.pbtxt").write_text("keep me")
    (mine / "kernel_lens_export.json").symlink_to(repo / "earlier" / "kernel_lens_export.json")
    with pytest.raises(OutputPathError, match=r"mine exists and was not written by kernel_lens "
                                              r"export-triton .*a link does not count"):
        export_triton(toy, repo, name="mine")
    assert (mine / "config.pbtxt").read_text() == "keep me"
    export_triton(toy, repo, name="earlier")  # a real marker still lets an export replace its own


@pytest.mark.parametrize("data", [b"\xff\xfe not protobuf \x00\x01", b""])
def test_a_corrupt_onnx_graph_is_one_typed_line(compiled, tmp_path, data):
    graph_path = compiled / _manifest(compiled)["artifacts"]["ort.onnx"]
    graph_path.write_bytes(data)
    reseal_manifest(compiled)
    with pytest.raises(ArtifactError, match=r"recompile") as err:
        export_triton(compiled, tmp_path / "repo", name="toy")
    assert str(graph_path) in str(err.value) and "\n" not in str(err.value)


# --- the tritonserver launcher -----------------------------------------------------------------

@pytest.fixture
def install(tmp_path) -> TritonInstall:
    """fake_tritonserver.py laid out as an unpacked nvidia-pytriton wheel."""
    root = tmp_path / "fake_install"
    server = root / "pytriton" / "tritonserver"
    (server / "bin").mkdir(parents=True)
    binary = server / "bin" / "tritonserver"
    binary.write_text(f"#!{sys.executable}\n" + FAKE.read_text())
    binary.chmod(0o755)
    (server / "backends" / "python").mkdir(parents=True)
    stub = server / "python_backend_stubs" / f"{sys.version_info.major}.{sys.version_info.minor}"
    stub.mkdir(parents=True)
    (stub / "triton_python_backend_stub").write_text("")
    (root / "nvidia_pytriton.libs").mkdir()
    return TritonInstall(root)


@pytest.fixture
def repo(tmp_path) -> Path:
    (tmp_path / "repo").mkdir()
    return tmp_path / "repo"


@pytest.fixture
def pids(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "pids"
    monkeypatch.setenv("FAKE_TRITONSERVER_PIDS", str(path))
    return path


def _alive(pid: int) -> bool:
    """A process that exists and is not a zombie (an unreaped child counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_dead(pids: list[int], timeout: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()]


@pytest.fixture
def impostor():
    """Another local process's HTTP server on 127.0.0.1 that answers /v2/health/live with 200."""
    class Live(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Live)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def _refused(error, match: str, repo: Path, **options):
    """The pytest.raises of a start() that must fail; a server that starts anyway is stopped."""
    with pytest.raises(error, match=match) as err:
        server = TritonServer.start(repo, **options)
        server.stop()
    return err


def test_start_is_live_only_through_its_own_child_on_os_picked_ports(install, repo, pids):
    server = TritonServer.start(repo, install=install, wait=30)
    try:
        server_pid, stub_pid = _read_pids(pids)
        assert server.process.pid == server_pid and server.is_live()
        assert len({server.http_port, server.grpc_port, 8000, 8001}) == 4  # picked by the OS
        for port in (server.http_port, server.grpc_port):
            held = listening_sockets(port)
            assert held and held <= group_sockets(server_pid)
        work = server.work
    finally:
        server.stop()
    assert not server.is_live() and _wait_dead([server_pid, stub_pid]) == []
    assert not work.exists()


def test_an_impostor_on_a_given_port_is_refused(install, repo, pids, impostor, monkeypatch):
    monkeypatch.setenv("FAKE_TRITONSERVER_MODE", "idle")  # the real server could not bind it
    _refused(ServerError, rf"port {impostor} on 127.0.0.1 is in use by another process", repo,
             install=install, http_port=impostor, wait=10)
    assert not pids.exists()  # refused before anything started
    # The port taken between the check and the child's bind (an OS-picked port, too): the
    # impostor answers live, but it is not the child's, so start() fails and stops the child.
    monkeypatch.setattr(tritonserver, "check_port_free", lambda port, option: None)
    err = _refused(ServerError, rf"HTTP port {impostor} on 127.0.0.1 is held by another process, "
                                rf"not by the tritonserver started here", repo,
                   install=install, http_port=impostor, wait=10)
    child = int(re.search(r"\(pid (\d+)\)", str(err.value)).group(1))
    assert _wait_dead([child, *(_read_pids(pids) if pids.exists() else [])]) == []


def test_a_child_that_exits_is_a_typed_error_and_leaves_nothing(install, repo, monkeypatch, tmp_path):
    monkeypatch.setenv("FAKE_TRITONSERVER_MODE", "exit")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the work folder goes
    err = _refused(ServerError, r"exited with status 1 before it was live; its log ends: "
                                r".*failed to start HTTP service", repo, install=install, wait=10)
    assert "\n" not in str(err.value)
    assert not list(tmp_path.glob("kl_tritonserver_*"))


def _private_empty(path: Path) -> Path:
    path.mkdir(mode=0o700)
    return path


@pytest.mark.parametrize("case", ["planted", "shared", "link", "foreign", "file"])
def test_a_work_folder_must_be_private_empty_and_real(install, repo, pids, tmp_path, monkeypatch, case):
    work = _private_empty(tmp_path / "work")
    if case == "planted":
        (work / "evil.pth").write_text("import os; os.system('touch /tmp/pwned')\n")
        match = r"is not empty \(it holds 'evil.pth'\)"
    elif case == "shared":
        work.chmod(0o777)
        match = r"is writable by others \(mode 777\)"
    elif case == "link":
        work = tmp_path / "link"
        work.symlink_to(tmp_path / "work")
        match = r"is a link"
    elif case == "foreign":
        monkeypatch.setattr(os, "getuid", lambda: 4242)
        match = r"is owned by uid \d+, not by you \(uid 4242\)"
    else:
        work = tmp_path / "file"
        work.write_text("")
        match = r"is not a folder"
    _refused(OutputPathError, rf"tritonserver work folder .* {match}", repo, install=install,
             work=work, wait=10)
    assert not pids.exists()


def test_a_new_or_private_empty_work_folder_is_used_and_kept(install, repo, pids, tmp_path):
    for work in (tmp_path / "new" / "work", _private_empty(tmp_path / "empty")):
        with TritonServer.start(repo, install=install, work=work, wait=30) as server:
            assert server.is_live() and server.work == work
        assert (work / "tritonserver.log").is_file()  # kept: the caller asked for it
        assert (work.stat().st_mode & 0o077) == 0


def _launch(repo: Path, install: TritonInstall, pids: Path) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen([sys.executable, "-m", "kernel_lens.serving.tritonserver", str(repo),
                             "--root", str(install.root)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        line = proc.stdout.readline() if ready else ""
        if line.startswith("tritonserver live"):
            assert "127.0.0.1:8000," not in line  # no fixed default port
            return proc, Path(re.search(r"log (\S+);", line).group(1)).parent
        if proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"the launcher did not report a live server: {proc.stderr.read()}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_ends_the_server_group_and_removes_the_work_folder(install, repo, pids, sig):
    proc, work = _launch(repo, install, pids)
    try:
        server_pid, stub_pid = _read_pids(pids)
        assert work.is_dir() and _alive(server_pid) and _alive(stub_pid)
        proc.send_signal(sig)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
        assert _wait_dead([server_pid, stub_pid]) == []
        assert not work.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _read_pids(pids) if pids.exists() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


# --- a launcher killed outright leaves no server and no work folder -------------------------------
def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie waits for a parent that is not its launcher any more


def _launcher(work: Path, release: bool) -> subprocess.Popen:
    """A process that starts a stand-in server (its own session, as TritonServer.start does) and
    its reaper, prints the server's pid, then waits to be killed (or releases the reaper first)."""
    code = (f"import subprocess, sys, time\nfrom pathlib import Path\n"
            f"from kernel_lens.serving.tritonserver import release_reaper, start_reaper\n"
            f"server = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
            f"reaper = start_reaper(server.pid, Path({str(work)!r}), False)\n"
            f"{'release_reaper(reaper)' if release else ''}\n"
            f"print(server.pid, flush=True)\ntime.sleep(300)\n")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_a_sigkilled_launcher_leaves_no_server_and_no_work_folder(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    launcher = _launcher(work, release=False)
    server = int(launcher.stdout.readline())
    assert not _gone(server)
    launcher.kill()
    launcher.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not (_gone(server) and not work.exists()):
        time.sleep(0.1)
    assert _gone(server) and not work.exists()


def test_a_released_reaper_leaves_the_server_alone(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    launcher = _launcher(work, release=True)
    server = int(launcher.stdout.readline())
    try:
        launcher.kill()
        launcher.wait()
        time.sleep(1.0)
        assert not _gone(server) and work.exists()  # stop() had ended it: the reaper does nothing
    finally:
        os.killpg(server, signal.SIGKILL)


def test_the_serving_facade_gives_the_backends_lazily_and_names_what_it_lacks():
    import kernel_lens.serving as serving
    from kernel_lens.serving import backends

    assert serving.BACKENDS is backends.BACKENDS and serving.get_backend is backends.get_backend
    with pytest.raises(AttributeError, match="has no attribute 'backend_list'"):
        serving.backend_list  # noqa: B018


def test_a_tensor_type_triton_has_no_name_for_is_named_in_onnx_terms():
    import onnx
    from onnx import helper

    from kernel_lens.errors import InputError
    from kernel_lens.serving.interface import _spec

    value = helper.make_tensor_value_info("z", onnx.TensorProto.COMPLEX64, ["n"])
    with pytest.raises(InputError, match="Toy: 'z' is of ONNX type COMPLEX64, which Triton Inference "
                                         "Server has no data type for"):
        _spec(value, "Toy")
