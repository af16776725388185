"""Run a tool (the C++ compiler, ptxas) so that it never outlives kernel_lens.

The tool runs in a process group of its own, all of which is killed when kernel_lens stops waiting
for any reason (Ctrl-C, SIGTERM in the CLI, an error, a timeout): a compiler driver's children
(nvcc's cicc and ptxas, g++'s cc1plus) are not left running. On Linux the tool also gets a
parent-death signal, so a SIGKILL of kernel_lens, which runs no cleanup, still ends the group.

The group's leader is a small wrapper (:data:`_DIE_WITH_PARENT`, run by this Python with
``-I -S``) that sets ``prctl(PR_SET_PDEATHSIG)`` and runs the tool: not ``preexec_fn``, which runs
Python in a forked copy of a process with threads (torch's, the progress timers), which can
deadlock, forces a full fork of a large process, and could only reach the driver, not its
children.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

#: Runs the tool and waits for it, its parent-death signal set to SIGTERM, on which it kills its
#: whole group (the tool and the tool's children) with SIGKILL. Ends the group at once if
#: kernel_lens died before the signal was set. Exits with the tool's status (128 + N for a tool
#: killed by signal N, as a shell does); a spawn failure is one line that :func:`run_group` turns
#: back into the OSError Popen would have raised.
_DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
signal.signal(signal.SIGTERM, lambda *_: os.killpg(0, signal.SIGKILL))
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
if os.getppid() != parent:
    os.killpg(0, signal.SIGKILL)
try:  # the signals Python ignores or handles get their defaults back in the tool
    pid = os.posix_spawnp(argv[0], argv, os.environ,
                          setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, signal.SIGTERM))
except OSError as exc:
    sys.stderr.write(f"kernel_lens exec failed: errno {exc.errno}\\n")
    os._exit(127)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
os._exit(code if code >= 0 else 128 - code)
"""
_EXEC_FAILED = re.compile(r"kernel_lens exec failed: errno (\d+)\n")


def _wrapped(cmd: list[str]) -> list[str]:
    """``cmd`` behind the parent-death wrapper where the OS has one (Linux) and Python can be run."""
    if not sys.platform.startswith("linux") or not sys.executable:
        return cmd
    return [sys.executable, "-I", "-S", "-c", _DIE_WITH_PARENT, str(os.getpid()), *cmd]


def run_group(cmd: list[str], *, timeout: float | None = None, **kwargs) -> subprocess.CompletedProcess:
    """``subprocess.run`` (output captured as text) in a process group of its own that dies with
    this process; the whole group is killed when this process stops waiting for any reason
    (``subprocess.TimeoutExpired`` after ``timeout`` seconds among them)."""
    with subprocess.Popen(_wrapped(cmd), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kwargs) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except BaseException:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            raise
    failed = _EXEC_FAILED.fullmatch(err or "") if proc.returncode == 127 else None
    if failed:
        code = int(failed.group(1))
        raise OSError(code, os.strerror(code) if code else "exec failed", cmd[0])
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

