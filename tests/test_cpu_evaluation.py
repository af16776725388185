"""The CPU evaluation of a compiled model (issue 38, ``kernel_lens.runtime.interpreted``): what a
launch node does with its inputs (refusals, poisoned fresh outputs, ``out=``), and a folder run in
a process that never imported the model (the kernels' text from the IR)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import kernel_lens as kl
from kernel_lens.codegen.plan import build_plan
from kernel_lens.compiler import CompiledModel
from kernel_lens.errors import InputError, KernelLensError, KernelSourceError
from kernel_lens.ir import DType, GraphIR
from kernel_lens.runtime.interpreted import LaunchNode, LaunchRefused, poison, to_numpy, to_torch

from conftest import CORPUS, EXAMPLES, ROOT, eager_on_cpu, flatten, load_module, model_ir

TOY = EXAMPLES / "toy_two_kernels.py"


def test_fresh_outputs_start_as_a_poison_pattern():
    assert torch.isnan(poison((3,), DType.fp32)).all() and torch.isnan(poison((2,), DType.bf16)).all()
    assert poison((2,), DType.i32).tolist() == [0x5A5A5A5A] * 2
    assert poison((1,), DType.i8).tolist() == [0x5A] and poison((1,), DType.u8).tolist() == [0x5A]
    assert poison((1,), DType.i64).tolist() == [0x5A5A5A5A5A5A5A5A]
    assert poison((2,), DType.i1).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn,
                                   torch.int32, torch.bool])
def test_tensors_cross_to_the_reference_evaluator_bit_for_bit(dtype):
    t = (torch.randn(3, 4) * 3).to(dtype)
    ir_dtype = {torch.float32: DType.fp32, torch.float16: DType.fp16, torch.bfloat16: DType.bf16,
                torch.float8_e4m3fn: DType.fp8e4nv, torch.int32: DType.i32, torch.bool: DType.i1}[dtype]
    back = to_torch(to_numpy(t, ir_dtype), ir_dtype)
    assert back.dtype == dtype and back.shape == t.shape
    assert torch.equal(back.view(torch.uint8) if dtype.itemsize == 1 else back, t.view(torch.uint8)
                       if dtype.itemsize == 1 else t)
    assert to_torch(np.float32(2.5), DType.fp32).shape == ()  # a 0-d result stays 0-d
    scalar = t.reshape(-1)[:1].reshape(())  # a 0-d bf16/fp8 result too, bit for bit
    again = to_torch(to_numpy(scalar, ir_dtype), ir_dtype)
    assert again.shape == () and again.dtype == dtype
    assert torch.equal(again.reshape(1).view(torch.uint8), scalar.reshape(1).view(torch.uint8))


def test_the_cpu_tolerances_per_dtype():
    """What verify and the CPU tests accept between the CPU evaluation and eager on the CPU: the
    launches are exact on both sides; only the torch ops' rounding may differ, by dtype."""
    from kernel_lens.verify import cpu_tolerance

    assert cpu_tolerance(torch.float32) == cpu_tolerance(torch.float64) == (1e-5, 1e-5)
    assert cpu_tolerance(torch.float16) == (5e-3, 5e-3) and cpu_tolerance(torch.bfloat16) == (2e-2, 2e-2)
    assert cpu_tolerance(torch.float8_e4m3fn) == cpu_tolerance(torch.float8_e5m2) == (0.125, 0.125)
    assert cpu_tolerance(torch.int32) == cpu_tolerance(torch.bool) == (0.0, 0.0)


def _node(index: int = 0) -> tuple[GraphIR, LaunchNode]:
    ir = model_ir(TOY)
    plan = build_plan(ir)
    return ir, LaunchNode(plan.launches[index], ir.all_kernels(), list(plan.symbols))


def test_a_launch_node_refuses_what_the_cuda_op_refuses():
    ir, node = _node()
    hi = ir.symbols["n"].max
    x = np.ones(16, np.float32)
    assert [a.shape for a in node([x, x])] == [(16,)]
    with pytest.raises(LaunchRefused, match=r"launch 0 \(add_kernel\): the node has 1 inputs, the plan 2"):
        node([x])
    with pytest.raises(LaunchRefused, match=r"input 0 .* has rank 2, expected 1"):
        node([np.ones((4, 4), np.float32), x])
    with pytest.raises(LaunchRefused, match=rf"dynamic dim n = {hi + 1} .* outside \[2, {hi}\]"):
        node([np.ones(hi + 1, np.float32), np.ones(hi + 1, np.float32)])
    with pytest.raises(LaunchRefused, match=r"input 1 dim 0 is 17, expected n = 16"):
        node([x, np.ones(17, np.float32)])


