"""Issue 18, second round: output writes, caches and ONNX external data (docs/security.md).

Each test plants what an attacker on the host would (a link below the output folder, a cache
folder or entry of the wrong kind, an external-data location outside the graph's folder) and
checks that kernel_lens refuses it or does not use it, before writing or reading through it.
No GPU and no TensorRT are needed: the engine cache is driven with a stand-in TensorRT module.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

import onnx
import pytest
from onnx import TensorProto, helper

import kernel_lens as kl
from kernel_lens.compiler import CompiledModel, _compile_into_cache, artifact_cache_dir
from kernel_lens.errors import ArtifactError, BuildError, CacheError, OutputPathError
from kernel_lens.fileio import inside, subfolder
from kernel_lens.onnx import save_onnx
from kernel_lens.onnx.external_data import check_locations, external_data_files
from kernel_lens.passes import dump_to_dir
from kernel_lens.runtime import trt as trt_runtime
from kernel_lens.toolchain import cache
from kernel_lens.toolchain.build import build_shared_library

from conftest import EXAMPLES, model_ir

TOY = EXAMPLES / "toy_two_kernels.py"
OTHER_UID = 54321
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")


@pytest.fixture(scope="module")
def toy_ir():
    return model_ir(TOY)


@pytest.fixture
def kl_cache(tmp_path, monkeypatch):
    root = tmp_path / "klcache"
    monkeypatch.setenv("KERNEL_LENS_CACHE", str(root))
    return root


def _planted(tmp_path: Path, out: Path, name: str) -> Path:
    """A link ``out/name`` to a folder elsewhere (returned, empty)."""
    elsewhere = tmp_path / f"elsewhere_{name.replace('/', '_')}"
    elsewhere.mkdir()
    (out / name).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, out / name)
    return elsewhere


# --- item 1: writes through a planted sub-folder link -----------------------------------------
def test_inside_refuses_a_link_at_any_level_below_the_folder(tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    _planted(tmp_path, out, "a")  # a link to a folder, as an intermediate part
    with pytest.raises(OutputPathError, match=r"o/a: it is a symbolic link .*remove the link"):
        inside(out, "a/x.cpp")
    (out / "real").mkdir()
    _planted(tmp_path, out, "real/deeper")  # a link one level further down: still refused
    with pytest.raises(OutputPathError, match=r"real/deeper: it is a symbolic link"):
        inside(out, "real/deeper/x.cpp")
    with pytest.raises(OutputPathError, match=r"symbolic link to a folder"):
        inside(out, "a")  # the name itself, a link to a folder, would be written into
    (out / "plain").write_text("x")
    with pytest.raises(OutputPathError, match=r"plain: it is not a folder"):
        inside(out, "plain/x.cpp")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    os.symlink(victim, out / "f.txt")  # a link to a file at a final name: atomic_write replaces it
    assert inside(out, "f.txt") == out / "f.txt"
    assert inside(out, "real/new/x.cpp") == out / "real" / "new" / "x.cpp"  # not made yet: fine


def test_subfolder_makes_real_folders_and_refuses_links_and_files(tmp_path):
    out = tmp_path / "o"
    made = subfolder(out, "a/b")
    assert made == out / "a" / "b" and stat.S_ISDIR(os.lstat(made).st_mode)
    assert subfolder(out, "a/b") == made  # already there: fine
    elsewhere = _planted(tmp_path, out, "src")
    with pytest.raises(OutputPathError, match=r"o/src: it is a symbolic link"):
        subfolder(out, "src")
    elsewhere2 = _planted(tmp_path, out, "x")
    with pytest.raises(OutputPathError, match=r"o/x: it is a symbolic link"):
        subfolder(out, "x/y")
    os.symlink(tmp_path / "nowhere", out / "dangling")  # a dangling link is refused, not followed
    with pytest.raises(OutputPathError, match=r"dangling: it is a symbolic link"):
        subfolder(out, "dangling")
    (out / "file").write_text("x")
    with pytest.raises(OutputPathError, match=r"o/file: it is not a folder"):
        subfolder(out, "file")
    for bad in ("../up", "/abs", ""):
        with pytest.raises(OutputPathError):
            subfolder(out, bad)
    assert not any(elsewhere.iterdir()) and not any(elsewhere2.iterdir())
    assert not (tmp_path / "nowhere").exists()


def test_emit_refuses_a_planted_source_folder_link_before_writing(toy_ir, tmp_path, ort_headers):
    # `o/src -> elsewhere`, then compile --target ort --stop-after emit -o o
    out = tmp_path / "o"
    out.mkdir()
    elsewhere = _planted(tmp_path, out, "src")
    with pytest.raises(OutputPathError, match=r"o/src: it is a symbolic link"):
        CompiledModel(toy_ir).write(out, ["ort"], stop_after="emit")
    assert not any(elsewhere.iterdir()), "a C++ source was written into the link's target"
    os.unlink(out / "src")
    paths = CompiledModel(toy_ir).write(out, ["ort"], stop_after="emit")  # the real folder: fine
    sources = [p for k, p in paths.items() if k.startswith("ort.source.")]
    assert sources and all(p.parent == out / "src" for p in sources)
    assert stat.S_ISDIR(os.lstat(out / "src").st_mode)


def test_pass_dumps_refuse_a_planted_dumps_link(toy_ir, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    elsewhere = _planted(tmp_path, out, "dumps")
    with pytest.raises(OutputPathError, match=r"o/dumps: it is a symbolic link"):
        dump_to_dir(out / "dumps")
    os.unlink(out / "dumps")
    dump = dump_to_dir(out / "dumps")
    dump("role-inference", toy_ir)
    assert len(list((out / "dumps").iterdir())) == 1
    # swapped for a link between two dumps: the next dump is refused too
    (out / "dumps").rename(tmp_path / "old_dumps")
    os.symlink(elsewhere, out / "dumps")
    with pytest.raises(OutputPathError, match=r"o/dumps: it is a symbolic link"):
        dump("verify", toy_ir)
    assert not any(elsewhere.iterdir())


def test_cli_refuses_a_planted_dumps_link_before_any_work(tmp_path):
    # the command line, with `o/dumps -> elsewhere`: refused before the front half runs
    out = tmp_path / "o"
    out.mkdir()
    elsewhere = _planted(tmp_path, out, "dumps")
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "compile", str(TOY),
                           "--target", "ort", "--stop-after", "emit", "--dump-after",
                           "role-inference", "-o", str(out)],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERNEL_LENS_CACHE": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    assert "OutputPathError" in proc.stderr and "dumps" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not any(elsewhere.iterdir())
    assert not (out / "ToyModel.ir.json").exists()


# --- item 6: every cache folder and entry trusted by one rule ----------------------------------
@pytest.mark.parametrize("mode", [0o775, 0o1777, 0o777], ids=["775", "1777", "777"])
def test_group_or_world_writable_cache_root_is_refused(mode, kl_cache):
    kl_cache.mkdir()
    kl_cache.chmod(mode)
    for location in (cache.ARTIFACTS, cache.TENSORRT_ENGINES, cache.FAILED):
        with pytest.raises(CacheError, match=rf"refusing the build cache root {kl_cache}: it is "
                                             rf"writable by group or others \(mode {mode:o}\).*"
                                             rf"set KERNEL_LENS_CACHE"):
            cache.cache_folder(location)
    assert not any(kl_cache.iterdir())


@pytest.mark.parametrize("where", [cache.ARTIFACTS, cache.TENSORRT_ENGINES, cache.FAILED])
@pytest.mark.parametrize("how", ["link", "group_writable", "other_user"])
def test_untrusted_cache_sub_folders_are_refused(where, how, kl_cache, tmp_path):
    if how == "other_user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    kl_cache.mkdir(mode=0o700)
    folder = kl_cache / where
    if how == "link":
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir()
        if how == "group_writable":
            folder.chmod(0o775)
        else:
            os.chown(folder, OTHER_UID, -1)
    why = {"link": "symbolic link", "group_writable": "writable by group or others",
           "other_user": f"owned by uid {OTHER_UID}"}[how]
    with pytest.raises(CacheError, match=rf"refusing the cache folder '{where}' {folder}: it is "
                                         rf".*{why}.*KERNEL_LENS_CACHE"):
        cache.cache_folder(where)


def test_failed_build_is_not_kept_through_a_failed_folder_link(tmp_path):
    root = tmp_path / "cache"
    root.mkdir(mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / cache.FAILED).symlink_to(elsewhere)
    with pytest.raises(BuildError, match=r"(?s)building bad failed.*the failing sources were not "
                                         r"kept: refusing the cache folder 'failed'.*symbolic link"):
        build_shared_library("bad", {"bad.cpp": "this is not C++\n"}, include_dirs=[], cache_dir=root)
    assert not any(elsewhere.iterdir()), "the failing sources were moved into the link's target"


# --- the TensorRT engine cache, with a stand-in TensorRT module ---------------------------------
def _fake_tensorrt() -> ModuleType:
    """The few names TrtModel touches before building an engine."""
    trt = ModuleType("tensorrt")
    trt.__version__ = "10.0-fake"
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})
    trt.Builder = lambda logger: object()
    trt.get_plugin_registry = lambda: SimpleNamespace(load_library=lambda path: object())
    return trt


@pytest.fixture
def engines(toy_ir, tmp_path, kl_cache, monkeypatch):
    """A TrtModel whose builds are counted (b"engine-<n>"), over stand-in ONNX/library files."""
    onnx_path, library = tmp_path / "m.onnx", tmp_path / "libm.so"
    onnx_path.write_bytes(b"graph")
    library.write_bytes(b"library")
    monkeypatch.setattr(trt_runtime, "import_tensorrt", lambda package=None: _fake_tensorrt())
    monkeypatch.setattr(trt_runtime.TrtModel, "profile", lambda self: {})
    built = []

    def build(self):
        built.append(1)
        return f"engine-{len(built)}".encode()

    monkeypatch.setattr(trt_runtime.TrtModel, "_build", build)
    model = trt_runtime.TrtModel(toy_ir, onnx_path, library)
    return SimpleNamespace(model=model, built=built, folder=kl_cache / cache.TENSORRT_ENGINES)


def test_engine_cache_reuses_a_trusted_engine(engines):
    path = engines.model.build_engine()
    assert path.parent == engines.folder and path.read_bytes() == b"engine-1"
    assert cache.record_of(path).is_file()
    assert engines.model.build_engine() == path and len(engines.built) == 1
    assert engines.model._engine() == (path, b"engine-1")  # what is deserialized: checked bytes
    assert trt_runtime.cached_engine(path) == b"engine-1"


def _spoil_engine(path: Path, how: str, tmp_path: Path) -> None:
    if how == "world_writable":
        path.chmod(0o666)
    elif how == "symlink":
        planted = tmp_path / "planted.engine"
        planted.write_bytes(b"attacker engine")
        planted.chmod(0o644)
        path.unlink()
        path.symlink_to(planted)
    elif how == "other_user":
        os.chown(path, OTHER_UID, -1)
    elif how == "tampered":
        path.write_bytes(b"attacker engine")
    elif how == "no_record":
        cache.record_of(path).unlink()
    elif how == "planted_with_its_own_record":  # a file and a matching record of another user
        path.write_bytes(b"attacker engine")
        cache.record_hash(path, hashlib.sha256(b"attacker engine").hexdigest())
        os.chown(cache.record_of(path), OTHER_UID, -1)


@pytest.mark.parametrize("how, why", [
    ("world_writable", "writable by group or others (mode 666)"),
    ("symlink", "it is a symbolic link"),
    ("other_user", f"owned by uid {OTHER_UID}"),
    ("tampered", "sha256 does not match the hash recorded"),
    ("no_record", "no content hash was recorded"),
    ("planted_with_its_own_record", f"owned by uid {OTHER_UID}"),
])
def test_untrusted_engine_is_not_used_but_rebuilt(engines, tmp_path, caplog, how, why):
    if "other_user" in how or "own_record" in how:
        if os.geteuid() != 0:
            pytest.skip("chown to another user needs root")
    path = engines.model.build_engine()
    _spoil_engine(path, how, tmp_path)
    with caplog.at_level(logging.WARNING):
        assert trt_runtime.cached_engine(path) is None
        assert engines.model._engine() == (path, b"engine-2")  # rebuilt, not the planted bytes
    assert why in caplog.text and "TensorRT engine cache entry not reused" in caplog.text
    st = os.lstat(path)
    assert stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022
    assert engines.model.build_engine() == path and len(engines.built) == 2  # trusted again
    if how == "symlink":
        assert (tmp_path / "planted.engine").read_bytes() == b"attacker engine"  # not written through


@pytest.mark.parametrize("how", ["link", "world_writable"])
def test_untrusted_engine_folder_is_a_cache_error(engines, tmp_path, how):
    folder = engines.folder
    folder.parent.mkdir(mode=0o700)
    if how == "link":
        (tmp_path / "elsewhere").mkdir()
        folder.symlink_to(tmp_path / "elsewhere")
    else:
        folder.mkdir(mode=0o777)
        folder.chmod(0o777)
    with pytest.raises(CacheError, match=rf"'{cache.TENSORRT_ENGINES}' {folder}.*KERNEL_LENS_CACHE"):
        engines.model.build_engine()
    assert not engines.built
    given = tmp_path / "given"  # a folder the caller names is held to the same rule
    given.mkdir(mode=0o775)
    given.chmod(0o775)
    with pytest.raises(CacheError, match=r"TensorRT engine cache folder .*given.*mode 775"):
        trt_runtime.trusted_engine_folder(given)


# --- the artifact cache (compile() without an output folder) -----------------------------------
def _entry(root: Path) -> Path:
    (entry,) = [p for p in (root / cache.ARTIFACTS).iterdir() if not p.name.startswith(".")]
    return entry


def test_artifact_cache_entry_is_sealed_and_reused(toy_ir, kl_cache):
    first = _compile_into_cache(CompiledModel(toy_ir), [])
    entry = _entry(kl_cache)
    assert artifact_cache_dir() == kl_cache / cache.ARTIFACTS
    assert first.artifacts["ir"].parent == entry and (entry / cache.TREE_RECORD).is_file()
    assert cache.tree_problem(entry) is None
    for path in [entry, *entry.rglob("*")]:
        assert not os.lstat(path).st_mode & 0o022, path
    ir_bytes = first.artifacts["ir"].read_bytes()
    again = _compile_into_cache(CompiledModel(toy_ir), [])
    assert again.artifacts["ir"] == first.artifacts["ir"] and again.artifacts["ir"].read_bytes() == ir_bytes


@pytest.mark.parametrize("theirs", ["sound", "tampered"])
def test_artifact_cache_entry_another_process_wrote_meanwhile_is_checked_before_use(toy_ir, kl_cache,
                                                                                   monkeypatch, theirs):
    """The rename loses a race: the entry the other process made is used only if it is sound, and
    this process's own folder is removed either way."""
    import shutil

    import kernel_lens.compiler as compiler
    real = os.replace

    def racing(src, dst):
        dst = Path(dst)
        if dst.parent == kl_cache / cache.ARTIFACTS and not dst.name.startswith("."):
            shutil.copytree(src, dst, symlinks=True)  # the other process's entry, renamed first
            if theirs == "tampered":
                ir = next(dst.glob("*.ir.json"))
                ir.chmod(0o644)
                ir.write_bytes(ir.read_bytes().replace(b'"ToyModel"', b'"Evil0000"', 1))
            raise OSError(39, "Directory not empty")
        return real(src, dst)
    monkeypatch.setattr(compiler.os, "replace", racing)
    if theirs == "tampered":
        with pytest.raises(CacheError, match="written meanwhile but cannot be trusted"):
            _compile_into_cache(CompiledModel(toy_ir), [])
    else:
        got = _compile_into_cache(CompiledModel(toy_ir), [])
        assert got.artifacts["ir"].parent == _entry(kl_cache) and got.ir.name == toy_ir.name
    assert [p.name for p in (kl_cache / cache.ARTIFACTS).iterdir() if p.name.startswith(".")] == []


