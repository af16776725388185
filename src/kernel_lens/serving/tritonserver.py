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

The server listens on 127.0.0.1 only, on ports the OS picks unless given; metrics are off; it
stays up when a model fails to load (``--exit-on-error=false``), so the failure can be read from
the repository index. :meth:`TritonServer.stop` ends the server's own process group.

Trust: the server counts as live only while the child started here runs and holds its ports
itself (the listening sockets are read from /proc): another local process answering
``/v2/health/live`` on the port is refused with :class:`ServerError`, never talked to. A
``work=`` folder must be a real, empty folder of the current user that no one else can write
(the stub imports from it: a planted ``.pth`` would run there). ``python -m`` stops the server's
process group and removes its work folder on SIGINT, SIGTERM and SIGHUP alike; a launcher
killed outright (SIGKILL, or a crash) leaves nothing either: a small reaper process, holding the
read end of a pipe only the launcher writes, sees the pipe close and ends the server's group and
removes its temporary work folder (:func:`start_reaper`).

    python -m kernel_lens.serving.tritonserver REPO [--http-port N] [--grpc-port N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import venv
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KernelLensError, OutputPathError, ServerError, ToolchainError
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


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS picks (held open together, so never the same one twice)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def check_port_free(port: int, option: str) -> None:
    """Refuse a given port that another process listens on, before anything starts."""
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ServerError(f"{option} {port!r} is not a TCP port; pass 1..65535, or leave it out "
                          f"for a free one")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a TIME_WAIT leftover is no owner
        try:
            s.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ServerError(f"port {port} on 127.0.0.1 is in use by another process ({exc.strerror}); "
                              f"pass another {option}, or leave it out for a free one") from None


# Local addresses (as /proc/net/tcp{,6} print them on x86-64) a connection to 127.0.0.1 reaches:
# 127.0.0.1, 0.0.0.0, ::, ::ffff:127.0.0.1, ::ffff:0.0.0.0.
_LOOPBACK = {"0100007F", "00000000", "0" * 32, "0000000000000000FFFF00000100007F",
             "0000000000000000FFFF000000000000"}
_LISTEN = "0A"


def listening_sockets(port: int) -> set[int]:
    """Inodes of the sockets listening on ``port`` where 127.0.0.1 reaches them."""
    found: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and address in _LOOPBACK:
                found.add(int(fields[9]))
    return found


def group_sockets(pgid: int) -> set[int]:
    """Inodes of the sockets open in the processes of process group ``pgid``."""
    found: set[int] = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) != pgid:  # state, ppid, pgrp after the command name
                continue
            for fd in os.scandir(Path(entry.path, "fd")):
                target = os.readlink(fd.path)
                if target.startswith("socket:["):
                    found.add(int(target[len("socket:["):-1]))
        except (OSError, ValueError, IndexError):
            continue  # a process that ended meanwhile
    return found


def prepare_work(work: str | Path | None) -> Path:
    """The server's work folder: a fresh temporary one, ``work`` created here, or an existing
    ``work`` that is a real, empty folder of the current user that no one else can write (the
    python-backend stub imports from it: a ``.pth`` planted there would run in the stub)."""
    if work is None:
        return Path(tempfile.mkdtemp(prefix="kl_tritonserver_"))
    work = Path(work).absolute()
    work.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(work, 0o700)
        return work
    except FileExistsError:
        pass
    fix = "pass work= with a new folder (it is created) or an empty one of yours, or leave it out"
    info = os.lstat(work)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        kind = "a link" if stat.S_ISLNK(info.st_mode) else "not a folder"
        raise OutputPathError(f"tritonserver work folder {work} is {kind}; {fix}")
    if info.st_uid != os.getuid():
        raise OutputPathError(f"tritonserver work folder {work} is owned by uid {info.st_uid}, not "
                              f"by you (uid {os.getuid()}); {fix}")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise OutputPathError(f"tritonserver work folder {work} is writable by others (mode "
                              f"{stat.S_IMODE(info.st_mode):o}); the stub imports from it; {fix}")
    with os.scandir(work) as entries:
        first = next(entries, None)
    if first is not None:
        raise OutputPathError(f"tritonserver work folder {work} is not empty (it holds {first.name!r}); "
                              f"the stub imports from it; {fix}")
    return work


# The reaper (run as ``python -I -S -c``): it waits for its stdin to close. "stopped" first means
# the launcher ended the server itself; a bare close means the launcher died: end the group
# (SIGTERM, then SIGKILL after 5 s) and remove the work folder unless it is the user's own.
_REAPER = """
import os, shutil, signal, sys, time
group, work, keep = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
told = sys.stdin.buffer.read()
if told != b"stopped":
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(group, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + wait
        while time.monotonic() < end:
            try:
                os.killpg(group, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
        else:
            continue
        break
    if not keep:
        shutil.rmtree(work, ignore_errors=True)
"""


