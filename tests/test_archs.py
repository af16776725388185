"""Several GPU architectures in one artifact set (issue 27, item 5): parsing ``--arch``, which
built arch a device runs, the IR's rule that every kernel is built for the same archs, and the
one-line refusal at load of a GPU none of them runs on. (The generated launch code's choice is
run through the fake driver in test_launch_sweep.py.)"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import kernel_lens as kl
from kernel_lens.archs import check_archs, check_device, parse_archs, pick_arch
from kernel_lens.errors import ArchError, IRError
from kernel_lens.ir import GraphIR

from conftest import EXAMPLES, model_ir
from test_loading_folders import cuda_ep, folder, toy_ir  # noqa: F401 (fixtures)


def test_arch_lists_parse_in_order_without_repeats():
    assert parse_archs("sm_80,sm_90") == (80, 90)
    assert parse_archs("sm_90, 80 ,sm_90a") == (90, 80)
    assert check_archs(90) == (90,) and check_archs([80, 90, 80]) == (80, 90)
    assert check_archs((a for a in (86,))) == (86,)


@pytest.mark.parametrize("text, culprit", [("", "names no architecture"), (",", "names no architecture"),
                                           ("sm_80,bogus", "'bogus' is not an architecture"),
                                           ("sm_80,sm_91", "arch 91 is not")])
def test_bad_arch_lists_name_the_culprit(text, culprit):
    with pytest.raises(ArchError, match=culprit):
        parse_archs(text)


@pytest.mark.parametrize("arch", [[], [80, "90"], [80, True]])
def test_bad_arch_lists_are_refused_by_the_api(arch):
    with pytest.raises(ArchError):
        check_archs(arch)


@pytest.mark.parametrize("built, cc, picked", [
    ([(80, False), (90, True)], 90, 90),     # its own cubin
    ([(80, False), (90, True)], 86, 80),     # newest portable PTX below it
    ([(80, False), (90, True)], 100, 80),    # sm_90a PTX runs on sm_90 only
    ([(80, False), (90, False)], 100, 90),
    ([(80, False), (90, True)], 75, None),   # older than every build
    ([(90, True)], 100, None),
    ([(80, False), (86, False), (90, True)], 89, 86),  # the newest portable one not above it
    ([(86, False), (80, False), (90, True)], 89, 86),  # whatever order they are listed in
    ([(80, False), (86, False), (90, True)], 85, 80),
])
def test_which_built_arch_a_device_runs(built, cc, picked):
    assert pick_arch(built, cc) == picked


def test_a_device_none_runs_on_is_one_line_with_the_fix():
    with pytest.raises(ArchError) as err:
        check_device([(80, False), (90, True)], 75, "model Toy")
    text = str(err.value)
    assert "\n" not in text
    assert "model Toy was built for sm_80, sm_90; this GPU is sm_75" in text
    assert "--arch sm_75" in text and "--arch sm_80,sm_90,sm_75" in text


def test_every_kernel_is_built_for_the_same_archs(toy_ir):
    doc = json.loads(toy_ir.to_json())
    first, second = list(doc["kernels"])[:2]
    for kid in (first, second):  # both kernels gain sm_80 binaries: valid
        doc["kernels"][kid]["binaries"] += [dict(b, arch=80) for b in doc["kernels"][kid]["binaries"]]
    assert GraphIR.from_json(json.dumps(doc)).built_archs()[0] == (80, False)
    doc["kernels"][second]["binaries"] = [b for b in doc["kernels"][second]["binaries"]
                                          if b["arch"] == 90]
    with pytest.raises(IRError, match=f"kernel '{second}' has binaries for sm_90 but kernel "
                                      f"'{first}' for sm_80, sm_90"):
        GraphIR.from_json(json.dumps(doc))
    for kid in (first, second):
        doc["kernels"][kid]["binaries"] = [dict(b, arch=80) for b in doc["kernels"][kid]["binaries"]]
    with pytest.raises(IRError, match="arch is sm_90 but kernel .* has binaries for sm_80 only"):
        GraphIR.from_json(json.dumps(doc))


@pytest.mark.parametrize("cc, refused", [((7, 5), True), ((10, 0), True), ((9, 0), False)])
def test_load_refuses_a_gpu_the_folder_has_no_binary_for(folder, monkeypatch, cc, refused):
    # the toy is built for sm_90 only; Triton's sm_90 PTX targets sm_90a (no JIT to sm_100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: cc)
    if not refused:
        assert kl.load(folder).ir.arch == 90
        return
    with pytest.raises(ArchError, match=f"built for sm_90; this GPU is sm_{cc[0]}{cc[1]}, which "
                                        f"none of them runs on"):
        kl.load(folder)


def test_cli_builds_for_several_archs_and_says_so():
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "dump-ir", "--arch", "sm_80,sm_90",
                           str(EXAMPLES / "toy_two_kernels.py")], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "(sm_80, sm_90, IR schema" in proc.stdout
    assert "binary sm_80 specialized" in proc.stdout and "binary sm_90 generic" in proc.stdout
    bad = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "dump-ir", "--arch", "sm_80,sm_9x",
                          str(EXAMPLES / "toy_two_kernels.py")], capture_output=True, text=True,
                         timeout=600)
    assert bad.returncode == 2 and "'sm_9x' is not an architecture" in bad.stderr


def test_the_ort_runner_refuses_a_gpu_without_a_binary_before_opening_a_session(folder, monkeypatch, cuda_ep):
    from kernel_lens.runtime.ort import OrtModel

    model = kl.load(folder)
    runner = OrtModel(model.ir, model.artifacts["ort.onnx"], model.artifacts["ort.library"])
    opened = []
    monkeypatch.setattr(runner._ort, "InferenceSession", lambda *a, **k: opened.append(a))
    monkeypatch.setattr(runner._ort.SessionOptions, "register_custom_ops_library", lambda self, path: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index=None: (8, 0))
    with pytest.raises(ArchError, match="built for sm_90; this GPU is sm_80"):
        runner.session(0, 0)
    assert opened == []
