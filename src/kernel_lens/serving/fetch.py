"""Fetch NVIDIA's ``tritonserver`` binary (PyPI ``nvidia-pytriton==0.7.0``, pinned sha256) into a
local cache, for running exported model repositories without a container.

The wheel carries a real ``tritonserver`` (Triton Inference Server 2.51), ``libtritonserver``,
the **python backend only** and one python-backend stub per CPython 3.8 .. 3.13. It is not
installed with pip: its metadata pins ``numpy<2`` (and more), which would downgrade the
environment kernel_lens runs in. Instead this module:
- downloads the one wheel with ``pip download --no-deps --require-hashes`` (nothing unpinned is
  accepted);
- unpacks only ``pytriton/tritonserver/`` and ``nvidia_pytriton.libs/`` into DEST, keeping the
  files' modes (the binary and the stubs are executables), through a temporary folder renamed
  into place, so an interrupted run leaves no half install.

DEST defaults to $KERNEL_LENS_TRITONSERVER, else ~/.cache/kernel_lens/tritonserver/0.7.0, which
is where :mod:`kernel_lens.serving.tritonserver` looks. Reruns reuse the cache.

Usage: python -m kernel_lens.serving.fetch [--dest DIR]   (prints TRITONSERVER_ROOT=DIR;
scripts/fetch_tritonserver.py is the same from a source tree)

Standard library only, so the script runs before kernel_lens (or torch) is installed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Sequence

VERSION = "0.7.0"  # nvidia-pytriton; its tritonserver is Triton Inference Server 2.51.0
WHEEL_SHA256 = "21f063ff93bb426d0c06b7a55e7eb9efcfe62c0dddd9a908e9877e18710128df"
WHEEL_PLATFORM = "manylinux_2_35_x86_64"  # the wheel's only build: glibc 2.35 or newer, x86-64
MEMBERS = ("pytriton/tritonserver/", "nvidia_pytriton.libs/")
BINARY = "pytriton/tritonserver/bin/tritonserver"


class FetchError(Exception):
    pass


def default_dest() -> Path:
    env = os.environ.get("KERNEL_LENS_TRITONSERVER")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "tritonserver" / VERSION


def _download(folder: Path) -> Path:
    requirements = folder / "requirements.txt"
    requirements.write_text(f"nvidia-pytriton=={VERSION} --hash=sha256:{WHEEL_SHA256}\n")
    wheels = folder / "wheels"
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--platform", WHEEL_PLATFORM, "--require-hashes", "-r", str(requirements), "-d", str(wheels)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise FetchError(f"pip download of nvidia-pytriton=={VERSION} failed (exit {proc.returncode}):\n"
                         f"{proc.stderr.strip() or proc.stdout.strip()}\nPyPI must be reachable, or "
                         f"unpack the wheel yourself and set KERNEL_LENS_TRITONSERVER to the folder")
    found = sorted(wheels.glob("nvidia_pytriton-*.whl"))
    if not found:
        raise FetchError(f"pip download left no nvidia_pytriton wheel in {wheels}")
    return found[0]


def _extract(wheel: Path, folder: Path) -> None:
    """The server's members of the wheel, with the modes the wheel records (zipfile drops them)."""
    with zipfile.ZipFile(wheel) as archive:
        for info in archive.infolist():
            if not info.filename.startswith(MEMBERS) or info.is_dir():
                continue
            path = folder / info.filename
            if ".." in Path(info.filename).parts or Path(info.filename).is_absolute():
                raise FetchError(f"{wheel.name}: refusing member {info.filename!r} (outside the folder)")
            path.parent.mkdir(parents=True, exist_ok=True)
            with archive.open(info) as src, open(path, "wb") as dst:
                shutil.copyfileobj(src, dst)
            mode = (info.external_attr >> 16) & 0o777
            os.chmod(path, ((mode or 0o644) | 0o444) & 0o755)  # readable; writable by the owner only


def fetch(dest: Path | None = None) -> Path:
    """DEST with the server unpacked in it (downloaded once; reused afterwards)."""
    dest = (dest or default_dest()).expanduser().absolute()
    if (dest / BINARY).is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with tempfile.TemporaryDirectory() as tmp:
            _extract(_download(Path(tmp)), staging)
        if not (staging / BINARY).is_file():
            raise FetchError(f"nvidia-pytriton=={VERSION} has no {BINARY}")
        os.chmod(staging, 0o755)
        if dest.exists():  # an earlier, incomplete install (its binary is missing)
            shutil.rmtree(dest)
        os.replace(staging, dest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return dest


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="fetch_tritonserver", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None,
                        help=f"install folder (default: $KERNEL_LENS_TRITONSERVER, else {default_dest()})")
    args = parser.parse_args(argv)
    try:
        root = fetch(args.dest)
    except FetchError as exc:
        print(f"fetch_tritonserver: error: {exc}", file=sys.stderr)
        return 1
    print(f"TRITONSERVER_ROOT={root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
