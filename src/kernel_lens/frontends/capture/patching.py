"""Scoped patches of Triton's and torch's classes during capture and trace (restored on exit)."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def patched(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` for the duration of the block; ``name`` must be defined on ``obj``
    itself (not inherited), so that restoring it puts back exactly what was there."""
    old = obj.__dict__[name]
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)
