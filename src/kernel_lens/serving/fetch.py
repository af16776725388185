"""Fetch NVIDIA's ``tritonserver`` binary (PyPI ``nvidia-pytriton==0.7.0``, pinned sha256) into a
local cache, for running exported model repositories without a container.

The wheel carries a real ``tritonserver`` (Triton Inference Server 2.51), ``libtritonserver``,
the **python backend only** and one python-backend stub per CPython 3.8 .. 3.13. It is not
installed with pip: its metadata pins ``numpy<2`` (and more), which would downgrade the
environment kernel_lens runs in. Instead this module:
- downloads the one wheel with ``pip download --no-deps --require-hashes`` (nothing unpinned is
  accepted);
- unpacks only ``pytriton/tritonserver/`` and ``nvidia_pytriton.libs/`` into DEST, keeping the
  files' execute bits (the binary and the stubs are executables), through a temporary folder
  swapped into place, so an interrupted run leaves no half install.

Downloading (isolated pip), unpacking, the swap and the checks that DEST and its parent are
folders of this user's own are :mod:`kernel_lens.toolchain.fetch`'s; DEST that exists as a file,
a link, another user's folder or a folder writable by others is a one-line
:class:`~kernel_lens.errors.CacheError`.

DEST defaults to $KERNEL_LENS_TRITONSERVER, else ~/.cache/kernel_lens/tritonserver/0.7.0, which
is where :mod:`kernel_lens.serving.tritonserver` looks. Reruns reuse the cache.

Usage: python -m kernel_lens.serving.fetch [--dest DIR]   (prints TRITONSERVER_ROOT=DIR;
scripts/fetch_tritonserver.py is the same from a source tree)

Standard library only, so the script runs before kernel_lens (or torch) is installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path
from typing import Sequence

from kernel_lens.errors import KernelLensError
from kernel_lens.toolchain.fetch import (FetchError, check_destination, download_folder, install,
                                         pip_download, unpack)

VERSION = "0.7.0"  # nvidia-pytriton; its tritonserver is Triton Inference Server 2.51.0
WHEEL_SHA256 = "21f063ff93bb426d0c06b7a55e7eb9efcfe62c0dddd9a908e9877e18710128df"
WHEEL_PLATFORM = "manylinux_2_35_x86_64"  # the wheel's only build: glibc 2.35 or newer, x86-64
MEMBERS = ("pytriton/tritonserver/", "nvidia_pytriton.libs/")
BINARY = "pytriton/tritonserver/bin/tritonserver"
DEST_HINT = "pass --dest, or set KERNEL_LENS_TRITONSERVER, to a folder of your own"

__all__ = ["BINARY", "FetchError", "default_dest", "fetch", "main"]


def default_dest() -> Path:
    env = os.environ.get("KERNEL_LENS_TRITONSERVER")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "tritonserver" / VERSION


def _server_member(name: str) -> str | None:
    """The server's members of the wheel, kept at their paths."""
    return name if name.startswith(MEMBERS) else None


def _download(folder: Path) -> Path:
    return pip_download(folder, [f"nvidia-pytriton=={VERSION} --hash=sha256:{WHEEL_SHA256}"],
                        f"nvidia-pytriton=={VERSION}",
                        "PyPI must be reachable, or unpack the wheel yourself and set "
                        "KERNEL_LENS_TRITONSERVER to the folder",
                        options=("--platform", WHEEL_PLATFORM, "--require-hashes"),
                        pattern="nvidia_pytriton-*.whl")[0]


def fetch(dest: Path | None = None) -> Path:
    """DEST with the server unpacked in it (downloaded once; reused afterwards)."""
    dest = (dest or default_dest()).expanduser().absolute()
    if check_destination(dest, DEST_HINT) and (dest / BINARY).is_file():
        return dest

    def fill(staging: Path) -> None:
        unpack(wheel, staging, _server_member)
        if not (staging / BINARY).is_file():
            raise FetchError(f"nvidia-pytriton=={VERSION} has no {BINARY}")

    with download_folder("kl_tritonserver_") as tmp:
        wheel = _download(tmp)
        install(dest, fill, f"nvidia-pytriton=={VERSION}", DEST_HINT)
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fetch_tritonserver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None,
                        help=f"install folder (default: $KERNEL_LENS_TRITONSERVER, else {default_dest()})")
    args = parser.parse_args(argv)
    try:
        root = fetch(args.dest)
    except (KernelLensError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_tritonserver: error: {exc}", file=sys.stderr)
        return 1
    print(f"TRITONSERVER_ROOT={root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
