"""Export a compiled model folder (``kernel_lens compile FILE.py --target ort -o DIR``) as one
model of a Triton Inference Server model repository::

    REPO/NAME/config.pbtxt                 the model configuration (relative file names only)
    REPO/NAME/kernel_lens_export.json      what was exported (Triton ignores it)
    REPO/NAME/1/model.onnx                 the ONNX graph (+ its external-data file, if any)
    REPO/NAME/1/libkl_<Name>_ort_<sha>.so  the custom-op library (<sha>: of its content)
    REPO/NAME/1/model.py                   python backend only

``REPO/NAME`` is written into a staging folder beside the repository (inside it only when the
folder beside it cannot be used) and swapped in whole, so a server never sees half an export,
an export killed half-way leaves nothing in the repository (the next export removes what it
left), and a re-export leaves nothing stale; a folder there that an export did not write is
never replaced.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import jinja2
from google.protobuf import text_encoding
from pydantic import BaseModel, ConfigDict

from .. import progress
from ..errors import ArtifactError, InputError, OutputPathError
from ..fileio import atomic_copy, atomic_write, ensure_folder, inside, process_alive, umask
from ..ir import GraphIR
from ..onnx.external_data import external_data_files
from ..version import __version__
from .backends import VERSION, BackendConfig, CompiledArtifacts, TritonBackend, get_backend
from .interface import ModelInterface, check_file_name, check_name, load_graph, read_interface

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
MARKER = "kernel_lens_export.json"


class TritonExport(BaseModel):
    """The result of :func:`export_triton`."""

    model_config = ConfigDict(frozen=True)

    name: str
    backend: str
    model_dir: Path
    config: Path
    files: dict[str, Path]      # NAME/1/ file name -> its path
    interface: ModelInterface
    notes: list[str]            # what the deployment needs (printed by the CLI)


def _compiled(directory: str | Path, kind: TritonBackend) -> tuple[CompiledArtifacts, GraphIR]:
    with progress.stage(f"read {directory}"):
        from ..compiler import load  # lazy: torch and triton (seconds to import); nothing else here needs them

        compiled = load(directory)  # validates the manifest: every path lies inside the folder
    target = next((t for t in kind.targets
                   if f"{t}.onnx" in compiled.artifacts and f"{t}.library" in compiled.artifacts), None)
    if target is None:
        wanted = kind.targets[0]
        raise ArtifactError(f"{directory} has no {wanted}.onnx / {wanted}.library artifact: Triton's "
                            f"{kind.name} backend serves the {wanted} target's ONNX graph and library; "
                            f"compile with kernel_lens compile FILE.py --target {wanted} -o {directory}")
    onnx_path, library = compiled.artifacts[f"{target}.onnx"], compiled.artifacts[f"{target}.library"]
    if kind.opens_library:  # the folder is data: build the graph and library from its IR instead
        from ..compiler import CompiledModel, _compile_into_cache  # lazy: see load above

        with progress.stage(f"build the {target} graph and library from the IR"):
            rebuilt = _compile_into_cache(CompiledModel(compiled.ir), [target])
        onnx_path, library = rebuilt.artifacts[f"{target}.onnx"], rebuilt.artifacts[f"{target}.library"]
    check_file_name(library.name, f"{directory}: library file name", "recompile into the folder")
    check_name(library.stem, f"{directory}: library file name", "recompile into the folder")
    if library.suffix != ".so":
        raise ArtifactError(f"{directory}: the op library {library.name!r} is not named as a shared "
                            f"library (libkl_<Model>_<target>.so); recompile into the folder")
    return CompiledArtifacts(name=compiled.ir.name, onnx=onnx_path, onnx_data=_external_data(onnx_path),
                             library=library, ir=compiled.ir, target=target), compiled.ir


def _external_data(onnx_path: Path) -> dict[str, Path]:
    """The external-data files the graph names (weights past 2 GB), each inside its folder:
    every tensor's location is checked (initializers, ``Constant`` attributes, subgraphs,
    functions), and each file name must also be one the export may write."""
    load_graph(onnx_path)  # a corrupt graph is one typed line naming the file
    found = external_data_files(onnx_path)
    for location in found:
        check_file_name(location, f"{onnx_path}: a tensor keeps its data in a file",
                        "only a plain file beside the graph is exported (recompile)")
    return found


def pbtxt_string(value: object) -> str:
    """``value`` as the inside of a protobuf text-format string literal (quotes, backslashes and
    control characters escaped): no name can end its string and start a field of its own."""
    return text_encoding.CEscape(str(value), as_utf8=True)


def pbtxt_comment(value: object) -> str:
    """``value`` for a ``#`` comment line: every character that is not printable (a line break
    above all, which would end the comment) written as its escape."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in str(value))