def start_reaper(group: int, work: Path, keep: bool) -> subprocess.Popen:
    """A process that ends process group ``group`` and removes ``work`` (unless ``keep``) when
    this process dies without saying "stopped" on its stdin (:meth:`TritonServer.stop` does).
    It runs in a session of its own, so the signal that kills the launcher's group spares it."""
    return subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(group), str(work),
                             "1" if keep else "0"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def release_reaper(reaper: subprocess.Popen | None) -> None:
    """Tell the reaper the server was ended here, and let it go."""
    if reaper is None or reaper.stdin is None or reaper.stdin.closed:
        return
    try:
        reaper.stdin.write(b"stopped")
        reaper.stdin.close()
    except OSError:
        pass
    try:
        reaper.wait(5)
    except subprocess.TimeoutExpired:
        reaper.kill()


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
    _reaper: subprocess.Popen | None = field(default=None, repr=False)

    @classmethod
    def start(cls, repository: str | Path, *, install: TritonInstall | None = None,
              http_port: int | None = None, grpc_port: int | None = None,
              extra_args: list[str] = (), env: dict[str, str] | None = None,
              work: str | Path | None = None, wait: float = 60.0) -> "TritonServer":
        """Start the server and wait until the child holds its ports and ``/v2/health/live``
        answers 200 (at most ``wait`` s). Ports left out are picked by the OS; a given ``work``
        folder is checked (:func:`prepare_work`) and kept, a temporary one removed by :meth:`stop`."""
        repository = Path(repository).absolute()
        if not repository.is_dir():
            raise KernelLensError(f"model repository {repository} is not a folder; export a model "
                                  f"into it with kernel_lens export-triton DIR -o {repository}")
        install = install or find_install()
        for port, option in ((http_port, "--http-port"), (grpc_port, "--grpc-port")):
            if port is not None:
                check_port_free(port, option)
        if http_port is not None and http_port == grpc_port:
            raise ServerError(f"--http-port and --grpc-port are both {http_port}; pass two ports")
        keep = work is not None
        work = prepare_work(work)
        server = log_file = None
        try:
            backends = prepare_backends(install, work)
            bin_dir = stub_python(work)
            picked = iter(free_ports(2))
            http_port = http_port or next(p for p in picked if p != grpc_port)
            grpc_port = grpc_port or next(p for p in picked if p != http_port)
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
            server._reaper = start_reaper(process.pid, work, keep)
            server.wait_live(wait)
        except BaseException:  # a failed start, or a signal (python -m): nothing is left running
            if server is not None:
                server.stop()
            else:
                if log_file is not None:
                    log_file.close()
                if not keep:
                    shutil.rmtree(work, ignore_errors=True)
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

    def _log_tail(self, lines: int = 6) -> str:
        tail = [line.strip() for line in self.log().splitlines() if line.strip()][-lines:]
        return " | ".join(tail) or "(empty)"

    def _ports_held(self) -> bool:
        """True when the child's process group holds both ports, False while it has not bound
        them yet; :class:`ServerError` when another process listens on one of them."""
        held = True
        for port, what in ((self.http_port, "HTTP"), (self.grpc_port, "gRPC")):
            listening = listening_sockets(port)
            if not listening:
                held = False
                continue
            foreign = listening - group_sockets(self.process.pid)
            if foreign:
                raise ServerError(f"the {what} port {port} on 127.0.0.1 is held by another process, "
                                  f"not by the tritonserver started here (pid {self.process.pid}); "
                                  f"stop that process or pass another port (ports left out are picked "
                                  f"by the OS); the server's log ends: {self._log_tail()}")
        return held

    def is_live(self) -> bool:
        """The child started here runs, holds its ports, and answers ``/v2/health/live``."""
        if self.process.poll() is not None:
            return False
        try:
            if not self._ports_held():
                return False
        except ServerError:
            return False
        try:
            return self._request("GET", "/v2/health/live", timeout=2.0)[0] == 200
        except OSError:
            return False

    def wait_live(self, timeout: float = 60.0) -> None:
        """Wait until the child holds its ports and answers live; :class:`ServerError` when it
        exits first, another process holds a port, or ``timeout`` s pass."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise ServerError(f"tritonserver (pid {self.process.pid}) exited with status "
                                  f"{self.process.returncode} before it was live; its log ends: "
                                  f"{self._log_tail()}")
            if self._ports_held():
                try:
                    if self._request("GET", "/v2/health/live", timeout=2.0)[0] == 200:
                        return
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise ServerError(f"tritonserver (pid {self.process.pid}) was not live after "
                                  f"{timeout:.0f} s; pass a longer wait; its log ends: {self._log_tail()}")
            time.sleep(0.1)

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
        release_reaper(self._reaper)
        self._reaper = None

    def _signal(self, sig: int) -> None:
        try:
            os.killpg(self.process.pid, sig)  # the group start_new_session made: the server's pid
        except ProcessLookupError:
            pass

    def __enter__(self) -> "TritonServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _stop_handler(signum: int, frame) -> None:
    """The first SIGINT/SIGTERM/SIGHUP stops the launcher as Ctrl-C does (its ``finally`` ends the
    server's process group and removes the work folder); later ones are ignored so that the
    cleanup itself is not cut short."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kernel_lens.serving.tritonserver",
                                     description="Run nvidia-pytriton's tritonserver on a model repository "
                                                 "(127.0.0.1 only) until interrupted (SIGINT, SIGTERM, SIGHUP).")
    parser.add_argument("repository")
    parser.add_argument("--http-port", type=int, default=None, help="default: a free port the OS picks")
    parser.add_argument("--grpc-port", type=int, default=None, help="default: a free port the OS picks")
    parser.add_argument("--root", default=None, help="unpacked nvidia-pytriton (default: the fetch cache)")
    args, extra = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _stop_handler) for sig in STOP_SIGNALS}
    server = None
    try:
        server = TritonServer.start(args.repository, install=find_install(args.root),
                                    http_port=args.http_port, grpc_port=args.grpc_port, extra_args=extra)
        print(f"tritonserver live: HTTP {server.url}, gRPC {server.grpc_url}; log {server.log_path}; "
              f"Ctrl-C (or SIGTERM) stops it", flush=True)
        for entry in server.wait_models([e["name"] for e in server.index()]).values():
            print(f"  {entry['name']} {entry.get('version', '')}: {entry['state']} {entry.get('reason', '')}")
        server.process.wait()
    except KernelLensError as exc:
        print(f"kernel_lens: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        pass
    finally:
        if server is not None:
            server.stop()
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    return 0


if __name__ == "__main__":
    sys.exit(main())
