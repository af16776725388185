"""Issue 42, item 6: no orphans. SIGTERM to a compile ends the C++ compiler it started (exit 143,
one line), and so does SIGKILL of kernel_lens (a parent-death signal); ptxas the same.

The compiler and ptxas are stand-ins: shell scripts that start a child (as g++ starts cc1plus),
write both pids to a file and wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_lens.toolchain.process_group import run_group

from conftest import EXAMPLES

TOY = str(EXAMPLES / "toy_two_kernels.py")

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"),
                                reason="the parent-death signal is Linux's (prctl)")


def _sleeper(path: Path, started: Path) -> Path:
    """A tool that answers ``--version`` and otherwise starts a child (as g++ starts cc1plus),
    writes both pids to ``started`` and waits."""
    path.write_text("#!/bin/sh\n"
                    'if [ "$1" = "--version" ]; then echo "stand-in 1.0"; exit 0; fi\n'
                    "sleep 120 &\n"
                    f"echo $$ $! > {started}.tmp && mv {started}.tmp {started}\n"
                    "wait\n")
    path.chmod(0o755)
    return path


def _pids_once_started(started: Path, proc: subprocess.Popen) -> list[int]:
    """The pids of the tool and its child, once the tool runs under ``proc``."""
    deadline = time.monotonic() + 180
    while not started.exists():
        assert proc.poll() is None, f"kernel_lens ended first:\n{proc.communicate()[1]}"
        assert time.monotonic() < deadline, "the stand-in tool never started"
        time.sleep(0.05)
    return [int(pid) for pid in started.read_text().split()]


def _running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone_within(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_running(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def stand_in(tmp_path):
    """(tool, started): the stand-in and the file it writes its pids to; what still runs after the
    test is killed."""
    started = tmp_path / "tool_started"
    tool = _sleeper(tmp_path / "tool", started)
    yield tool, started
    for pid in started.read_text().split() if started.exists() else ():
        if _running(int(pid)):
            os.kill(int(pid), signal.SIGKILL)


def _compile(tool: Path, out: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kernel_lens.cli", "-q", "compile", TOY, "--target",
                             "ort", "-o", str(out)], env={**os.environ, "KERNEL_LENS_CXX": str(tool)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_during_the_build_ends_the_compiler_in_one_line_with_exit_143(stand_in, tmp_path):
    tool, started = stand_in
    proc = _compile(tool, tmp_path / "out")
    compiler = _pids_once_started(started, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    assert err.splitlines() == ["kernel_lens: terminated (SIGTERM)"]
    assert _gone_within(compiler, 5), "the C++ compiler or its child outlived kernel_lens"


def test_sigkill_of_kernel_lens_ends_the_compiler(stand_in, tmp_path):
    tool, started = stand_in
    proc = _compile(tool, tmp_path / "out")
    compiler = _pids_once_started(started, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone_within(compiler, 5), "the C++ compiler or its child outlived kernel_lens"


def test_sigkill_while_ptxas_proves_a_lowered_ptx_ends_ptxas(stand_in):
    tool, started = stand_in
    code = ("from kernel_lens.toolchain.ptx_isa import clamp_ptx_version\n"
            "ptx = '.version 8.7\\n.target sm_90\\n.address_size 64\\n'\n"
            f"clamp_ptx_version(ptx, (8, 0), ptxas={str(tool)!r})\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
    ptxas = _pids_once_started(started, proc)
    proc.kill()
    proc.communicate(timeout=60)
    assert _gone_within(ptxas, 5), "ptxas or its child outlived kernel_lens"


def test_a_tool_that_cannot_be_run_is_the_oserror_popen_gives(tmp_path):
    with pytest.raises(FileNotFoundError, match="no-such-tool"):
        run_group([str(tmp_path / "no-such-tool")])
    text = tmp_path / "not-executable"
    text.write_text("")
    with pytest.raises(PermissionError):
        run_group([str(text)])
