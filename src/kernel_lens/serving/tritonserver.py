"""Run NVIDIA's ``tritonserver`` (from PyPI's nvidia-pytriton wheel) on a model repository,
without a container: what the tests, the GPU benchmark and users share.

The wheel's server needs three things around it (docs/serving.md):
- ``LD_LIBRARY_PATH`` with the wheel's ``nvidia_pytriton.libs`` (libtritonserver, CUDA runtime);
- a backends folder whose ``python/`` holds the python-backend stub built for the Python that
  runs the models (``python_backend_stubs/<X.Y>/triton_python_backend_stub``): the wheel's own
  backends folder is copied into a private work folder and the stub added there, never into
  the install;
- for the stub to see this Python's packages, that Python's ``bin/`` first on ``PATH`` (the stub
  ignores ``PYTHONPATH``): a small venv is made in the work folder (system site-packages on, and
  a ``.pth`` naming this process's site-packages and ``PYTHONPATH`` folders), so the stub imports
  what this process imports, whether it runs in a venv or not.

The server listens on 127.0.0.1 only, on free ports unless given; metrics are off; it stays up
when a model fails to load (``--exit-on-error=false``), so the failure can be read from the
repository index. :meth:`TritonServer.stop` ends the server's own process group.

    python -m kernel_lens.serving.tritonserver REPO [--http-port 8000] [--grpc-port 8001]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
import venv
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KernelLensError, ToolchainError
from .fetch import BINARY, default_dest

log = logging.getLogger(__name__)

FETCH_HINT = ("fetch it with `python -m kernel_lens.serving.fetch` (PyPI nvidia-pytriton==0.7.0, "
              "unpacked into ~/.cache/kernel_lens/tritonserver) or set KERNEL_LENS_TRITONSERVER to "
              "a folder holding pytriton/tritonserver/ and nvidia_pytriton.libs/")


@dataclass(frozen=True)
class TritonInstall:
    """An unpacked nvidia-pytriton wheel: ``root/pytriton/tritonserver`` + ``root/nvidia_pytriton.libs``."""

    root: Path

    @property
    def binary(self) -> Path:
        return self.root / BINARY

    @property
    def backends(self) -> Path:
        return self.root / "pytriton" / "tritonserver" / "backends"

    @property
    def libs(self) -> Path:
        return self.root / "nvidia_pytriton.libs"

    def stub(self, python_version: str) -> Path:
        stubs = self.root / "pytriton" / "tritonserver" / "python_backend_stubs"
        stub = stubs / python_version / "triton_python_backend_stub"
        if not stub.is_file():
            have = sorted(p.name for p in stubs.iterdir()) if stubs.is_dir() else []
            raise ToolchainError(f"{self.root} has no python-backend stub for Python {python_version} "
                                 f"(it has {', '.join(have) or 'none'}); run the server from one of "
                                 f"those Pythons")
        return stub


def find_install(root: str | Path | None = None) -> TritonInstall:
    """``root``, else $KERNEL_LENS_TRITONSERVER / the fetch cache, else a pip-installed pytriton."""
    candidates = [Path(root)] if root is not None else [default_dest()]
    if root is None:
        import importlib.util

        spec = importlib.util.find_spec("pytriton")
        if spec is not None and spec.submodule_search_locations:
            candidates.append(Path(list(spec.submodule_search_locations)[0]).parent)
    for folder in candidates:
        if (folder / BINARY).is_file():
            return TritonInstall(folder.absolute())
    raise ToolchainError(f"no tritonserver found (looked in {', '.join(map(str, candidates))}); {FETCH_HINT}")


def prepare_backends(install: TritonInstall, work: Path, python_version: str | None = None) -> Path:
    """A copy of the install's backends folder in ``work`` with the stub for ``python_version``
    (default: this Python's X.Y) in ``python/``."""
    python_version = python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = install.stub(python_version)
    backends = work / "backends"
    shutil.copytree(install.backends, backends)
    shutil.copy2(stub, backends / "python" / stub.name)
    return backends


def _site_folders() -> list[str]:
    """This process's package folders: PYTHONPATH entries and site-packages on sys.path."""
    stdlib = {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")}
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    extra += [p for p in sys.path if p.endswith(("site-packages", "dist-packages"))]
    seen: list[str] = []
    for p in extra:
        p = os.path.abspath(p)
        if os.path.isdir(p) and p not in stdlib and p not in seen:
            seen.append(p)
    return seen


def stub_python(work: Path) -> Path:
    """The ``bin/`` folder of a venv over this Python whose packages are this process's; put it
    first on the server's PATH so the python-backend stub imports what this process imports."""
    env = work / "python"
    venv.EnvBuilder(system_site_packages=True, symlinks=True, with_pip=False).create(env)
    purelib = env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    purelib.mkdir(parents=True, exist_ok=True)  # venv's own layout (a distro's sysconfig may differ)
    (purelib / "kernel_lens_site.pth").write_text("".join(f"{p}\n" for p in _site_folders()))
    return env / "bin"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class TritonServer:
    """A running ``tritonserver`` on ``repository`` (use :meth:`start`, or as a context manager)."""

    repository: Path
    http_port: int
    grpc_port: int
    work: Path
    process: subprocess.Popen
    log_path: Path
    keep_work: bool = False
    _log_file: object = field(default=None, repr=False)

    @classmethod
    def start(cls, repository: str | Path, *, install: TritonInstall | None = None,
              http_port: int | None = None, grpc_port: int | None = None,
              extra_args: list[str] = (), env: dict[str, str] | None = None,
              work: str | Path | None = None, wait: float = 60.0) -> "TritonServer":
        """Start the server and wait until ``/v2/health/live`` answers 200 (at most ``wait`` s)."""
        repository = Path(repository).absolute()
        if not repository.is_dir():
            raise KernelLensError(f"model repository {repository} is not a folder; export a model "
                                  f"into it with kernel_lens export-triton DIR -o {repository}")
        install = install or find_install()
        keep = work is not None
        work = Path(work) if work is not None else Path(tempfile.mkdtemp(prefix="kl_tritonserver_"))
        work.mkdir(parents=True, exist_ok=True)
        backends = prepare_backends(install, work)
        bin_dir = stub_python(work)
        http_port, grpc_port = http_port or free_port(), grpc_port or free_port()
        cmd = [str(install.binary), f"--model-repository={repository}", f"--backend-directory={backends}",
               "--http-address=127.0.0.1", f"--http-port={http_port}",
               "--grpc-address=127.0.0.1", f"--grpc-port={grpc_port}",
               "--allow-metrics=false", "--exit-on-error=false", "--exit-timeout-secs=5", *extra_args]
        base = dict(os.environ if env is None else env)
        base["PATH"] = os.pathsep.join([str(bin_dir), base.get("PATH", os.defpath)])
        base["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(install.libs), base.get("LD_LIBRARY_PATH")) if p)
        log_path = work / "tritonserver.log"
        log_file = open(log_path, "wb")
        log.info("starting %s", " ".join(cmd))
        process = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, env=base,
                                   cwd=work, start_new_session=True)
        server = cls(repository, http_port, grpc_port, work, process, log_path, keep, log_file)
        try:
            server.wait_live(wait)
        except BaseException:
            server.stop()
            raise
        return server

    # --- endpoints ---------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def _request(self, method: str, path: str, body: dict | None = None, timeout: float = 10.0):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(f"http://{self.url}{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"} if data else {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def is_live(self) -> bool:
        try:
            return self._request("GET", "/v2/health/live", timeout=2.0)[0] == 200
        except OSError:
            return False

    def wait_live(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KernelLensError(f"tritonserver exited with status {self.process.returncode} "
                                      f"before it was live; its log:\n{self.log()[-4000:]}")
            if self.is_live():
                return
            time.sleep(0.25)
        raise KernelLensError(f"tritonserver was not live after {timeout:.0f} s; its log:\n{self.log()[-4000:]}")

    def metadata(self) -> dict:
        """The server's metadata (``GET /v2``: name, version, extensions)."""
        status, body = self._request("GET", "/v2")
        if status != 200:
            raise KernelLensError(f"tritonserver's metadata answered {status}: {body[:500]!r}")
        return json.loads(body)

    def index(self) -> list[dict]:
        """The repository index: one entry per model version (name, version, state, reason)."""
        status, body = self._request("POST", "/v2/repository/index", {})
        if status != 200:
            raise KernelLensError(f"tritonserver's repository index answered {status}: {body[:500]!r}")
        return json.loads(body)

    def wait_models(self, names: list[str], timeout: float = 60.0) -> dict[str, dict]:
        """Wait until every model in ``names`` is READY or UNAVAILABLE (failed); their index entries."""
        deadline = time.monotonic() + timeout
        while True:
            entries = {e["name"]: e for e in self.index() if e.get("name") in names}
            if len(entries) == len(names) and all(e.get("state") in ("READY", "UNAVAILABLE")
                                                  for e in entries.values()):
                return entries
            if time.monotonic() > deadline:
                raise KernelLensError(f"models {names} not settled after {timeout:.0f} s: {entries}; "
                                      f"log:\n{self.log()[-4000:]}")
            time.sleep(0.25)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.is_file() else ""

    # --- lifetime ----------------------------------------------------------------------------
    def stop(self, timeout: float = 15.0) -> None:
        """End the server and its stubs (its own process group: SIGTERM, then SIGKILL)."""
        if self.process.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.process.wait(timeout)
        self._signal(signal.SIGKILL)  # stubs that outlived the server
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if not self.keep_work:
            shutil.rmtree(self.work, ignore_errors=True)

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)  # the group start_new_session made: the server's pid
        except ProcessLookupError:
            pass

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_lens.serving.tritonserver",
                                     description="Run nvidia-pytriton's tritonserver on a model repository "
                                                 "(127.0.0.1 only) until interrupted.")
    parser.add_argument("repository")
    parser.add_argument("--http-port", type=int, default=8000)
    parser.add_argument("--grpc-port", type=int, default=8001)
    parser.add_argument("--root", default=None, help="unpacked nvidia-pytriton (default: the fetch cache)")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        server = TritonServer.start(args.repository, install=find_install(args.root),
                                    http_port=args.http_port, grpc_port=args.grpc_port, extra_args=extra)
    except KernelLensError as exc:
        print(f"kernel_lens: error: {exc}", file=sys.stderr)
        return 2
    print(f"tritonserver live: HTTP {server.url}, gRPC {server.grpc_url}; log {server.log_path}; "
          f"Ctrl-C stops it", flush=True)
    try:
        for entry in server.wait_models([e["name"] for e in server.index()]).values():
            print(f"  {entry['name']} {entry.get('version', '')}: {entry['state']} {entry.get('reason', '')}")
        server.process.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