def test_a_node_with_no_variant_for_its_guards_is_refused():
    from conftest import CORPUS

    ir = model_ir(CORPUS / "heuristics.py")
    plan = build_plan(ir)
    launch = next(p for p in plan.launches if p.guards)
    node = LaunchNode(launch.model_copy(update={"dispatch": launch.dispatch[:1]}), ir.all_kernels(),
                      list(plan.symbols))
    want = launch.dispatch[0].when
    module = load_module(CORPUS / "heuristics.py")
    n = module.example_inputs[0].shape[0]
    for size in (2, 3, 16, 17, n, 4096):  # a size whose guards pick the variant left out
        values = {g.name: node.exprs.value(g.expr, {"n": size}) for g in launch.guards}
        if values != want:
            arrays = [np.ones(size, np.float32) for _ in launch.inputs]
            with pytest.raises(LaunchRefused, match="no kernel variant was compiled for the guard values"):
                node(arrays)
            return
    pytest.fail("every size tried picks the same variant")


def test_out_tensors_receive_the_results_on_the_cpu():
    module = load_module(TOY)
    compiled = CompiledModel(model_ir(TOY))
    x, y = (t.clone() for t in module.example_inputs)
    out = torch.empty_like(x)
    got = compiled.run(x, y, out=[out])
    assert got is out and torch.equal(out, eager_on_cpu(module.model, (x, y)))
    with pytest.raises(InputError, match=r"out\[0\] must be a contiguous"):
        compiled.run(x, y, out=[torch.empty(3)])


def test_a_part_no_kernel_writes_shows_as_poison_not_as_zeros():
    """A kernel writing the first half of a torch.empty buffer the model returns whole: eager holds
    whatever the allocator left; the compiled model, evaluated, holds NaN there, so a comparison
    points at the unwritten part instead of passing on a lucky zero."""
    never_wrong = load_module(ROOT / "tests" / "models" / "never_wrong.py")
    compiled = kl.compile(never_wrong.HalfWritten(), never_wrong._x(6), arch=90)
    got = compiled.run(never_wrong._x(6)[0])
    assert not torch.isnan(got[:3]).any() and torch.isnan(got[3:]).all()


def test_a_folder_runs_in_a_process_that_never_imported_the_model(tmp_path):
    """The kernels' text from the IR (no module of the model imported): evaluated on the CPU, the
    same values as eager; a text whose hash is not the recorded one is refused."""
    module = load_module(TOY)
    compiled = CompiledModel(model_ir(TOY))
    compiled.write(tmp_path / "ok")
    script = ("import json, sys, torch, kernel_lens as kl\n"
              "assert 'toy_two_kernels' not in sys.modules\n"
              "m = kl.load(sys.argv[1])\n"
              "x = torch.linspace(-2, 2, 40); y = torch.linspace(1, -1, 40)\n"
              "print(json.dumps(m.run(x, y).tolist()))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ok")], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = eager_on_cpu(module.model, (torch.linspace(-2, 2, 40), torch.linspace(1, -1, 40)))
    assert json.loads(proc.stdout.splitlines()[-1]) == want.tolist()
    doc = json.loads((tmp_path / "ok" / f"{compiled.ir.name}.ir.json").read_text())
    kernel = next(iter(doc["kernels"].values()))
    kernel["source"]["text"] = kernel["source"]["text"].replace("x + y", "x - y")
    bad = GraphIR.model_validate(doc)
    CompiledModel(bad).write(tmp_path / "tampered")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "tampered")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode != 0 and "does not match its recorded hash" in proc.stderr


