#!/usr/bin/env python3
"""Fetch the third-party C/C++ headers kernel_lens builds plugins against, into a local cache.

A thin wrapper, for a source checkout, around kernel_lens.toolchain.fetch_headers (the one copy of
the logic, pinned sha256 digests included), which installed users run as `kernel_lens fetch-headers`.
That module and what it imports are standard library only, so this script runs before kernel_lens
(or torch) is installed: it puts this checkout's src/ first on sys.path.

Usage: python scripts/fetch_headers.py [DEST] [--ort] [--trt] [--dest DIR] [--no-verify]
(no part: both; DEST defaults to $KERNEL_LENS_HEADERS, else ~/.cache/kernel_lens/headers).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_lens.toolchain.fetch_headers import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
