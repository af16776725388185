"""Fetch the third-party C/C++ headers kernel_lens builds plugins against, into a local cache.

kernel_lens never vendors third-party headers and never downloads anything at compile time:
``kernel_lens fetch-headers`` is the one explicit step that gets them, from package registries,
and caches them.

  DEST/onnxruntime/  ONNX Runtime 1.29 C/C++ API headers (ORT_API_VERSION 29, MIT) + LICENSE,
                     from the npm package com.github.asus4.onnxruntime@0.4.9
                     (package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers/*.h)
  DEST/tensorrt/     TensorRT 10.14.1 headers (Apache-2.0), from the PyPI wheel kernel-lens==2.0.1
                     (kernel_lens/include/tensorrt/*.h; its NvInferPlugin.h is a stub, no NvOnnxParser.h)

DEST defaults to $KERNEL_LENS_HEADERS, else ~/.cache/kernel_lens/headers, which is where
kernel_lens looks for them. A part whose marker header already exists is skipped, so rerunning is
cheap. The downloaded archives are checked against pinned sha256 digests (registry versions are
immutable). Downloading, unpacking into a temporary folder next to the part's final place and
swapping it into place (so an interrupted run leaves no half folder), and the checks that DEST and
each part are folders of this user's own, are :mod:`kernel_lens.toolchain.fetch`'s; this module
says what each part downloads and which members it keeps.

Usage: kernel_lens fetch-headers [--ort] [--trt] [--dest DIR] [--no-verify]   (no part: both)
       python scripts/fetch_headers.py [DEST] [same options]   (from a source checkout)

Standard library only (this module and what it imports: kernel_lens/__init__, errors, fileio,
toolchain/fetch, toolchain/headers), so scripts/fetch_headers.py can run it before kernel_lens is
installed.
"""

from __future__ import annotations

import argparse
import os
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from kernel_lens.errors import KernelLensError
from kernel_lens.toolchain.fetch import (FetchError, check_destination, check_sha256, download_folder,
                                         install, npm_pack, pip_download, unpack)
from kernel_lens.toolchain.headers import ort_api_version, tensorrt_version

ORT_NPM_SPEC = "com.github.asus4.onnxruntime@0.4.9"
ORT_NPM_SHA256 = "e59788788818fdde1b2e522e766a21ba0f7d8391de55737abf81e32cc801785d"
ORT_HEADERS_PREFIX = "package/Plugins/iOS~/onnxruntime.xcframework/ios-arm64/onnxruntime.framework/Headers/"
ORT_LICENSE_MEMBER = "package/LICENSE"
ORT_MARKER = "onnxruntime_c_api.h"
ORT_EXPECTED_API_VERSION = 29

TRT_PYPI_SPEC = "kernel-lens==2.0.1"
TRT_WHEEL_SHA256 = "07cc714e8b5e7f34b672f7c7fad93febe7c747be5837ba276b1527370134ffe0"
TRT_HEADERS_PREFIX = "kernel_lens/include/tensorrt/"
TRT_MARKER = "NvInfer.h"
TRT_EXPECTED_VERSION = "10.14.1"

DEST_HINT = "pass --dest, or set KERNEL_LENS_HEADERS, to a folder of your own"

Log = Callable[[str], None]

__all__ = ["FetchError", "add_arguments", "default_dest", "fetch_onnxruntime", "fetch_tensorrt",
           "main", "run"]


def default_dest() -> Path:
    """$KERNEL_LENS_HEADERS, else ~/.cache/kernel_lens/headers (as headers.headers_cache_dir())."""
    env = os.environ.get("KERNEL_LENS_HEADERS")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "kernel_lens" / "headers"


def _stderr_log(prefix: str) -> Log:
    def log(msg: str) -> None:
        print(f"{prefix}: {msg}", file=sys.stderr, flush=True)
    return log


_default_log = _stderr_log("fetch_headers")


# --- what each part downloads and keeps (the helper in toolchain/fetch.py does the rest) ---

def _top_level_header(prefix: str, name: str) -> str | None:
    """``X.h`` for the member ``prefix + X.h`` (headers of that folder only, not below it)."""
    if not name.startswith(prefix):
        return None
    rest = name[len(prefix):]
    return rest if "/" not in rest and rest.endswith(".h") else None


def _ort_member(name: str) -> str | None:
    return "LICENSE" if name == ORT_LICENSE_MEMBER else _top_level_header(ORT_HEADERS_PREFIX, name)


def _trt_member(name: str) -> str | None:
    return _top_level_header(TRT_HEADERS_PREFIX, name)


def fetch_onnxruntime(dest: Path, verify: bool = True, log: Log = _default_log) -> Path:
    final = dest / "onnxruntime"
    if check_destination(final, DEST_HINT) and (final / ORT_MARKER).is_file():
        log(f"ONNX Runtime headers already in {final}")
        return final
    log(f"npm pack {ORT_NPM_SPEC} (about 150 MB) ...")
    written: list[str] = []

    def fill(staging: Path) -> None:
        written.extend(unpack(tgz, staging, _ort_member))
        if ORT_MARKER not in written or "LICENSE" not in written:
            raise FetchError(f"{ORT_NPM_SPEC}: {ORT_HEADERS_PREFIX}{ORT_MARKER} or {ORT_LICENSE_MEMBER} "
                             "missing from the package")

    with download_folder("kl_ort_") as tmp:
        tgz = npm_pack(tmp, ORT_NPM_SPEC,
                       "Install Node.js/npm and check that the npm registry is reachable, or set "
                       "ORT_INCLUDE_DIR to an existing ONNX Runtime include folder.")
        check_sha256(tgz, ORT_NPM_SHA256, verify, what="headers")
        install(final, fill, ORT_NPM_SPEC, DEST_HINT)
    log(f"installed {len(written) - 1} ONNX Runtime headers + LICENSE into {final}")
    return final


