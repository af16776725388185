"""The pinned-download-and-swap helper the three fetchers share (kernel_lens.toolchain.fetch), and
the fetchers on top of it, with local archives standing in for the registries: nothing here
downloads (the one pip run is `--no-index`)."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from kernel_lens.errors import CacheError
from kernel_lens.serving import fetch as serving_fetch
from kernel_lens.toolchain import fetch, fetch_headers
from kernel_lens.toolchain.fetch import STAMP, FetchError

from conftest import ROOT


def make_zip(path: Path, members: dict[str, tuple[bytes, int]]) -> Path:
    """A wheel-like zip whose members carry Unix modes (name -> (bytes, mode))."""
    with zipfile.ZipFile(path, "w") as zf:
        for name, (data, mode) in members.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100000 | mode) << 16
            zf.writestr(info, data)
    return path


def make_tgz(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return path


def writer(files: dict[str, str]):
    def fill(staging: Path) -> None:
        for name, text in files.items():
            (staging / name).write_text(text)
    return fill


# --- unpack ---

def test_unpack_keeps_selected_members_with_execute_bits(tmp_path):
    wheel = make_zip(tmp_path / "a.whl", {"pkg/bin/tool": (b"#!/bin/sh\n", 0o775),
                                          "pkg/data.txt": (b"d", 0o666), "other/x": (b"x", 0o644)})
    out = tmp_path / "out"
    out.mkdir()
    written = fetch.unpack(wheel, out, lambda n: n if n.startswith("pkg/") else None)
    assert sorted(written) == ["pkg/bin/tool", "pkg/data.txt"]
    assert not (out / "other").exists()
    assert (out / "pkg/bin/tool").stat().st_mode & 0o777 == 0o755  # executable, owner-writable only
    assert (out / "pkg/data.txt").stat().st_mode & 0o777 == 0o644


def test_unpack_renames_tar_members(tmp_path):
    tgz = make_tgz(tmp_path / "p.tgz", {"package/h/a.h": b"a", "package/h/sub/b.h": b"b",
                                        "package/LICENSE": b"MIT"})
    out = tmp_path / "out"
    out.mkdir()
    keep = {"package/h/a.h": "a.h", "package/LICENSE": "LICENSE"}
    assert sorted(fetch.unpack(tgz, out, keep.get)) == ["LICENSE", "a.h"]
    assert sorted(p.name for p in out.iterdir()) == ["LICENSE", "a.h"]


@pytest.mark.parametrize("name", ["../evil", "ABSOLUTE", "a/../../evil"])
def test_unpack_refuses_members_outside_the_folder(tmp_path, name):
    name = str(tmp_path / "a" / "evil") if name == "ABSOLUTE" else name
    wheel = make_zip(tmp_path / "bad.whl", {name: (b"x", 0o644)})
    out = tmp_path / "a" / "out"
    out.mkdir(parents=True)
    with pytest.raises(FetchError, match="refusing member .*outside the folder"):
        fetch.unpack(wheel, out)
    assert not (tmp_path / "a" / "evil").exists() and not (tmp_path / "evil").exists()


# --- install: staging next to the destination, swapped into place ---

@pytest.mark.parametrize("exchange", [True, False], ids=["renameat2", "two-renames"])
def test_install_replaces_old_content_and_leaves_no_staging(tmp_path, monkeypatch, exchange):
    if not exchange:
        monkeypatch.setattr(fetch, "_exchange", lambda a, b: False)
    final = tmp_path / "cache" / "part"
    assert fetch.install(final, writer({"old.h": "old"}), "pkg==1") == final
    assert (final / "old.h").read_text() == "old" and (final / STAMP).read_text() == "pkg==1\n"
    assert final.stat().st_mode & 0o777 == 0o755 & ~fetch.umask()
    seen, removed, real_rmtree = [], [], fetch.shutil.rmtree

    def rmtree(path, *args, **kwargs):  # the old content goes only once the new one is in place
        assert Path(path) != final and (final / "new.h").is_file()
        removed.append(sorted(p.name for p in Path(path).iterdir()))
        real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(fetch.shutil, "rmtree", rmtree)
    fetch.install(final, lambda s: (seen.append(sorted(p.name for p in final.iterdir())),
                                    writer({"new.h": "new"})(s)), "pkg==2")
    monkeypatch.undo()
    assert removed == [[STAMP, "old.h"]]
    assert seen == [[STAMP, "old.h"]]  # the old folder stays in place while the new one is filled
    assert sorted(p.name for p in final.iterdir()) == [STAMP, "new.h"]  # old.h is gone
    assert (final / STAMP).read_text() == "pkg==2\n"
    assert sorted(p.name for p in final.parent.iterdir()) == ["part"]  # no staging, no old copy


def test_exchange_swaps_two_folders_atomically(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "x").write_text("a"), (b / "x").write_text("b")
    if not fetch._exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not available here")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def test_failed_fill_removes_staging_and_keeps_the_old_folder(tmp_path):
    final = tmp_path / "cache" / "part"
    fetch.install(final, writer({"old.h": "old"}), "pkg==1")

    def broken(staging: Path) -> None:
        (staging / "half.h").write_text("half")
        raise FetchError("the archive lacks the marker")

    with pytest.raises(FetchError, match="lacks the marker"):
        fetch.install(final, broken, "pkg==2")
    assert sorted(p.name for p in final.iterdir()) == [STAMP, "old.h"]
    assert sorted(p.name for p in final.parent.iterdir()) == ["part"]


def test_a_folder_no_fetch_made_is_refused_not_emptied(tmp_path):
    final = tmp_path / "mine"
    final.mkdir()
    (final / "thesis.tex").write_text("precious")
    with pytest.raises(CacheError, match=r"refusing to replace .*mine: it is not empty and no "
                                         r"kernel_lens fetch made it"):
        fetch.install(final, writer({"a.h": "a"}), "pkg==1")
    assert (final / "thesis.tex").read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


# --- the destination must be this user's own folder ---

def _refused_message(final: Path, parent: bool = False) -> str:
    with pytest.raises(CacheError) as exc:
        fetch.check_destination(final, "pass --dest DIR")
    msg = str(exc.value)
    assert "\n" not in msg
    assert f"refusing the {'folder holding the ' if parent else ''}fetch destination " \
           f"{final.parent if parent else final}: it " in msg
    assert msg.endswith("(pass --dest DIR)")
    return msg


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_destination_writable_by_others_is_refused(tmp_path, mode):
    final = tmp_path / "part"
    final.mkdir()
    final.chmod(mode)
    msg = _refused_message(final)
    assert f"is writable by group or others (mode {mode:o}); run `chmod go-w {final}`" in msg


def test_destination_that_is_a_link_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "part").symlink_to(real)
    assert f"is a symbolic link (to {real}); pass the folder itself" in _refused_message(tmp_path / "part")


def test_destination_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "part").write_text("x")
    assert "is not a folder; remove it or pass another folder" in _refused_message(tmp_path / "part")


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder of another user needs root")
def test_destination_of_another_user_is_refused(tmp_path):
    final = tmp_path / "part"
    final.mkdir()
    os.chown(final, 65534, 65534)
    assert "is owned by uid 65534, not by the current user" in _refused_message(final)


def test_parent_writable_by_others_is_refused_unless_sticky(tmp_path):
    parent = tmp_path / "cache"
    parent.mkdir()
    parent.chmod(0o777)
    msg = _refused_message(parent / "part", parent=True)
    assert "writable by group or others (mode 777, no sticky bit)" in msg
    parent.chmod(0o1777)  # as /tmp: nobody else can rename or remove what we put there
    assert fetch.check_destination(parent / "part") is False


def test_parent_that_is_a_link_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "cache").symlink_to(tmp_path / "real")
    assert "is a symbolic link" in _refused_message(tmp_path / "cache" / "part", parent=True)


def test_missing_parent_is_created_private_to_writers(tmp_path):
    final = tmp_path / "a" / "b" / "part"
    assert fetch.check_destination(final) is False
    assert (final.parent.stat().st_mode & 0o777) == 0o755 & ~fetch.umask()
    assert not final.exists()


def test_fetch_headers_does_not_reuse_a_world_writable_part(tmp_path, capsys):
    # A complete-looking cache part that others could have written is refused, not reused.
    part = tmp_path / "dest" / "onnxruntime"
    part.mkdir(parents=True)
    (part / "onnxruntime_c_api.h").write_text("#define ORT_API_VERSION 29\n")
    part.chmod(0o777)
    assert fetch_headers.main(["--ort", "--dest", str(tmp_path / "dest")]) == 1
    err = capsys.readouterr().err
    assert err == (f"fetch_headers: error: refusing the fetch destination {part}: it is writable by "
                   f"group or others (mode 777); run `chmod go-w {part}` or remove it (it is fetched "
                   f"again) ({fetch_headers.DEST_HINT})\n")


# --- pip runs isolated, in a folder of its own ---

MARKER_PIP = ("import os, pathlib, sys\n"
              "pathlib.Path({marker!r}).write_text(os.getcwd())\n"
              "sys.exit(0)\n")


def _plant_pip(folder: Path, marker: Path) -> None:
    (folder / "pip").mkdir(parents=True)
    (folder / "pip" / "__init__.py").write_text("")
    (folder / "pip" / "__main__.py").write_text(MARKER_PIP.format(marker=str(marker)))


def test_pip_in_the_callers_folder_does_not_run(tmp_path, monkeypatch):
    caller, marker = tmp_path / "caller", tmp_path / "marker"
    _plant_pip(caller, marker)
    monkeypatch.chdir(caller)
    with fetch.download_folder() as folder, pytest.raises(FetchError) as exc:
        fetch.pip_download(folder, ["surely-not-a-package==0"], "surely-not-a-package==0",
                           "(a test)", options=("--no-index",))
    assert not marker.exists(), f"the planted pip ran in {marker.read_text()}"
    assert "pip download of surely-not-a-package==0 failed" in str(exc.value)


def test_pip_command_ignores_the_current_folder_and_pythonpath(tmp_path):
    caller, marker = tmp_path / "caller", tmp_path / "marker"
    _plant_pip(caller, marker)
    for env in ({}, {"PYTHONPATH": str(caller)}):
        proc = subprocess.run(fetch.pip_command("--version"), cwd=caller, capture_output=True,
                              text=True, env={**os.environ, **env}, timeout=120)
        assert not marker.exists(), f"the planted pip ran ({env or 'from the current folder'})"
        assert proc.returncode == 0 and proc.stdout.startswith("pip "), proc.stdout + proc.stderr


# --- the fetchers on the helper, with local archives ---

def _fake_pytriton(folder: Path) -> Path:
    (folder / "wheels").mkdir()
    return make_zip(folder / "wheels" / "nvidia_pytriton-0.7.0-py3-none-any.whl", {
        serving_fetch.BINARY: (b"\x7fELF", 0o755),
        "pytriton/tritonserver/backends/python/triton_python_backend_stub": (b"\x7fELF", 0o755),
        "nvidia_pytriton.libs/libz.so": (b"\x7fELF", 0o644),
        "pytriton/client/__init__.py": (b"", 0o644)})


def test_serving_fetch_unpacks_the_server_and_reuses_it(tmp_path, monkeypatch):
    downloads = []
    monkeypatch.setattr(serving_fetch, "_download", lambda folder: downloads.append(folder) or
                        _fake_pytriton(folder))
    dest = tmp_path / "tritonserver" / "0.7.0"
    assert serving_fetch.fetch(dest) == dest
    assert os.access(dest / serving_fetch.BINARY, os.X_OK)
    assert (dest / "nvidia_pytriton.libs" / "libz.so").is_file()
    assert not (dest / "pytriton" / "client").exists()
    assert sorted(p.name for p in dest.parent.iterdir()) == ["0.7.0"]
    assert serving_fetch.fetch(dest) == dest and len(downloads) == 1  # the second run reuses it


def test_serving_fetch_into_an_existing_file_is_one_typed_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(serving_fetch, "_download", _fake_pytriton)
    dest = tmp_path / "server"
    dest.write_text("not a folder")
    assert serving_fetch.main(["--dest", str(dest)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err == (f"fetch_tritonserver: error: refusing the fetch destination {dest}: it is not a "
                   f"folder; remove it or pass another folder ({serving_fetch.DEST_HINT})\n")
    assert dest.read_text() == "not a folder"


def test_fetch_headers_ort_from_a_local_package(tmp_path, monkeypatch, capsys):
    tgz = make_tgz(tmp_path / "ort.tgz", {
        fetch_headers.ORT_HEADERS_PREFIX + "onnxruntime_c_api.h": b"#define ORT_API_VERSION 29\n",
        fetch_headers.ORT_HEADERS_PREFIX + "onnxruntime_cxx_api.h": b"// C++\n",
        fetch_headers.ORT_HEADERS_PREFIX + "nested/skip.h": b"",
        fetch_headers.ORT_LICENSE_MEMBER: b"MIT License\n", "package/README.md": b""})

    def fake_pack(folder, spec, hint):
        assert spec == fetch_headers.ORT_NPM_SPEC
        return Path(tgz.replace(folder / "ort.tgz"))

    monkeypatch.setattr(fetch_headers, "npm_pack", fake_pack)
    monkeypatch.setattr(fetch_headers, "ORT_NPM_SHA256", hashlib.sha256(tgz.read_bytes()).hexdigest())
    dest = tmp_path / "dest"
    assert fetch_headers.main(["--ort", "--dest", str(dest)]) == 0
    out = capsys.readouterr().out
    assert out == f"ORT_INCLUDE_DIR={dest / 'onnxruntime'}  (ORT_API_VERSION 29)\n"
    assert sorted(p.name for p in (dest / "onnxruntime").iterdir()) == \
        [STAMP, "LICENSE", "onnxruntime_c_api.h", "onnxruntime_cxx_api.h"]
    assert sorted(p.name for p in dest.iterdir()) == ["onnxruntime"]


def test_tensorrt_rtx_script_links_the_libraries_relative_to_the_swapped_folder(tmp_path, monkeypatch):
    script = ROOT / "scripts" / "fetch_tensorrt_rtx.py"
    spec = importlib.util.spec_from_file_location("fetch_tensorrt_rtx", script)
    rtx = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rtx)

    def fake_pip(folder, requirements, what, hint, options=()):
        assert "--require-hashes" in options and all("--hash=sha256:" in r for r in requirements)
        (folder / "wheels").mkdir()
        libs = {f"tensorrt_rtx_libs/{n}.1": (n.encode(), 0o755) for n in rtx.LIBRARIES}
        return [make_zip(folder / "wheels" / "libs.whl", libs),
                make_zip(folder / "wheels" / "bindings.whl",
                         {"tensorrt_rtx_bindings/__init__.py": (b"", 0o644)})]

    monkeypatch.setattr(rtx, "pip_download", fake_pip)
    monkeypatch.setattr(rtx, "BINDINGS_SHA256", {f"cp{sys.version_info[0]}{sys.version_info[1]}": "0" * 64})
    dest = tmp_path / "rtx" / rtx.VERSION
    site, lib = rtx.fetch(dest)
    assert (site / "tensorrt_rtx_bindings" / "__init__.py").is_file()
    for name in rtx.LIBRARIES:
        assert (lib / name).read_bytes() == name.encode()  # the link resolves after the swap
        assert not os.readlink(lib / name).startswith("/")
    assert rtx.fetch(dest) == (site, lib)  # complete: reused


class _Renameat2:
    """A libc whose renameat2 fails with ``err`` (EINVAL: a file system without RENAME_EXCHANGE)."""

    def __init__(self, err: int):
        self.err = err
        self.renameat2 = lambda *args: -1


@pytest.mark.parametrize("err", ["EINVAL", "ENOSYS", "EOPNOTSUPP"])
def test_refetching_without_an_atomic_exchange_falls_back_to_two_renames(tmp_path, monkeypatch, err):
    import errno as errno_module

    code = getattr(errno_module, err)
    monkeypatch.setattr(fetch.ctypes, "CDLL", lambda *a, **k: _Renameat2(code))
    monkeypatch.setattr(fetch.ctypes, "get_errno", lambda: code)
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    assert fetch._exchange(a, b) is False  # not available: the caller renames twice
    final = tmp_path / "cache" / "part"
    fetch.install(final, writer({"old.h": "old"}), "pkg==1")
    fetch.install(final, writer({"new.h": "new"}), "pkg==2")  # the re-fetch swaps by two renames
    assert sorted(p.name for p in final.iterdir()) == [STAMP, "new.h"]
    assert sorted(p.name for p in final.parent.iterdir()) == ["part"]


def test_another_renameat2_failure_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    import errno as errno_module

    monkeypatch.setattr(fetch.ctypes, "CDLL", lambda *a, **k: _Renameat2(errno_module.EACCES))
    monkeypatch.setattr(fetch.ctypes, "get_errno", lambda: errno_module.EACCES)
    with pytest.raises(OSError) as info:
        fetch._exchange(tmp_path / "a", tmp_path / "b")
    assert info.value.errno == errno_module.EACCES


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder root's needs root")
def test_a_non_root_user_fetches_under_a_shared_temporary_folder(tmp_path, monkeypatch):
    # as /tmp: root's, world-writable and sticky; the fetching user is not root (faked: the suite
    # runs as root)
    shared = tmp_path / "shared_tmp"
    shared.mkdir()
    shared.chmod(0o1777)
    os.chown(shared, 0, 0)
    monkeypatch.setattr(fetch.os, "geteuid", lambda: 1000)
    assert fetch.check_destination(shared / "part") is False  # the parent is trusted: root's, sticky
    planted = shared / "part"
    planted.mkdir()  # made by root, not by this user: refused, not used
    with pytest.raises(CacheError, match="is owned by uid 0, not by the current user \\(uid 1000\\)"):
        fetch.check_destination(planted)
    shared.chmod(0o777)  # no sticky bit: another user could swap what is put there
    with pytest.raises(CacheError, match="no sticky bit"):
        fetch.check_destination(shared / "other")


@pytest.mark.skipif(os.geteuid() != 0, reason="making folders of root and of another user needs root")
def test_a_parent_folder_of_root_is_trusted_one_of_another_user_is_not(tmp_path, monkeypatch):
    # the fetching user is uid 1000 (faked); /opt-like parents: root's and not writable by others
    monkeypatch.setattr(fetch.os, "geteuid", lambda: 1000)
    roots = tmp_path / "roots"
    roots.mkdir()
    roots.chmod(0o755)
    os.chown(roots, 0, 0)
    assert fetch.check_destination(roots / "part") is False  # root's parent: trusted
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o755)
    os.chown(theirs, 2000, 2000)  # another user could rename what is put there
    with pytest.raises(CacheError, match="owned by uid 2000"):
        fetch.check_destination(theirs / "part")


def test_fetch_headers_refuses_an_ort_package_without_its_header_or_license(tmp_path, monkeypatch, capsys):
    tgz = make_tgz(tmp_path / "ort.tgz", {
        fetch_headers.ORT_HEADERS_PREFIX + "onnxruntime_cxx_api.h": b"// C++ only\n",
        fetch_headers.ORT_LICENSE_MEMBER: b"MIT License\n"})
    monkeypatch.setattr(fetch_headers, "npm_pack", lambda folder, spec, hint: Path(tgz.replace(folder / "ort.tgz")))
    monkeypatch.setattr(fetch_headers, "ORT_NPM_SHA256", hashlib.sha256(tgz.read_bytes()).hexdigest())
    dest = tmp_path / "dest"
    assert fetch_headers.main(["--ort", "--dest", str(dest)]) == 1
    err = capsys.readouterr().err
    assert (f"{fetch_headers.ORT_NPM_SPEC}: {fetch_headers.ORT_HEADERS_PREFIX}{fetch_headers.ORT_MARKER} "
            f"or {fetch_headers.ORT_LICENSE_MEMBER} missing from the package") in err
    assert not (dest / "onnxruntime").exists()
