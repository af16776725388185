#!/usr/bin/env python3
"""Fetch NVIDIA's tritonserver (PyPI nvidia-pytriton==0.7.0, pinned sha256) into a local cache.

A thin wrapper, for a source checkout, around kernel_lens.serving.fetch (the one copy of the
logic, pinned digest included; standard library only, so this runs before kernel_lens or torch
is installed: it puts this checkout's src/ first on sys.path). The wheel is unpacked, not
pip-installed: its metadata pins numpy<2, which would downgrade the environment.

Usage: python scripts/fetch_tritonserver.py [--dest DIR]
(default DIR: $KERNEL_LENS_TRITONSERVER, else ~/.cache/kernel_lens/tritonserver/0.7.0).
Prints TRITONSERVER_ROOT=DIR; kernel_lens.serving.tritonserver finds the server there.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from kernel_lens.serving.fetch import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
