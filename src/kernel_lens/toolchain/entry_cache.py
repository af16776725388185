"""Small content-addressed cache entries: kernel binaries, lowered ONNX models, torchlib's op list.

An entry is ``<kernel_lens cache>/<kind>/<key><suffix>``: a header line ``kl-entry-1 <sha256>``
then the body. It is reused only if it is a regular file (not a link) of the current user that
only they can write, and the recorded sha256 matches the body (docs/security.md); anything else
is ignored with a warning and rewritten. Writes are atomic.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from ..errors import CacheError

log = logging.getLogger(__name__)

SCHEMA = "kl-entry-1"


def key_of(*parts: Any) -> str:
    """A sha256 key over JSON-serializable parts (bytes are hashed first)."""
    norm = [hashlib.sha256(p).hexdigest() if isinstance(p, (bytes, bytearray)) else p for p in parts]
    return hashlib.sha256(json.dumps(norm, default=str, sort_keys=True).encode()).hexdigest()


def _path(kind: str, key: str, suffix: str) -> Path | None:
    from .build import _checked_folder, build_cache_dir

    path = build_cache_dir() / kind / f"{key}{suffix}"
    try:
        _checked_folder(path.parent.parent, "root", create=True)
        _checked_folder(path.parent, f"{kind} folder", create=True)
    except CacheError as exc:
        log.warning("%s cache not used: %s", kind, exc)
        return None
    return path


def read(kind: str, key: str, suffix: str = "") -> bytes | None:
    """The body of a trusted entry, or None (missing, or not trusted: then a warning)."""
    from .build import _read_trusted

    path = _path(kind, key, suffix)
    if path is None:
        return None
    data, problem = _read_trusted(path)
    if data is not None and problem is None:
        header, _, body = data.partition(b"\n")
        fields = header.decode("ascii", "replace").split()
        if fields == [SCHEMA, hashlib.sha256(body).hexdigest()]:
            return body
        problem = "its recorded sha256 does not match its content"
    if problem:
        log.warning("%s cache entry %s not reused (%s); it is rebuilt", kind, path, problem)
    return None


def write(kind: str, key: str, body: bytes, suffix: str = "") -> None:
    from ..fileio import atomic_write

    path = _path(kind, key, suffix)
    if path is not None:
        atomic_write(path, f"{SCHEMA} {hashlib.sha256(body).hexdigest()}\n".encode() + body,
                     mode=0o644)