def fetch_tensorrt(dest: Path, verify: bool = True, log: Log = _default_log) -> Path:
    final = dest / "tensorrt"
    if check_destination(final, DEST_HINT) and (final / TRT_MARKER).is_file():
        log(f"TensorRT headers already in {final}")
        return final
    log(f"pip download {TRT_PYPI_SPEC} ...")
    written: list[str] = []

    def fill(staging: Path) -> None:
        written.extend(unpack(wheels[0], staging, _trt_member))
        if TRT_MARKER not in written:
            raise FetchError(f"{TRT_PYPI_SPEC}: {TRT_HEADERS_PREFIX}{TRT_MARKER} missing from the wheel")

    with download_folder("kl_trt_") as tmp:
        wheels = pip_download(tmp, [TRT_PYPI_SPEC], TRT_PYPI_SPEC,
                              "Check that pip works and PyPI is reachable, or set TENSORRT_INCLUDE_DIR "
                              "to an existing TensorRT include folder.")
        if len(wheels) != 1:
            raise FetchError(f"pip download {TRT_PYPI_SPEC} produced {len(wheels)} wheels in "
                             f"{wheels[0].parent}, expected 1")
        check_sha256(wheels[0], TRT_WHEEL_SHA256, verify, what="headers")
        install(final, fill, TRT_PYPI_SPEC, DEST_HINT)
    log(f"installed {len(written)} TensorRT headers into {final}")
    return final


PARTS: dict[str, Callable[..., Path]] = {"onnxruntime": fetch_onnxruntime, "tensorrt": fetch_tensorrt}


# --- command line ---

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``kernel_lens fetch-headers`` (also used by scripts/fetch_headers.py)."""
    parser.add_argument("--ort", action="store_true",
                        help="fetch the ONNX Runtime headers (with neither --ort nor --trt: both)")
    parser.add_argument("--trt", action="store_true",
                        help="fetch the TensorRT headers (with neither --ort nor --trt: both)")
    parser.add_argument("--dest", type=Path, default=None, metavar="DIR",
                        help="cache folder (default: $KERNEL_LENS_HEADERS or ~/.cache/kernel_lens/headers, "
                             "where kernel_lens looks for them)")
    parser.add_argument("--no-verify", action="store_true",
                        help="do not check the downloaded archives against the pinned sha256 digests")


def run(args: argparse.Namespace, prog: str = "fetch_headers", error_status: int = 1,
        log_prefix: str | None = None) -> int:
    """Fetch what ``args`` (from :func:`add_arguments`) asks for; print each part's include folder
    (``ORT_INCLUDE_DIR=...``, ``TENSORRT_INCLUDE_DIR=...``) on stdout, progress and errors on
    stderr. A part that fails does not stop the other; then the status is ``error_status``."""
    log = _stderr_log(log_prefix or prog)
    dest = (Path(args.dest).expanduser() if args.dest else default_dest()).absolute()
    wanted = [p for p, on in (("onnxruntime", args.ort), ("tensorrt", args.trt)) if on] or list(PARTS)
    results, failed = {}, False
    for part in wanted:
        try:
            results[part] = PARTS[part](dest, verify=not args.no_verify, log=log)
        except (KernelLensError, OSError, tarfile.TarError, zipfile.BadZipFile) as exc:
            print(f"{prog}: error: {exc}", file=sys.stderr, flush=True)
            failed = True
    if failed:
        return error_status
    if "onnxruntime" in results:
        ort = results["onnxruntime"]
        api = ort_api_version(ort)
        print(f"ORT_INCLUDE_DIR={ort}  (ORT_API_VERSION {api})")
        if api != ORT_EXPECTED_API_VERSION:
            log(f"warning: expected ORT_API_VERSION {ORT_EXPECTED_API_VERSION}, found {api} in {ort}")
    if "tensorrt" in results:
        trt = results["tensorrt"]
        trt_version = tensorrt_version(trt)
        print(f"TENSORRT_INCLUDE_DIR={trt}  (TensorRT {trt_version})")
        if trt_version != TRT_EXPECTED_VERSION:
            log(f"warning: expected TensorRT {TRT_EXPECTED_VERSION}, found {trt_version} in {trt}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python scripts/fetch_headers.py [DEST] [--ort] [--trt] [--dest DIR] [--no-verify]``."""
    parser = argparse.ArgumentParser(prog="fetch_headers.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("positional_dest", nargs="?", type=Path, default=None, metavar="DEST",
                        help="cache folder (same as --dest)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.positional_dest is not None:
        if args.dest is not None and args.dest != args.positional_dest:
            parser.error("give the cache folder once: DEST or --dest")
        args.dest = args.positional_dest
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
