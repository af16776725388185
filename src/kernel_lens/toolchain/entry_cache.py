"""Small content-addressed cache entries: kernel binaries, lowered ONNX models, torchlib's op list.

An entry is ``<kernel_lens cache>/<kind>/<key><suffix>`` with its sha256 recorded beside it
(``<key><suffix>.sha256``). It is reused only if it passes the cache's one trust check
(:func:`kernel_lens.toolchain.cache.entry_problem`: a regular file, not a link, of the current
user that only they can write, whose sha256 matches the record; docs/security.md); anything else
is ignored with a warning and rewritten. Writes are atomic. A cache folder that cannot be trusted
is not used (a warning): the caller computes the value afresh.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from ..errors import CacheError
from . import cache

log = logging.getLogger(__name__)


def key_of(*parts: Any) -> str:
    """A sha256 key over JSON-serializable parts (bytes are hashed first)."""
    norm = [hashlib.sha256(p).hexdigest() if isinstance(p, (bytes, bytearray)) else p for p in parts]
    return hashlib.sha256(json.dumps(norm, default=str, sort_keys=True).encode()).hexdigest()


def path_of(kind: str, key: str, suffix: str = "") -> Path | None:
    """Where the entry lives (its folders made and checked), or None if they cannot be trusted."""
    try:
        return cache.cache_folder(kind) / f"{key}{suffix}"
    except CacheError as exc:
        log.warning("%s cache not used: %s", kind, exc)
        return None


def read(kind: str, key: str, suffix: str = "") -> bytes | None:
    """The body of a trusted entry, or None (missing, or not trusted: then a warning)."""
    path = path_of(kind, key, suffix)
    return None if path is None else cache.read_entry(path, kind)


def write(kind: str, key: str, body: bytes, suffix: str = "") -> None:
    path = path_of(kind, key, suffix)
    if path is not None:
        cache.write_entry(path, body)
