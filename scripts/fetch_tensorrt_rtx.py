#!/usr/bin/env python3
"""Fetch TensorRT-RTX 1.7.1 (PyPI wheels, pinned sha256 digests) into a local cache, for the
tests that build real TensorRT engines with kernel_lens's plugins on a host without a GPU.

TensorRT-RTX is NVIDIA's TensorRT for RTX GPUs, with the same builder API; its wheels build
engines with no GPU present (see the project's environment notes). This script:
- downloads `tensorrt-rtx-cu13-libs` and this Python's `tensorrt-rtx-cu13-bindings` with
  `pip download --require-hashes` (nothing unpinned is accepted);
- unpacks them into CACHE/site (importable as `tensorrt_rtx_bindings`);
- adds CACHE/lib with the unversioned `libtensorrt_rtx.so` / `libtensorrt_onnxparser_rtx.so`
  names the ONNX parser dlopens (the wheel ships only `.so.1`), as relative links into site/;
- does both in a temporary folder next to CACHE that is swapped into place
  (kernel_lens.toolchain.fetch, as the other fetchers: isolated pip, and CACHE and its parent
  must be folders of this user's own that others cannot write).
Prints `TENSORRT_RTX_SITE=...` and `TENSORRT_RTX_LIB=...` (put the latter on LD_LIBRARY_PATH of
the process that imports the bindings). Reruns reuse the cache.

Usage: python scripts/fetch_tensorrt_rtx.py [--dest DIR]
(default DIR: $KERNEL_LENS_TENSORRT_RTX, else ~/.cache/kernel_lens/tensorrt_rtx/1.7.1.116).
"""

from __future__ import annotations

import argparse
import os
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's kernel_lens

from kernel_lens.errors import KernelLensError  # noqa: E402
from kernel_lens.toolchain.fetch import (FetchError, check_destination, download_folder,  # noqa: E402
                                         install, pip_download, unpack)

VERSION = "1.7.1.116"
LIBS_SHA256 = "e3fd45fed001240d63304e77a2d4006319b839994237cb294b6e7ad72acaabcd"
BINDINGS_SHA256 = {  # by CPython version
    "cp310": "f357cebfed83af6cbd1d3b172632cd9c6bb06a39e8296a8d3c11a9edd2fae357",
    "cp311": "6a4d2bf39a98b71238046b9a9dd22d0e6b146be90cd56ac09f1e068933e4e18d",
    "cp312": "52fb62cb86b922637848f5971b53153bf2e091c33948fa89efd215abaa52b044",
    "cp313": "f15cdb560cf2d926405789985509f5496e378ba457a7fb657592ce7f7311c0ff",
}
LIBRARIES = ("libtensorrt_rtx.so", "libtensorrt_onnxparser_rtx.so")
DEST_HINT = "pass --dest, or set KERNEL_LENS_TENSORRT_RTX, to a folder of your own"


def default_dest() -> Path:
    env = os.environ.get("KERNEL_LENS_TENSORRT_RTX")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "tensorrt_rtx" / VERSION


def _complete(dest: Path) -> bool:
    return (dest / "site" / "tensorrt_rtx_bindings").is_dir() and \
        all((dest / "lib" / n).exists() for n in LIBRARIES)


def _fill(wheels: list[Path], staging: Path) -> None:
    """site/: the wheels unpacked; lib/: the unversioned names, relative links into site/."""
    for wheel in wheels:
        unpack(wheel, staging / "site")
    (staging / "lib").mkdir()
    for name in LIBRARIES:
        target = Path("site") / "tensorrt_rtx_libs" / f"{name}.1"
        if not (staging / target).is_file():
            raise FetchError(f"{target} is missing from the tensorrt-rtx-cu13-libs=={VERSION} wheel")
        (staging / "lib" / name).symlink_to(Path("..") / target)


def fetch(dest: Path) -> tuple[Path, Path]:
    site, lib = dest / "site", dest / "lib"
    if check_destination(dest, DEST_HINT) and _complete(dest):
        return site, lib
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    if tag not in BINDINGS_SHA256:
        raise FetchError(f"no pinned tensorrt-rtx-cu13-bindings wheel for {tag} "
                         f"(pinned: {', '.join(BINDINGS_SHA256)}); run with one of those Pythons")
    what = f"tensorrt-rtx-cu13-libs/-bindings=={VERSION}"
    with download_folder("kl_tensorrt_rtx_") as tmp:
        pins = [f"tensorrt-rtx-cu13-libs=={VERSION} --hash=sha256:{LIBS_SHA256}",
                f"tensorrt-rtx-cu13-bindings=={VERSION} --hash=sha256:{BINDINGS_SHA256[tag]}"]
        wheels = pip_download(tmp, pins, what, "PyPI must be reachable", options=("--require-hashes",))
        install(dest, lambda staging: _fill(wheels, staging), what, DEST_HINT)
    return site, lib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=None)
    args = parser.parse_args()
    try:
        site, lib = fetch((args.dest or default_dest()).expanduser().absolute())
    except (KernelLensError, OSError, zipfile.BadZipFile) as exc:
        print(f"fetch_tensorrt_rtx: error: {exc}", file=sys.stderr)
        return 1
    print(f"TENSORRT_RTX_SITE={site}")
    print(f"TENSORRT_RTX_LIB={lib}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