@pytest.mark.parametrize("how, why", [
    ("tampered", "does not match the hash recorded"),
    ("extra_file", "differ from those recorded"),
    ("linked_file", "symbolic link"),
    ("group_writable_file", "writable by group or others"),
    ("other_user_file", f"owned by uid {OTHER_UID}"),
    ("no_record", "no content hashes were recorded"),
])
def test_spoiled_artifact_cache_entry_is_rebuilt(toy_ir, kl_cache, tmp_path, caplog, how, why):
    if "other_user" in how and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    first = _compile_into_cache(CompiledModel(toy_ir), [])
    entry = _entry(kl_cache)
    ir_path = first.artifacts["ir"]
    good = ir_path.read_bytes()
    if how == "tampered":
        ir_path.chmod(0o644)
        ir_path.write_bytes(good.replace(b'"ToyModel"', b'"Evil0000"', 1))
    elif how == "extra_file":
        (entry / "libextra.so").write_bytes(b"planted")
    elif how == "linked_file":
        planted = tmp_path / "planted.json"
        planted.write_bytes(good)
        ir_path.unlink()
        ir_path.symlink_to(planted)
    elif how == "group_writable_file":
        ir_path.chmod(0o664)
    elif how == "other_user_file":
        os.chown(ir_path, OTHER_UID, -1)
    elif how == "no_record":
        (entry / cache.TREE_RECORD).unlink()
    assert why in cache.tree_problem(entry)
    with caplog.at_level(logging.WARNING, logger="kernel_lens.compiler"):
        again = _compile_into_cache(CompiledModel(toy_ir), [])
    assert "artifact cache entry not reused" in caplog.text and why in caplog.text
    assert again.artifacts["ir"] == ir_path and not ir_path.is_symlink()
    assert ir_path.read_bytes() == good and cache.tree_problem(entry) is None
    assert not (entry / "libextra.so").exists()
    assert [p.name for p in (kl_cache / cache.ARTIFACTS).iterdir()] == [entry.name]  # nothing left over


