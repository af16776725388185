"""GPU host only: the binary that runs is the one the inputs allow, and its results are right.

A vectorizing copy kernel (fp16, 1024-element blocks) has a specialized binary (16-byte aligned
pointers, n divisible by 16: vector loads) and a generic one; the runtime must run the generic one
for a view at an odd offset and for an odd n, the specialized one otherwise, and both must be
bit-identical to Triton launching the same kernel natively. A scale kernel over an unbounded dim
(64-bit safe indexing) runs its int64 binary past 2^31 elements. Which binary ran is read from the runtime's launch log
(KERNEL_LENS_LOG_LAUNCHES=1), in a subprocess so the setting is seen at the library's first launch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import ROOT

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

PROBE = textwrap.dedent('''
    import json, sys
    import torch, triton, triton.language as tl
    sys.path.insert(0, "tests")
    import kernel_lens as kl

    @triton.jit
    def copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    class Copy(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            copy_kernel[(triton.cdiv(x.shape[0], 1024),)](x, out, x.shape[0], BLOCK=1024)
            return out

    def report(label, ours, native):
        same = torch.equal(ours.view(torch.int16), native.view(torch.int16))
        print(json.dumps({"case": label, "bit_identical": same}), flush=True)

    n = torch.export.Dim("n", min=16, max=1 << 26)
    base = torch.randn(1 << 20, device="cuda", dtype=torch.float16)
    compiled = kl.compile(Copy(), (base[:4096].clone(),), dynamic_shapes=({0: n},), targets=["ort"])
    kernel = next(iter(compiled.ir.kernels.values()))
    spec, generic = kernel.binaries
    print(json.dumps({"vectorized_specialized": "ld.global.v" in spec.ptx,
                      "vectorized_generic": "ld.global.v" in generic.ptx}), flush=True)
    for label, x in [("aligned 4096", base[:4096]), ("offset 1, n 4096", base[1:4097]),
                     ("aligned, n 4099", base[:4099]), ("range min 16", base[:16]),
                     ("range max", torch.randn(1 << 26, device="cuda", dtype=torch.float16))]:
        print("CASE " + label, file=sys.stderr, flush=True)
        ours = compiled.run(x)
        torch.cuda.synchronize()
        report(label, ours, Copy()(x))

    @triton.jit
    def scale64_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)  # 64-bit safe
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 3.0, mask=mask)

    class Scale64(torch.nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            scale64_kernel[(triton.cdiv(x.shape[0], 1024),)](x, out, x.shape[0], BLOCK=1024)
            return out

    big = torch.randn((1 << 31) + 16, device="cuda", dtype=torch.float16)
    unbounded = torch.export.Dim("n", min=16)
    scaled = kl.compile(Scale64(), (big[:4096].clone(),), dynamic_shapes=({0: unbounded},),
                        targets=["ort"])
    print("CASE int64 2^31+16", file=sys.stderr, flush=True)
    ours = scaled.run(big)
    torch.cuda.synchronize()
    report("int64 2^31+16", ours, Scale64()(big))
''')


def test_the_binary_the_inputs_allow_runs_and_is_bit_exact(tmp_path):
    env = {**os.environ, "KERNEL_LENS_LOG_LAUNCHES": "1"}
    probe = tmp_path / "probe.py"  # a file: Triton reads kernels' source
    probe.write_text(PROBE)
    proc = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=900)
    print(proc.stdout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert lines[0] == {"vectorized_specialized": True, "vectorized_generic": False}
    assert all(r["bit_identical"] for r in lines[1:]), lines
    ran: dict[str, list[str]] = {}
    case = None
    for line in proc.stderr.splitlines():
        if line.startswith("CASE "):
            case = line[5:]
        elif line.startswith("kernel_lens: launch") and case:
            ran.setdefault(case, []).append(line.split("binary=")[1].split()[0])
    assert ran["aligned 4096"] == ["specialized"]
    assert ran["offset 1, n 4096"] == ["generic"]  # 2-byte offset: not 16-byte aligned
    assert ran["aligned, n 4099"] == ["generic"]   # n not divisible by 16
    assert ran["range min 16"] == ["specialized"] and ran["range max"] == ["specialized"]
    assert ran["int64 2^31+16"] == ["generic"]     # only the int64 binary may index past 2^31
