"""Importing large, long-lived module graphs without paying the cyclic GC for them."""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

# Freezing moves *every* live object into the permanent generation, a library user's too, so it
# is done only in kernel_lens's own process: the CLI sets this; `import kernel_lens` does not.
FREEZE = False


@contextlib.contextmanager
def paused_then_frozen() -> Iterator[None]:
    """Run the block (module imports) with the cyclic GC paused, then ``gc.freeze()`` (only when
    :data:`FREEZE` is set, i.e. in the ``kernel_lens`` command).

    Importing torch.export's tracer creates about a million long-lived objects (torch._dynamo,
    torch._inductor's config, ...). With the GC running, that triggers several full collections
    over the whole heap, torch's included, and every later full collection (the one at
    interpreter exit too) scans them again: together about as long as the import itself.
    ``gc.freeze()`` moves everything alive into the permanent generation, which collections
    skip. Frozen objects are still freed by reference counting; only reference cycles among
    them are kept, as module-level state is anyway. Used at module import, so once per process.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if FREEZE:
            gc.freeze()
        if enabled:
            gc.enable()
