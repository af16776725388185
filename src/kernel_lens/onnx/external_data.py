"""Where an ONNX model keeps tensor data outside itself, checked for every tensor in it.

A tensor whose ``data_location`` is EXTERNAL names a file (``location``) that ONNX Runtime and
TensorRT read when they load the graph, and that an export copies next to it. Such a location
can sit on any tensor, not only on the top-level initializers: on a ``Constant`` node's
attribute, on an initializer of a subgraph (``If``/``Loop``/``Scan`` bodies), on a function's
node, on the values or indices of a sparse tensor. :func:`tensors` walks all of them, and
:func:`check_locations` / :func:`external_data_files` allow only what kernel_lens writes: a plain
file name beside the graph (no folder part, not absolute, no '..'), which, when the file is
looked for, must be a file that resolves inside the graph's folder (a link leading out is
refused). Anything else is an :class:`ArtifactError` naming the tensor and the location.
"""

from __future__ import annotations

from pathlib import Path, PurePath
from typing import Iterator

import onnx

from ..errors import ArtifactError


def _graph_tensors(graph: onnx.GraphProto | onnx.FunctionProto, where: str
                   ) -> Iterator[tuple[onnx.TensorProto, str]]:
    for t in getattr(graph, "initializer", ()):
        yield t, f"initializer {t.name!r}{where}"
    for s in getattr(graph, "sparse_initializer", ()):
        yield s.values, f"sparse initializer {s.values.name!r}{where} (values)"
        yield s.indices, f"sparse initializer {s.values.name!r}{where} (indices)"
    for node in graph.node:
        label = f"{node.op_type} node {node.name!r}{where}"
        for attr in node.attribute:
            at = f"attribute {attr.name!r} of {label}"
            if attr.HasField("t"):
                yield attr.t, at
            for t in attr.tensors:
                yield t, at
            sparse = [attr.sparse_tensor] if attr.HasField("sparse_tensor") else []
            for s in [*sparse, *attr.sparse_tensors]:
                yield s.values, f"{at} (sparse values)"
                yield s.indices, f"{at} (sparse indices)"
            subgraphs = [attr.g] if attr.HasField("g") else []
            for g in [*subgraphs, *attr.graphs]:
                yield from _graph_tensors(g, f" in subgraph {g.name!r} ({at})")


def tensors(model: onnx.ModelProto) -> Iterator[tuple[onnx.TensorProto, str]]:
    """Every tensor in ``model`` with where it sits: initializers (sparse too), node attribute
    tensors (``Constant``'s value among them), subgraphs at any depth, and functions."""
    yield from _graph_tensors(model.graph, "")
    for fn in model.functions:
        yield from _graph_tensors(fn, f" in function {fn.name!r}")


def _location(tensor: onnx.TensorProto) -> str:
    return next((e.value for e in tensor.external_data if e.key == "location"), "")


def check_locations(model: onnx.ModelProto, source: str | Path) -> dict[str, list[str]]:
    """The external-data file names of ``model`` (location -> the tensors that use it), each
    checked to be a plain file name beside the graph; ``source`` names the model in errors."""
    found: dict[str, list[str]] = {}
    for tensor, where in tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = _location(tensor)
        parts = PurePath(location).parts
        if (not location or PurePath(location).is_absolute() or len(parts) != 1
                or location in (".", "..") or "\\" in location or "\0" in location):
            raise ArtifactError(f"{source}: {where} keeps its data at {location!r}; only a file "
                                f"beside the graph is allowed (no folder, not absolute, no '..'): "
                                f"recompile")
        found.setdefault(location, []).append(where)
    return found


def external_data_files(onnx_path: str | Path) -> dict[str, Path]:
    """The external-data files the graph at ``onnx_path`` names (location -> path), each a
    plain file name beside it that exists and resolves inside its folder."""
    onnx_path = Path(onnx_path)
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError and OSError alike
        raise ArtifactError(f"{onnx_path} is not a readable ONNX model ({type(exc).__name__}); "
                            f"recompile") from None
    folder = onnx_path.parent
    files: dict[str, Path] = {}
    for location, users in check_locations(model, onnx_path).items():
        path = folder / location
        if not path.is_file() or not path.resolve().is_relative_to(folder.resolve()):
            raise ArtifactError(f"{onnx_path}: external data file {path} (of {users[0]}) is missing "
                                f"or lies outside {folder} (through a link); recompile")
        files[location] = path
    return files
