"""One test per behaviour a planted one-line bug went unnoticed for (issue 8's mutation check):
each fails if the behaviour is removed, not only if the code crashes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import triton
import triton.language as tl

import kernel_lens as kl
from kernel_lens.errors import PtxIsaError
from kernel_lens.ir import GraphIR, ParamKind, Specialization

from conftest import CORPUS, EXAMPLES, ROOT, load_module

TOY = str(EXAMPLES / "toy_two_kernels.py")
PIPELINE = ["role-inference", "grid-canonicalization", "specialization", "ptx-isa-clamp"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", *args], capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    return proc


def _binaries(ir: GraphIR, name: str):
    kernel = next(k for k in ir.kernels.values() if k.name == name)
    return kernel, kernel.binaries


# --- specialization: what the generic binary may and may not assume -----------------------------
@triton.jit
def _add(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)


class _CloneAndProduct(torch.nn.Module):
    """x_ptr gets a clone (a copy a lowering may turn into Identity: the input's buffer, any
    alignment), y_ptr a computed product (a fresh buffer in ONNX too)."""

    def forward(self, x):
        a, b = x.clone(), x * 2.0
        out = torch.empty_like(x)
        _add[(triton.cdiv(x.shape[0], 64),)](a, b, out, x.shape[0], BLOCK=64)
        return out


def test_clones_are_not_assumed_aligned_computed_results_are():
    x = torch.randn(256)
    ir = kl.compile(_CloneAndProduct(), (x,), dynamic_shapes=({0: torch.export.Dim("n", min=2,
                                                                                    max=4096)},),
                    arch=90).ir
    kernel, bins = _binaries(ir, "_add")
    assert kernel.specialization["x_ptr"].aligned16  # the capture saw aligned pointers
    generic = bins[-1]
    assert not generic.specialized
    assert not generic.assumptions.get("x_ptr", Specialization()).aligned16  # the clone
    assert generic.assumptions["y_ptr"].aligned16 and generic.assumptions["out_ptr"].aligned16


def test_generic_binary_drops_divisibility_it_cannot_prove():
    cases = load_module(ROOT / "tests" / "models" / "specialization_cases.py")
    x = torch.randn(4096)  # n = 4096 at capture: divisible by 16
    ir = kl.compile(cases.Scale(), (x,), dynamic_shapes=({0: cases.unbounded},), arch=90).ir
    kernel, (spec, generic) = _binaries(ir, "scale_kernel")
    assert kernel.specialization["n"].divisible16 and spec.assumptions["n"].divisible16
    assert not generic.assumptions.get("n", Specialization()).divisible16
    assert spec.ptx != generic.ptx


# --- the PTX clamp: a refusal reaches the user ---------------------------------------------------
def test_ptx_clamp_refusal_reaches_the_user():
    m = load_module(EXAMPLES / "toy_two_kernels.py")
    with pytest.raises(PtxIsaError, match=r"sm_90a needs PTX ISA >= 8\.0, but at most 7\.8"):
        kl.compile(m.model, m.example_inputs, dynamic_shapes=m.dynamic_shapes, arch=90,
                   options={"ptx_version": "7.8"})
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "dump-ir", TOY, "--arch", "90",
                           "--ptx-version", "7.8"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2 and "needs PTX ISA >= 8.0" in proc.stderr


# --- PassManager.add(after=) --------------------------------------------------------------------
def test_add_after_forces_the_order():
    from test_passes import _pass

    from kernel_lens import PassManager

    plain = PassManager().add(_pass("b")).add(_pass("a"))
    assert [p.name for p in plain.order()] == ["b", "a"]  # no constraint: insertion order
    forced = PassManager().add(_pass("b"), after="a").add(_pass("a"))
    assert [p.name for p in forced.order()] == ["a", "b"]
    forced_many = PassManager().add(_pass("c"), after=["a", "b"]).add(_pass("b")).add(_pass("a"))
    order = [p.name for p in forced_many.order()]
    assert order.index("c") > order.index("a") and order.index("c") > order.index("b")


# --- role inference: atomics called as tensor methods --------------------------------------------
@triton.jit
def _method_atomics(x_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    (acc_ptr + offs % 4).atomic_add(x, mask=mask)  # the method form of tl.atomic_add


class _MethodAtomics(torch.nn.Module):
    def forward(self, x):
        acc = torch.zeros(4)
        _method_atomics[(triton.cdiv(x.shape[0], 32),)](x, acc, x.shape[0], BLOCK=32)
        return acc


def test_method_form_atomics_make_the_pointer_inplace():
    x = torch.arange(64, dtype=torch.float32)
    result = kl.compile(_MethodAtomics(), (x,), arch=90)
    kernel, _ = _binaries(result.ir, "_method_atomics")
    roles = {p.name: p.role.value for p in kernel.params if p.kind == ParamKind.tensor}
    assert roles == {"x_ptr": "input", "acc_ptr": "inplace"}
    want = torch.stack([x[i::4].sum() for i in range(4)])
    torch.testing.assert_close(result.example_outputs, want)


# --- every CLI flag changes what it should ---------------------------------------------------------
@pytest.fixture(scope="module")
def toy_pipeline_json():
    return json.loads(_cli("dump-ir", TOY, "--json", "--arch", "90").stdout)


def test_dump_ir_json_holds_every_pass_and_the_binaries(toy_pipeline_json):
    ir = GraphIR.model_validate(toy_pipeline_json)
    assert ir.passes_run == PIPELINE
    assert {"roles", "canonical-symbolic", "guarded-binaries"} <= set(ir.facts)
    kernel, bins = _binaries(ir, "add_kernel")  # reads graph inputs: a generic binary too
    assert [b.specialized for b in bins] == [True, False] and all(b.ptx and b.cubin for b in bins)
    assert all(p.role is not None for k in ir.kernels.values() for p in k.params
               if p.kind == ParamKind.tensor)


def test_cli_roles_overrides_role_inference(toy_pipeline_json):
    base = GraphIR.model_validate(toy_pipeline_json)
    kernel, _ = _binaries(base, "scale_relu_kernel")
    assert kernel.param("x_ptr").role.value == "input"
    ir = GraphIR.model_validate_json(_cli(
        "dump-ir", TOY, "--json", "--arch", "90",
        "--roles", json.dumps({"scale_relu_kernel": {"x_ptr": "inplace"}})).stdout)
    kernel, _ = _binaries(ir, "scale_relu_kernel")
    assert kernel.param("x_ptr").role.value == "inplace"


def test_cli_autotune_picks_the_config():
    path = str(CORPUS / "autotune.py")
    for block, warps in ((32, 1), (128, 4)):
        ir = GraphIR.model_validate_json(_cli(
            "dump-ir", path, "--json", "--arch", "90",
            "--autotune", json.dumps({"scaled_add_kernel": {"BLOCK_SIZE": block}})).stdout)
        kernel, _ = _binaries(ir, "scaled_add_kernel")
        assert kernel.param("BLOCK_SIZE").constexpr_value == block
        assert kernel.options.num_warps == warps


def test_cli_ptx_version_and_arch_change_the_binaries(toy_pipeline_json):
    base = GraphIR.model_validate(toy_pipeline_json)
    assert {b.ptx_version for k in base.kernels.values() for b in k.binaries} != {"8.4"}
    ir = GraphIR.model_validate_json(_cli("dump-ir", TOY, "--json", "--arch", "80",
                                          "--ptx-version", "8.4").stdout)
    assert ir.arch == 80
    for k in ir.kernels.values():
        for b in k.binaries:
            assert b.arch == 80 and b.ptx_version == "8.4" and ".version 8.4" in b.ptx
            assert ".target sm_80" in b.ptx