@pytest.mark.parametrize("how", ["link", "group_writable", "other_user"])
def test_untrusted_artifact_cache_entry_folder_is_a_cache_error(toy_ir, kl_cache, tmp_path, how):
    if how == "other_user" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    _compile_into_cache(CompiledModel(toy_ir), [])
    entry = _entry(kl_cache)
    if how == "link":
        elsewhere = tmp_path / "elsewhere"
        entry.rename(elsewhere)
        entry.symlink_to(elsewhere)
    elif how == "group_writable":
        entry.chmod(0o775)
    else:
        os.chown(entry, OTHER_UID, -1)
    with pytest.raises(CacheError, match=rf"refusing the artifact cache entry {entry}: .*"
                                         rf"KERNEL_LENS_CACHE.*remove it"):
        _compile_into_cache(CompiledModel(toy_ir), [])


def test_cache_locations_live_in_the_bottom_module():
    # runtime/trt.py finds its engine folder without importing the compiler driver
    source = Path(trt_runtime.__file__).read_text()
    assert "from ..compiler" not in source and "artifact_cache_dir" not in source
    imports = [line for line in Path(cache.__file__).read_text().splitlines()
               if line.startswith(("import ", "from ")) and "kernel_lens" in line]
    assert sorted(imports) == ["from kernel_lens.errors import CacheError",
                               "from kernel_lens.fileio import atomic_write"]


