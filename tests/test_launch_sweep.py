"""The generated launch code of every corpus model, executed on the CPU host through the fake CUDA
driver at many sizes, against values computed independently in Python from the IR.

For each model, the harness (tests/fake_cuda/harness.cpp, `spec` mode) is linked with the model's
generated ``kl_launches.cpp`` and runs one launch per process over node inputs of the requested
shapes (buffers reserved, never touched, so element counts past 2^31 cost nothing). The test
computes, from the IR alone:

- the grid (the launch's grid expressions at the sizes);
- which binary must run: the first whose assumptions (16-byte alignment of the pointers it gets,
  divisibility by 16, value 1, int32 range) hold for these pointers and values, after guard
  dispatch;
- every parameter's bytes in ABI order: pointers (node buffer + storage offset), scalars packed
  as the chosen binary's C type, the scratch pointers (NULL when the kernel needs none), a tensor
  descriptor's parts (its TMA descriptor as the fake driver records the encoding's arguments,
  then its shape and strides);

A model split by size (``ir.pieces``) is swept piece by piece, each launch at sizes inside its
piece (launches are numbered piece after piece, as the library numbers them).

and asserts the recorded launch, the loaded image (FNV-1a of the chosen binary's cubin) and the
block size. Out-of-range sizes and inconsistent dims must be refused with nothing launched.
"""

from __future__ import annotations

import os
import struct
import subprocess
from pathlib import Path

import pytest
import sympy

import kernel_lens as kl
from kernel_lens.archs import pick_arch
from kernel_lens.ir import ParamKind
from kernel_lens.codegen.launch_io import launch_io
from kernel_lens.ir.symbolic import evaluate, parse
from kernel_lens.targets.common.emit import render_launches

from conftest import ROOT, corpus_files, load_module
from test_runtime_cpp import RUNTIME, WARNINGS, _build, _tool

FAKE = ROOT / "tests" / "fake_cuda"
PAGE = 4096  # reserved buffers start page-aligned; an input's pointer is that + its offset
_PACK = {"int32_t": "<i", "int64_t": "<q", "uint32_t": "<I", "uint64_t": "<Q", "float": "<f",
         "double": "<d", "bool": "<?", "int8_t": "<b", "uint8_t": "<B", "int16_t": "<h",
         "uint16_t": "<H"}


def _fnv(data: bytes) -> str:
    h = 1469598103934665603
    for b in data:
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def _cubin_id(cubin: bytes) -> str:
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", cubin, 0x3A)
    return _fnv(cubin[:shoff + shnum * shentsize])