@pytest.mark.parametrize("name", ["helper_call", "arg_launch_attrs"])
def test_a_folder_whose_kernels_call_helpers_or_triton_names_runs_in_a_fresh_process(name, tmp_path):
    """@triton.jit helpers of one file, and functions imported by name from triton.language,
    rebuilt from the IR's text in a process that never imported the model: eager's values."""
    path = CORPUS / f"{name}.py"
    module = load_module(path)
    CompiledModel(model_ir(path)).write(tmp_path / "folder")
    torch.save(tuple(module.example_inputs), tmp_path / "inputs.pt")
    script = ("import json, sys, torch, kernel_lens as kl\n"
              f"assert {name!r} not in sys.modules\n"
              "out = kl.load(sys.argv[1]).run(*torch.load(sys.argv[2]))\n"
              "out = [out] if isinstance(out, torch.Tensor) else out\n"
              "print(json.dumps([t.tolist() for t in out]))\n")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "folder"), str(tmp_path / "inputs.pt")],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = flatten(eager_on_cpu(module.model, module.example_inputs))
    assert json.loads(proc.stdout.splitlines()[-1]) == [t.tolist() for t in want]


def test_a_kernel_is_rebuilt_from_its_ir_text_in_this_process_and_runs():
    """A kernel no module of this process defines is made from the IR's text (what a folder
    evaluated elsewhere does, shown in-process here), once, and computes what the original does."""
    from kernel_lens.frontends.capture.recorder import interpret_launch
    from kernel_lens.frontends.source import jit_from_ir

    ir = model_ir(TOY)
    source = next(k.source for k in ir.kernels.values() if k.name == "add_kernel")
    elsewhere = source.model_copy(update={"qualname": "nowhere_module.add_kernel"})
    jit = jit_from_ir(elsewhere, {})
    assert jit.fn.__name__ == "add_kernel" and jit.fn.__module__ == "nowhere_module"
    assert jit_from_ir(elsewhere, {}) is jit
    x, y, out = torch.randn(300), torch.randn(300), torch.zeros(300)
    interpret_launch(jit, (x, y, out, 300), {"BLOCK_SIZE": 128}, (3, 1, 1))
    assert torch.equal(out, x + y)


def _elsewhere(source):
    """The kernel's text as a folder evaluated in another process has it: no module of this
    process defines it or the @triton.jit helpers it names."""
    return source.model_copy(update={
        "qualname": "elsewhere." + source.qualname,
        "callees": {n: t.replace("jit:", "jit:elsewhere.") for n, t in source.callees.items()}})


def test_a_kernel_calling_jit_helpers_is_rebuilt_with_its_helpers_from_their_text():
    from kernel_lens.frontends.capture.recorder import interpret_launch
    from kernel_lens.frontends.source import jit_from_ir

    kernel = next(k for k in model_ir(CORPUS / "helper_call.py").kernels.values()
                  if k.name == "add_accumulate_kernel")
    helpers = {h.qualname: h for h in map(_elsewhere, kernel.helpers)}
    jit = jit_from_ir(_elsewhere(kernel.source), helpers)
    load_tile = jit.fn.__globals__["_load_tile"]
    assert load_tile.fn.__module__ == "elsewhere.helper_call"  # rebuilt, not this process's
    assert load_tile is jit_from_ir(helpers["elsewhere.helper_call._load_tile"], helpers)
    x, y = torch.randn(300), torch.randn(300)
    out, acc = torch.zeros(300), x.clone()
    interpret_launch(jit, (x, y, out, acc, 300), {"BLOCK_SIZE": 64}, (5, 1, 1))
    assert torch.equal(out, x + y) and torch.equal(acc, x + (x + y))


def test_a_kernel_naming_functions_imported_from_triton_language_is_rebuilt_from_text():
    """``from triton.language.extra.cuda import gdc_wait``: the name resolves to Triton's own
    function when the text is rebuilt, and the kernel runs."""
    from kernel_lens.frontends.capture.recorder import interpret_launch
    from kernel_lens.frontends.source import jit_from_ir

    kernel = next(k for k in model_ir(CORPUS / "arg_launch_attrs.py").kernels.values()
                  if k.name == "affine_kernel")
    jit = jit_from_ir(_elsewhere(kernel.source), {})
    from triton.language.extra.cuda import gdc_wait

    assert jit.fn.__module__ == "elsewhere.arg_launch_attrs" and jit.fn.__globals__["gdc_wait"] is gdc_wait
    x, y = torch.randn(300), torch.zeros(300)
    interpret_launch(jit, (x, y, 300, 2.0, 1.0), {"BLOCK": 128}, (3, 1, 1))
    assert torch.equal(y, x * 2.0 + 1.0)


def _text_source(qualname, line, text, callees):
    """A kernel's SourceInfo as an IR written elsewhere holds it (file /elsewhere/<module>.py),
    its hash the text's own."""
    import hashlib

    from kernel_lens.ir import SourceInfo

    return SourceInfo(qualname=qualname, file=f"/elsewhere/{qualname.split('.')[1]}.py", line=line,
                      source_hash=hashlib.sha256(text.encode()).hexdigest(), text=text, callees=callees)


