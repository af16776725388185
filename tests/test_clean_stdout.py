"""Issue 42, item 9: machine-readable output stays clean. What a model file (or a library it
imports, or C code) writes to stdout while it is imported and run goes to stderr: stdout carries
only the JSON of ``dump-ir --json`` and the artifact lines of ``compile``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from conftest import EXAMPLES

#: The toy model, printing at import and in forward: print(), os.write(1, ...) and C's printf
#: (buffered by C stdio, so written out only when flushed).
NOISY = f"""\
import ctypes, os, sys
sys.path.insert(0, {str(EXAMPLES)!r})
import toy_two_kernels as toy
from toy_two_kernels import dynamic_shapes, example_inputs

print("print at import")
os.write(1, b"fd 1 at import\\n")
ctypes.CDLL(None).printf(b"printf at import\\n")


class Noisy(toy.ToyModel):
    def forward(self, x, y):
        print("print in forward")
        os.write(1, b"fd 1 in forward\\n")
        return super().forward(x, y)


model = Noisy()
"""
PRINTED = ("print at import", "fd 1 at import", "printf at import", "print in forward",
           "fd 1 in forward")


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    path = tmp_path_factory.mktemp("noisy") / "noisy_model.py"
    path.write_text(NOISY)
    return path


def _kl(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # C stdio buffers too
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", *args], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.parametrize("after", [[], ["--after", "none"]], ids=["pipeline", "after-none"])
def test_dump_ir_json_is_all_of_stdout_when_the_model_prints(noisy, after):
    proc = _kl("dump-ir", str(noisy), "--json", *after)
    ir = json.loads(proc.stdout)
    assert [launch["kernel"] for launch in ir["launches"]] == ["add_kernel", "scale_relu_kernel"]
    for text in PRINTED:
        assert text in proc.stderr, text


def test_compile_prints_only_artifact_lines_when_the_model_prints(noisy, tmp_path):
    proc = _kl("compile", str(noisy), "-o", str(tmp_path / "out"))
    lines = proc.stdout.splitlines()
    assert lines and all(re.fullmatch(r"[\w.]+: /\S+", line) for line in lines), proc.stdout
    for text in PRINTED:
        assert text in proc.stderr, text