def render_config(name: str, source: CompiledArtifacts, interface: ModelInterface,
                  config: BackendConfig, backend_name: str, instances: int) -> str:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE)), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["pbtxt"] = pbtxt_string  # every string value goes through one of the two
    env.filters["comment"] = pbtxt_comment
    return env.get_template("config.pbtxt.j2").render(
        name=name, source_name=source.name, backend_name=backend_name, interface=interface,
        instances=instances, platform=config.platform, backend=config.backend,
        default_model_filename=config.default_model_filename, instance_kind=config.instance_kind,
        parameters=config.parameters, cuda_options=config.cuda_options,
        op_libraries=config.op_libraries, notes=config.notes)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _check_replaceable(model_dir: Path) -> None:
    """An existing ``model_dir`` is replaced only when it is a real folder (not a link) holding a
    marker that is a regular file (not a link to one elsewhere): an earlier export."""
    folder = _lstat(model_dir)
    if folder is None:
        return
    if not stat.S_ISDIR(folder.st_mode):
        raise OutputPathError(f"{model_dir} exists and is not a folder; remove it or pass another --name")
    marker = _lstat(model_dir / MARKER)
    if marker is None or not stat.S_ISREG(marker.st_mode):
        raise OutputPathError(f"{model_dir} exists and was not written by kernel_lens export-triton "
                              f"(no {MARKER} regular file in it; a link does not count); remove it "
                              f"or pass another --name")


_STAGING = ".kl-export-"  # staging folders: .kl-export-<repo>-<name>-<new|old>-<pid>-<random>


def _staging_folder(repository: Path) -> Path:
    """Where REPO/NAME is written before the swap: beside the repository when that folder is
    writable and on the same filesystem (a server indexes every folder in the repository, so an
    export killed half-way must leave nothing there), else the repository itself."""
    parent = repository.absolute().parent
    try:
        if os.access(parent, os.W_OK) and os.stat(parent).st_dev == os.stat(repository).st_dev:
            return parent
    except OSError:
        pass
    return repository


def _staging_prefix(repository: Path, name: str, kind: str) -> str:
    return f"{_STAGING}{repository.absolute().name}-{name}-{kind}-{os.getpid()}-"


def _remove_stale(where: Path, repository: Path) -> None:
    """Remove staging folders of this repository left by exports that were killed (their
    process is gone), if they are this user's own."""
    mine = f"{_STAGING}{repository.absolute().name}-"
    for place in {where, repository}:
        try:
            entries = list(os.scandir(place))
        except OSError:
            continue
        for entry in entries:
            if not entry.name.startswith(mine):
                continue
            try:
                pid = int(entry.name.rsplit("-", 2)[-2])
                info = entry.stat(follow_symlinks=False)
            except (ValueError, OSError):
                continue
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or process_alive(pid):
                continue
            log.info("removing %s, left by an export that did not finish", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


def _write_model_dir(repository: Path, name: str, config_text: str, files: dict[str, Path],
                     provenance: dict) -> Path:
    """Write REPO/NAME in a staging folder (:func:`_staging_folder`), then swap it in whole."""
    model_dir = inside(repository, name)
    _check_replaceable(model_dir)
    where = _staging_folder(repository)
    _remove_stale(where, repository)
    staging = Path(tempfile.mkdtemp(prefix=_staging_prefix(repository, name, "new"), dir=where))
    try:
        os.chmod(staging, 0o777 & ~umask())
        version = staging / VERSION
        version.mkdir()
        for file_name, source in files.items():
            mode = 0o755 if file_name.endswith(".so") else 0o644
            atomic_copy(source, inside(version, file_name), mode=mode)
        atomic_write(inside(staging, "config.pbtxt"), config_text)
        atomic_write(inside(staging, MARKER), json.dumps(provenance, indent=1) + "\n")
        old = None
        if model_dir.exists():
            old = Path(tempfile.mkdtemp(prefix=_staging_prefix(repository, name, "old"), dir=where))
            os.replace(model_dir, old / name)
        os.replace(staging, model_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return model_dir


def export_triton(directory: str | Path, repository: str | Path, *, name: str | None = None,
                  backend: str = "onnxruntime", instances: int = 1,
                  max_batch_size: int = 0) -> TritonExport:
    """Export the compiled model in ``directory`` as ``REPOSITORY/NAME`` for Triton's ``backend``
    (``onnxruntime``, ``python`` or ``tensorrt``), with ``instances`` instances per GPU; ``max_batch_size > 0``
    makes the leading dynamic dim Triton's batch dim (it must lead every input and output)."""
    kind = get_backend(backend)
    if isinstance(instances, bool) or not isinstance(instances, int) or instances < 1:
        raise InputError(f"--instances must be a positive number of instances per GPU, got {instances!r}")
    source, ir = _compiled(directory, kind)
    name = check_name(name if name is not None else source.name, "model name",
                      "pass --name NAME with such a name (it is REPO/NAME and the name clients call)")
    interface = read_interface(source.onnx, ir, max_batch_size)
    config = kind.config(source)
    text = render_config(name, source, interface, config, kind.name, instances)
    with progress.stage(f"{kind.name} backend files"):
        files = kind.version_files(source)
    provenance = {"kernel_lens": __version__, "backend": kind.name, "model": source.name,
                  "target": source.target,
                  "files": {f: _sha256(p) for f, p in files.items()}}
    repository = ensure_folder(repository)
    with progress.stage(f"write {Path(repository) / name}"):
        model_dir = _write_model_dir(repository, name, text, files, provenance)
    log.info("exported %s to %s (%s backend)", source.name, model_dir, kind.name)
    return TritonExport(name=name, backend=kind.name, model_dir=model_dir, config=model_dir / "config.pbtxt",
                        files={f: model_dir / VERSION / f for f in files}, interface=interface,
                        notes=kind.deployment_notes(model_dir, source))
