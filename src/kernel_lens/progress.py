"""Progress of a compile, stage by stage: what runs now, what each stage took, what was reused.

Stages report through the ``kernel_lens.progress`` logger at INFO level: a *start* record when a
stage begins and a *done* record with its time (and a note such as "reused from cache") when it
ends. As a library kernel_lens prints nothing (the logger has no handler; attach one to see the
records); the CLI shows them on stderr (:func:`kernel_lens.cli` : a spinner on a terminal through
rich, plain lines otherwise, nothing with ``-q``).

Stages: ``load model`` (CLI), ``capture`` (the eager run recording the Triton launches),
``trace`` (torch.export), ``aot <kernel>`` (Triton compiles a kernel), ``pass <name>``,
``<target>: <stage>`` (lower, emit, build, ...), ``write``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

log = logging.getLogger("kernel_lens.progress")

START, DONE = "start", "done"


@dataclass
class Stage:
    """A running stage; ``note`` (e.g. "reused from cache") is shown with its time."""

    name: str
    note: str = ""
    seconds: float = 0.0


@contextmanager
def stage(name: str) -> Iterator[Stage]:
    """Report ``name`` starting, then done with its time (not when it raised: the error says)."""
    current = Stage(name)
    log.info("%s ...", name, extra={"kl_event": START, "kl_stage": current})
    start = time.perf_counter()
    yield current
    current.seconds = time.perf_counter() - start
    note = f", {current.note}" if current.note else ""
    log.info("%s: %.2f s%s", name, current.seconds, note, extra={"kl_event": DONE, "kl_stage": current})