@pytest.fixture(scope="session")
def fake_driver(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fake_cuda_sweep") / "libfake_cuda.so"
    _build([_tool("gcc", "cc"), "-std=c11", "-O1", "-shared", "-fPIC", *WARNINGS,
            str(FAKE / "fake_cuda.c"), "-o", str(out)])
    return out


class Model:
    """One corpus model: its IR and a harness built with its generated launches."""

    device = 90  # the fake GPU's compute capability

    def __init__(self, stem: str, tmp: Path, arch: int | tuple[int, ...] = 90):
        path = next(p for p in corpus_files() if p.stem == stem)
        module = load_module(path)
        inputs = tuple(t.clone() for t in module.example_inputs)
        self.top = kl.compile(module.model, inputs, dynamic_shapes=module.dynamic_shapes, arch=arch,
                              roles=getattr(module, "roles", None)).ir
        self.ir = self.top.graphs()[0]
        launches = tmp / "kl_launches.cpp"
        launches.write_text(render_launches(self.top))
        self.exe = tmp / "harness"
        _build([_tool("g++", "c++"), "-std=c++17", "-O1", *WARNINGS, "-DKL_HARNESS_GENERATED",
                f"-I{RUNTIME}", str(FAKE / "harness.cpp"), str(launches), "-o", str(self.exe), "-ldl"])

    def graphs(self):
        """(graph, number of its first launch in the library) of each graph that runs."""
        out, offset = [], 0
        for graph in self.top.graphs():
            out.append((graph, offset))
            offset += len(graph.launches)
        return out

    # ---- what the IR says a launch must do ------------------------------------------------------
    def expected(self, index: int, values: dict[str, int], offsets: list[int]):
        ir, launch = self.ir, self.ir.launches[index]
        names = list(ir.symbols)
        io = launch_io(ir, launch, f"__{launch.order}")
        kernel = ir.kernels[launch.kernel]
        if launch.dispatch:
            def truth_of(text: str) -> bool | int:  # a heuristic's truth, or a size function's value
                expr = parse(text, names)
                value = expr.xreplace({s: sympy.Integer(values[s.name]) for s in expr.free_symbols})
                return bool(value) if value in (sympy.true, sympy.false) else int(value)
            truth = {g: truth_of(e) for g, e in launch.guards.items()}
            kernel = ir.kernels[next(d.kernel for d in launch.dispatch if d.when == truth)]
        args = {a.name: a for a in launch.args}
        ints = {a.name: evaluate(parse(a.expr, names), values) for a in launch.args if a.expr is not None}

        def pointer_aligned(name: str, bases: dict) -> bool:
            kind, i = io.bindings[name]
            itemsize = kernel.param(name).dtype.itemsize
            offset = evaluate(parse(args[name].storage_offset, names), values) * itemsize
            return (bases[kind, i] + offset) % 16 == 0

        def holds(binary, bases) -> bool:
            for pname, spec in binary.assumptions.items():
                param = kernel.param(pname)
                if param.kind == ParamKind.tensor:
                    if spec.aligned16 and args[pname].value is not None and not pointer_aligned(pname, bases):
                        return False
                    continue
                if pname not in ints:
                    continue
                v = ints[pname]
                if (spec.divisible16 and v % 16) or (spec.equal_to_1 and v != 1) or \
                        (spec.int32 and not -2**31 <= v < 2**31):
                    return False
            return True

        # bases: page-aligned + offset for node inputs; page-aligned for outputs
        bases = {("in", i): PAGE + (offsets[i] if i < len(offsets) else 0)
                 for i in range(len(io.inputs))}
        bases.update({("out", j): PAGE for j in range(len(io.outputs))})
        arch = pick_arch(getattr(self, "top", ir).built_archs(), self.device)
        binary = next((b for b in kernel.binaries if b.arch == arch and holds(b, bases)), None)
        grid = tuple(evaluate(parse(g, names), values) for g in launch.grid)
        return io, kernel, binary, grid, ints

    def shapes(self, io, values) -> list[list[int]]:
        names = list(self.ir.symbols)
        return [[evaluate(parse(d, names), values) for d in self.ir.values[v].shape] for v in io.inputs]

    def run(self, fake: Path, index: int, shapes: list[list[int]], itemsizes: list[int],
            offsets: list[int], param_sizes: list[int], tmp: Path) -> dict[str, str]:
        spec = tmp / f"spec_{index}.txt"
        index += getattr(self, "offset", 0)  # the launch's number in the library
        lines = [f"launch {index}", f"arch {self.device // 10} {self.device % 10}", f"param_sizes {len(param_sizes)} "
                 + " ".join(map(str, param_sizes))]
        for shape, size, off in zip(shapes, itemsizes, offsets):
            lines.append(f"input {size} {off} {len(shape)} " + " ".join(map(str, shape)))
        spec.write_text("\n".join(lines) + "\n")
        env = {**os.environ, "KERNEL_LENS_TEST_CUDA_DRIVER": str(fake)}
        proc = subprocess.run([str(self.exe), "spec", str(spec)], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return dict(line.partition("=")[::2] for line in proc.stdout.splitlines())


def _pointer_of(out: dict[str, str], kind: str, i: int) -> int:
    key = "inputs" if kind == "in" else "outputs"
    hexes = [h for h in out[key].split(",") if h]
    return int.from_bytes(bytes.fromhex(hexes[i]), "little")


def _check_launch(model: Model, fake: Path, index: int, values: dict[str, int], tmp: Path,
                  misalign: bool = False) -> str:
    io, kernel, binary, grid, ints = model.expected(index, values, [0] * 64)
    ir = model.ir
    itemsizes = [ir.values[v].dtype.itemsize for v in io.inputs]
    offsets = [(ir.values[v].dtype.itemsize if misalign else 0) for v in io.inputs]
    io, kernel, binary, grid, ints = model.expected(index, values, offsets)
    if binary is None:  # every binary's assumptions broken: a refusal, nothing launched
        out = model.run(fake, index, model.shapes(io, values), itemsizes, offsets, [8], tmp)
        assert "break an assumption every compiled binary makes" in out.get("status", ""), out
        assert out["launches"] == "0"
        return "refused"
    sizes = [_size(a.c_type) for a in binary.abi]
    out = model.run(fake, index, model.shapes(io, values), itemsizes, offsets, sizes, tmp)
    where = f"{ir.name} launch {index} at {values}{' misaligned' if misalign else ''}"
    assert out.get("status", "") == "" and "exception" not in out, (where, out)
    assert out["launches"] == "1", where
    assert out["grid"] == ",".join(map(str, grid)), where
    assert out["block"] == str(32 * binary.num_warps), where
    # Triton's launch_pdl / launch_cooperative_grid: cuLaunchKernelEx with the attributes set
    attrs = [":6=1"] * binary.launch_pdl + [":2=1"] * binary.launch_cooperative_grid
    assert out["attrs"] == ("cuLaunchKernelEx" + "".join(attrs) if attrs else "cuLaunchKernel"), where
    image = _cubin_id(binary.cubin) if binary.arch == model.device else _fnv(binary.ptx.encode())
    assert out["image"] == image, f"{where}: another binary ran"
    names = list(ir.symbols)
    args = {a.name: a for a in ir.launches[index].args}
    want = b""
    for a in binary.abi:
        if a.name in ("global_scratch", "profile_scratch"):
            size = binary.global_scratch_size if a.name == "global_scratch" else binary.profile_scratch_size
            if size:  # a scratch buffer of the context's: its address is not ours to predict
                got = bytes.fromhex(out["params"])[len(want):len(want) + 8]
                want += got
            else:
                want += bytes(8)
            continue
        if a.part != "value":  # a tensor descriptor's part
            want += _descriptor_part(a, binary, kernel, args[a.name], io, out, names, values)
        elif a.c_type == "void*":
            kind, i = io.bindings[a.name]
            offset = evaluate(parse(args[a.name].storage_offset, names), values) * \
                kernel.param(a.name).dtype.itemsize
            want += struct.pack("<Q", _pointer_of(out, kind, i) + offset)
        elif a.name in ints:
            want += struct.pack(_PACK[a.c_type], ints[a.name])
        else:
            want += struct.pack(_PACK[a.c_type], args[a.name].constant)
    got = bytes.fromhex(out["params"])
    assert got == want, f"{where}: parameter bytes differ: {_diff(binary.abi, got, want)}"
    return "specialized" if binary.specialized else "generic"


_TMA_HOST_TYPE = {8: 10, 9: 8, 10: 9}  # Triton's device numbering -> CUtensorMapDataType


def _size(c_type: str) -> int:
    return 8 if c_type == "void*" else 128 if c_type == "CUtensorMap" else struct.calcsize(_PACK[c_type])


def _descriptor_part(a, binary, kernel, arg, io, out, names, values) -> bytes:
    """A tensor descriptor's entry parameter: its shape or stride (the descriptor's, evaluated),
    its NaN padding flag, or its TMA descriptor as the fake driver records the encoding."""
    shape = [evaluate(parse(e, names), values) for e in arg.desc_shape]
    strides = [evaluate(parse(e, names), values) for e in arg.desc_strides]
    if a.part == "shape":
        return struct.pack(_PACK[a.c_type], shape[a.dim])
    if a.part == "stride":
        return struct.pack(_PACK[a.c_type], strides[a.dim])
    if a.part == "nan":
        return struct.pack("<?", arg.constant == "nan")
    descriptors = [p.name for p in kernel.leaves() if p.binds_tensor and p.block_shape is not None]
    meta = binary.tensordesc_meta[descriptors.index(a.name)]
    kind, i = io.bindings[a.name]
    itemsize = kernel.param(a.name).dtype.itemsize
    address = _pointer_of(out, kind, i) + evaluate(parse(arg.storage_offset, names), values) * itemsize
    rank = len(shape)
    dims = list(reversed(shape)) + [0] * (5 - rank)
    if meta.fp4_padded:
        dims[0] *= 2
    byte_strides = [meta.elem_size * s for s in reversed(strides[:-1])] + [0] * (5 - rank)
    box = list(reversed(meta.block_size)) + [0] * (5 - rank)
    element_strides = [1] * rank + [0] * (5 - rank)
    header = bytes([_TMA_HOST_TYPE.get(meta.elem_type, meta.elem_type), rank, 0, meta.swizzle, 2,
                    int(arg.constant == "nan"), 0, 0])
    return (header + struct.pack("<Q", address) + struct.pack("<5Q", *dims)
            + struct.pack("<4Q", *byte_strides[:4]) + struct.pack("<5I", *box)
            + struct.pack("<5I", *element_strides))


def _diff(abi, got: bytes, want: bytes) -> str:
    at, parts = 0, []
    for a in abi:
        n = _size(a.c_type)
        if got[at:at + n] != want[at:at + n]:
            parts.append(f"{a.name} ({a.c_type}): got {got[at:at + n].hex()} want {want[at:at + n].hex()}")
        at += n
    return "; ".join(parts) or f"lengths {len(got)} vs {len(want)}"


def _assignments(model: Model) -> list[dict[str, int]]:
    """Range ends, odd sizes and the captured sizes, per symbol (others at their example)."""
    out = []
    syms = model.ir.symbols
    base = {n: s.example for n, s in syms.items()}
    out.append(dict(base))
    for name, info in syms.items():
        hi = info.max if info.max is not None else info.example * 4 + 3
        for v in {info.min, min(hi, 17), min(hi, info.min + 1) | 1, hi}:
            if info.min <= v <= hi and v * info.scale + info.offset >= 0:
                out.append({**base, name: v})
    return out


_STEMS = [p.stem for p in corpus_files()]


@pytest.mark.parametrize("stem", _STEMS)
def test_generated_launches_match_the_ir_at_many_sizes(stem, fake_driver, tmp_path):
    model = Model(stem, tmp_path)
    seen = set()
    for graph, offset in model.graphs():  # each piece of a model split by size
        model.ir, model.offset = graph, offset
        for values in _assignments(model):
            for index in range(len(model.ir.launches)):
                seen.add(_check_launch(model, fake_driver, index, values, tmp_path))
                seen.add(_check_launch(model, fake_driver, index, values, tmp_path, misalign=True))
    assert seen


def test_sizes_outside_the_range_are_refused_and_nothing_runs(fake_driver, tmp_path):
    model = Model("rmsnorm", tmp_path)
    io, *_ = model.expected(0, {"batch": 2, "seq": 8}, [0])
    for batch, seq in ((65, 8), (2, 2049), (1, 8)):
        out = model.run(fake_driver, 0, [[batch, seq, 80]] + model.shapes(io, {"batch": 2, "seq": 8})[1:],
                        [4] * len(io.inputs), [0] * len(io.inputs), [8], tmp_path)
        assert "outside the range" in out["status"], out
        assert out["launches"] == "0" and out["loads"] == "0"


def test_inconsistent_dims_are_refused(fake_driver, tmp_path):
    model = Model("vector_add", tmp_path)
    out = model.run(fake_driver, 0, [[1000], [999]], [4, 4], [0, 0], [8], tmp_path)
    assert "expected" in out["status"] and out["launches"] == "0", out


def test_misaligned_views_run_the_generic_binary_and_past_int32_the_int64_one(fake_driver, tmp_path):
    cases = load_module(ROOT / "tests" / "models" / "specialization_cases.py")
    import torch

    ir = kl.compile(cases.Scale(), (torch.randn(4096),), dynamic_shapes=({0: cases.unbounded},),
                    arch=90).ir
    model = Model.__new__(Model)
    model.ir = ir
    (tmp_path / "kl_launches.cpp").write_text(render_launches(ir))
    model.exe = tmp_path / "harness"
    _build([_tool("g++", "c++"), "-std=c++17", "-O1", *WARNINGS, "-DKL_HARNESS_GENERATED",
            f"-I{RUNTIME}", str(FAKE / "harness.cpp"), str(tmp_path / "kl_launches.cpp"), "-o",
            str(model.exe), "-ldl"])
    (sym,) = ir.symbols
    assert _check_launch(model, fake_driver, 0, {sym: 4096}, tmp_path) == "specialized"
    assert _check_launch(model, fake_driver, 0, {sym: 4096}, tmp_path, misalign=True) == "generic"
    assert _check_launch(model, fake_driver, 0, {sym: 4099}, tmp_path) == "generic"
    # 2^31 + 16 elements: divisible by 16 but past int32, so only the int64 binary may run
    assert _check_launch(model, fake_driver, 0, {sym: 2**31 + 16}, tmp_path) == "generic"
    _, _, binary, _, ints = model.expected(0, {sym: 2**31 + 16}, [0])
    assert next(a for a in binary.abi if a.name == "n").c_type == "int64_t" and ints["n"] == 2**31 + 16


def test_launch_log_names_the_binary_that_ran(fake_driver, tmp_path):
    # KERNEL_LENS_LOG_LAUNCHES=1: one stderr line per launch with the binary's variant
    model = Model("vector_add", tmp_path)
    for offset, variant in ((0, "specialized"), (4, "generic")):
        spec = tmp_path / "spec.txt"
        spec.write_text(f"launch 0\narch 9 0\nparam_sizes 4 8 8 8 4\ninput 4 {offset} 1 4096\n"
                        f"input 4 0 1 4096\n")
        env = {**os.environ, "KERNEL_LENS_TEST_CUDA_DRIVER": str(fake_driver),
               "KERNEL_LENS_LOG_LAUNCHES": "1"}
        proc = subprocess.run([str(model.exe), "spec", str(spec)], capture_output=True, text=True,
                              env=env, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert f"binary={variant} arch=sm_90 grid=(" in proc.stderr, proc.stderr
    env.pop("KERNEL_LENS_LOG_LAUNCHES")
    proc = subprocess.run([str(model.exe), "spec", str(spec)], capture_output=True, text=True,
                          env=env, timeout=60)
    assert "kernel_lens: launch" not in proc.stderr


def test_a_dim_that_is_a_multiple_of_its_symbol_is_checked(fake_driver, tmp_path):
    # swiglu's x is (tokens, 2*intermediate): intermediate is read as width / 2, so an odd width matches no s1 and
    # must be refused (not floored to the s1 below it), with nothing launched
    model = Model("swiglu", tmp_path)
    values = {"tokens": 10, "intermediate": 96}
    io, *_ = model.expected(0, values, [0])
    (shape,) = model.shapes(io, values)
    assert shape == [10, 192]
    ok = model.run(fake_driver, 0, [shape], [4], [0], [8], tmp_path)
    assert not ok["status"] and ok["launches"] == "1", ok
    out = model.run(fake_driver, 0, [[10, 193]], [4], [0], [8], tmp_path)
    assert ("input 0 dim 1 is 193, not of the form the model was compiled for: size must be a "
            "multiple of 2 (dimension intermediate = size / 2)") in out["status"], out
    assert out["launches"] == "0" and out["loads"] == "0", out


def test_of_several_portable_archs_below_the_device_the_newest_runs(fake_driver, tmp_path):
    # sm_80, sm_86 and sm_90 built (sm_80/86 PTX portable, sm_90's an sm_90a target): an sm_89
    # device JIT-compiles sm_86's PTX, the newest not above it; sm_87 too; sm_85 takes sm_80's
    model = Model("vector_add", tmp_path, arch=(80, 86, 90))
    assert model.top.built_archs() == [(80, False), (86, False), (90, True)]
    values = {s: 4096 for s in model.ir.symbols}
    ran = {}
    for device in (85, 87, 89, 90):
        model.device = device
        _check_launch(model, fake_driver, 0, values, tmp_path)  # the loaded image is that arch's
        ran[device] = model.expected(0, values, [0])[2].arch
    assert ran == {85: 80, 87: 86, 89: 86, 90: 90}


def test_one_artifact_set_for_several_archs_runs_the_devices_binary(fake_driver, tmp_path):
    # --arch sm_80,sm_90: a binary per arch in one library; the launch runs the device's own
    # cubin, JIT-compiles the newest portable PTX below a newer device (Triton's sm_90 PTX
    # targets sm_90a, which runs on sm_90 only), and refuses an older device in one line
    model = Model("vector_add", tmp_path, arch=(80, 90))
    kernel = next(iter(model.ir.kernels.values()))
    assert sorted((b.arch, b.specialized) for b in kernel.binaries) == \
        [(80, False), (80, True), (90, False), (90, True)]
    assert model.top.built_archs() == [(80, False), (90, True)]
    values = {s: 4096 for s in model.ir.symbols}
    ran = {}
    for device in (80, 86, 90, 100):
        model.device = device
        _check_launch(model, fake_driver, 0, values, tmp_path)
        ran[device] = model.expected(0, values, [0])[2].arch
    assert ran == {80: 80, 86: 80, 90: 90, 100: 80}
    model.device = 75
    io, *_ = model.expected(0, values, [0])
    out = model.run(fake_driver, 0, model.shapes(io, values), [4] * len(io.inputs),
                    [0] * len(io.inputs), [8], tmp_path)
    assert "built for sm_80, sm_90; this GPU is sm_75, which none of them runs on: compile again " \
        "with --arch sm_75" in out["status"], out
    assert out["launches"] == "0" and out["loads"] == "0"