# --- item 7: ONNX external data, every tensor --------------------------------------------------
def _external(name: str, location: str) -> TensorProto:
    t = TensorProto(name=name, data_type=TensorProto.FLOAT, dims=[1],
                    data_location=TensorProto.EXTERNAL)
    t.external_data.add(key="location", value=location)
    t.external_data.add(key="offset", value="0")
    t.external_data.add(key="length", value="4")
    return t


def _model(where: str, location: str) -> onnx.ModelProto:
    """A small valid-looking model with one tensor keeping its data at ``location``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    tensor = _external("w", location)
    functions = []
    if where == "constant":
        nodes = [helper.make_node("Constant", [], ["w"], name="c", value=tensor),
                 helper.make_node("Add", ["x", "w"], ["y"])]
    elif where == "subgraph_initializer":
        body = helper.make_graph([helper.make_node("Identity", ["w"], ["z"])], "then", [],
                                 [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])],
                                 initializer=[tensor])
        other = helper.make_graph([helper.make_node("Identity", ["x"], ["z2"])], "else", [],
                                  [helper.make_tensor_value_info("z2", TensorProto.FLOAT, [1])])
        nodes = [helper.make_node("Constant", [], ["cond"], value=helper.make_tensor(
                     "cond", TensorProto.BOOL, [], [True])),
                 helper.make_node("If", ["cond"], ["y"], name="if", then_branch=body,
                                  else_branch=other)]
    elif where == "nested_subgraph_constant":
        inner = helper.make_graph([helper.make_node("Constant", [], ["z"], value=tensor)], "inner",
                                  [], [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1])])
        empty = helper.make_graph([helper.make_node("Identity", ["x"], ["z3"])], "e", [],
                                  [helper.make_tensor_value_info("z3", TensorProto.FLOAT, [1])])
        mid = helper.make_graph([helper.make_node("If", ["x"], ["z2"], then_branch=inner,
                                                  else_branch=empty)], "mid", [],
                                [helper.make_tensor_value_info("z2", TensorProto.FLOAT, [1])])
        nodes = [helper.make_node("If", ["x"], ["y"], name="outer", then_branch=mid,
                                  else_branch=empty)]
    elif where == "function":
        fn = helper.make_function("local", "F", ["a"], ["b"],
                                  [helper.make_node("Constant", [], ["k"], value=tensor),
                                   helper.make_node("Add", ["a", "k"], ["b"])],
                                  [helper.make_opsetid("", 18)])
        functions = [fn]
        nodes = [helper.make_node("F", ["x"], ["y"], domain="local")]
    elif where == "sparse_initializer":
        values = _external("w", location)
        indices = helper.make_tensor("i", TensorProto.INT64, [1], [0])
        sparse = helper.make_sparse_tensor(values, indices, [4])
        graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y],
                                  sparse_initializer=[sparse])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    else:  # a top-level initializer, checked before this round too
        graph = helper.make_graph([helper.make_node("Add", ["x", "w"], ["y"])], "g", [x], [y],
                                  initializer=[tensor])
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    graph = helper.make_graph(nodes, "g", [x], [y])
    return helper.make_model(graph, functions=functions,
                             opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("local", 1)])


WHERE = ["initializer", "constant", "subgraph_initializer", "nested_subgraph_constant", "function",
         "sparse_initializer"]
BAD_LOCATIONS = ["/etc/passwd", "../secret.bin", "sub/../../secret.bin", "sub/w.bin", ".", ""]


@pytest.mark.parametrize("where", WHERE)
@pytest.mark.parametrize("location", BAD_LOCATIONS)
def test_external_data_location_is_checked_on_every_tensor(where, location, tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(_model(where, location).SerializeToString())
    with pytest.raises(ArtifactError) as exc:
        external_data_files(path)
    message = str(exc.value)
    assert "\n" not in message and str(path) in message and repr(location) in message
    assert "only a file beside the graph" in message


@pytest.mark.parametrize("where", WHERE)
def test_external_data_link_leading_out_is_refused(where, tmp_path):
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"\0" * 4)
    folder = tmp_path / "art"
    folder.mkdir()
    (folder / "w.bin").symlink_to(secret)
    path = folder / "m.onnx"
    path.write_bytes(_model(where, "w.bin").SerializeToString())
    with pytest.raises(ArtifactError, match=r"w\.bin .*lies outside .*art \(through a link\)"):
        external_data_files(path)
    (folder / "w.bin").unlink()
    (folder / "w.bin").write_bytes(b"\0" * 4)  # a plain file beside the graph: accepted
    assert external_data_files(path) == {"w.bin": folder / "w.bin"}


def test_save_onnx_refuses_a_model_with_an_outside_location(tmp_path):
    with pytest.raises(ArtifactError, match=r"Constant node 'c'.*'/etc/passwd'"):
        save_onnx(_model("constant", "/etc/passwd"), tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()
    assert check_locations(_model("constant", "w.bin"), "m") == {
        "w.bin": ["attribute 'value' of Constant node 'c'"]}


@pytest.mark.parametrize("where", ["constant", "subgraph_initializer"])
def test_triton_export_checks_every_tensors_external_data(where, tmp_path):
    from kernel_lens.serving.export import _external_data

    path = tmp_path / "m.onnx"
    path.write_bytes(_model(where, "/etc/passwd").SerializeToString())
    with pytest.raises(ArtifactError):
        _external_data(path)


def test_a_rebuild_that_fails_half_way_leaves_no_loadable_mix(toy_ir, tmp_path):
    """A rebuild into a folder that fails in its build (issue 30, item 1) must not leave the new
    IR beside the old manifest and the old library: it builds in a staging folder (issue 27), so
    the folder keeps the earlier build, whole and loadable, and no staging folder remains."""
    from kernel_lens.targets.base import Target

    class Flaky(Target):
        name = "flaky_rebuild"
        fail = False

        def build(self, ir, out_dir):
            if Flaky.fail:
                raise BuildError("the C++ build failed")
            return {"library": inside(out_dir, "libkl_old.so").write_bytes(b"old") and
                    inside(out_dir, "libkl_old.so")}

        def runner(self, ir, artifacts, **options):
            return object()

    kl.register_target(Flaky)
    compiled = CompiledModel(toy_ir)
    out = tmp_path / "out"
    compiled.write(out, ["flaky_rebuild"])
    assert set(kl.load(out).artifacts) == {"ir", "summary", "flaky_rebuild.library"}
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    Flaky.fail = True
    with pytest.raises(BuildError):
        CompiledModel(toy_ir).write(out, ["flaky_rebuild"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert set(kl.load(out).artifacts) == {"ir", "summary", "flaky_rebuild.library"}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".kl-staging-")]
    Flaky.fail = False
    CompiledModel(toy_ir).write(out, ["flaky_rebuild"])
    assert kl.load(out).artifacts["flaky_rebuild.library"].read_bytes() == b"old"


def test_a_sealed_entry_whose_file_names_hold_two_spaces_checks_out(tmp_path):
    # the record's lines are "<sha256>  <path>": a path may itself hold "  "
    entry = tmp_path / "entry"
    (entry / "sub  dir").mkdir(parents=True)
    (entry / "sub  dir" / "a  b.txt").write_text("x")
    (entry / "plain").write_text("y")
    for p in (entry, entry / "sub  dir"):
        p.chmod(0o755)
    cache.seal_tree(entry)
    assert cache.tree_problem(entry) is None
    (entry / "sub  dir" / "a  b.txt").write_text("changed")
    assert "a  b.txt" in cache.tree_problem(entry)


def test_discard_never_raises_when_the_moved_aside_copy_cannot_be_removed(tmp_path, monkeypatch):
    entry = tmp_path / "stale"
    entry.mkdir()
    (entry / "f").write_text("x")

    def rmtree(path, ignore_errors=False, **kwargs):
        if not ignore_errors:
            raise PermissionError(13, "busy", str(path))
    monkeypatch.setattr(cache.shutil, "rmtree", rmtree)
    cache.discard(entry)
    assert not entry.exists()  # moved aside at once: no reader sees it