def test_a_kernel_calling_a_helper_through_its_module_is_rebuilt_from_text():
    """``ops.twice(x)`` with ``ops`` a plain module: the IR names the callee ``ops.twice``; the
    rebuilt kernel reaches it through a namespace ``ops`` holding what the kernel uses."""
    from kernel_lens.frontends.capture.recorder import interpret_launch
    from kernel_lens.frontends.source import jit_from_ir

    helper = _text_source("elsewhere.ops.twice", 3, "@triton.jit\ndef twice(x):\n    return x * 2 + 1\n",
                  {"triton": "triton"})
    kernel = _text_source("elsewhere.model.twice_kernel", 7,
                  "@triton.jit\ndef twice_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):\n"
                  "    offs = tl.arange(0, BLOCK)\n"
                  "    tl.store(out_ptr + offs, ops.twice(tl.load(x_ptr + offs)))\n",
                  {"tl": "triton.language", "triton": "triton", "ops.twice": "jit:elsewhere.ops.twice"})
    jit = jit_from_ir(kernel, {helper.qualname: helper})
    assert jit.fn.__globals__["ops"].twice is jit_from_ir(helper, {})
    x, out = torch.randn(16), torch.zeros(16)
    interpret_launch(jit, (x, out), {"BLOCK": 16}, (1, 1, 1))
    assert torch.equal(out, x * 2 + 1)


@pytest.mark.parametrize("text, callees, message", [
    ("@triton.jit\ndef k(x_ptr:\n    pass\n", {}, r"^kernel elsewhere\.m\.k: its text in the IR does not parse \(.*, line 2\)"),
    ("@triton.jit\ndef k(x_ptr):\n    pass\n\ndef other():\n    pass\n", {},
     r"^kernel elsewhere\.m\.k: its text in the IR is not one function definition"),
    ("x = 1\n", {}, r"is not one function definition"),
    ("import os\n@triton.jit\ndef k(x_ptr):\n    pass\n", {}, r"is not one function definition"),
    ("@triton.jit\ndef k(x_ptr):\n    helper(x_ptr)\n", {"helper": "jit:elsewhere.m.helper"},
     r"^@triton\.jit function elsewhere\.m\.helper is called but its source is not among the kernel's "
     r"helpers in the IR; recompile the model"),
])
def test_a_kernel_text_that_is_not_one_resolvable_function_is_refused_in_one_line(text, callees, message):
    """Texts whose hash is right (an IR written by hand, or another tool) but that cannot be a
    kernel: refused naming the kernel, every time (nothing cached by a failed rebuild)."""
    from kernel_lens.frontends.source import jit_from_ir

    source = _text_source("elsewhere.m.k", 1, text, callees)
    for _ in range(2):
        with pytest.raises(KernelSourceError, match=message) as err:
            jit_from_ir(source, {})
        assert "\n" not in str(err.value)


def test_a_kernel_text_naming_something_not_triton_is_refused():
    from kernel_lens.frontends.source import jit_from_ir

    ir = model_ir(TOY)
    source = next(iter(ir.kernels.values())).source
    odd = source.model_copy(update={"qualname": "nowhere_module.add_kernel",
                                    "callees": {**source.callees, "os": "os.system"}})
    for _ in range(2):  # the second call as the first: a failed rebuild leaves nothing cached
        with pytest.raises(KernelSourceError, match="is not Triton's"):
            jit_from_ir(odd, {})
    # a name of Triton's modules that this Triton does not define: said as such, one line
    gone = source.model_copy(update={"qualname": "nowhere_module.add_kernel",
                                     "callees": {**source.callees, "tl_gone": "triton.language.no_such_op"}})
    with pytest.raises(KernelSourceError, match=r"^triton\.language\.no_such_op is not defined by this Triton"):
        jit_from_ir(gone, {})


def test_the_summary_names_the_outputs_the_graph_returns():
    """summary()'s body ends with the returned values, as the graph's outputs name them."""
    from kernel_lens.summary import summarize

    ir = model_ir(TOY)
    lines = summarize(ir).splitlines()
    assert f"  return ({', '.join('%' + o for o in ir.outputs)},)" in lines
    assert lines[lines.index("kernels:") - 1].startswith("  return (%")
