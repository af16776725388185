"""`kernel_lens export-triton --backend tensorrt` on a CPU-only host, with TensorRT-RTX's real
builder (scripts/fetch_tensorrt_rtx.py) importable: the export writes a `tensorrt_plan` model
whose config.pbtxt (parsed with Triton's own protobuf schema) agrees with the graph, ships the
graph and the plugins, and leaves the engine to `trtexec` on the serving GPU (the command it
prints): there is no GPU here, and TensorRT-RTX's engines do not load in Triton's tensorrt backend.
TensorRT-RTX builds an engine from the shipped graph and plugins below. A plain dlopen of the plugin library
into TensorRT-RTX's process registers nothing (Triton's tensorrt backend loads
`--backend-config=tensorrt,plugins=...` that way), which is why the export also writes a
registration library. That one finds the loaded libnvinfer.so.10 with RTLD_NOLOAD and registers
every creator through IPluginRegistry: tested against a stand-in registry (tests/trt/
fake_registry.cpp) built from the real TensorRT 10.14 headers, since TensorRT-RTX's registry has
another vtable and no TensorRT 10 runs here. Serving the plan needs Triton's tensorrt backend on
a GPU TensorRT supports: not available here."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap

import onnx
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

import kernel_lens as kl
from kernel_lens.targets.trt.target import plugin_names

from kernel_lens.toolchain import compilers

from conftest import ROOT, load_module, reseal_manifest
from test_serving_triton import _expected, _served
from test_trt_plugins import MODELS

LOAD = textwrap.dedent("""
    import ctypes, json, sys
    import tensorrt_rtx_bindings as trt

    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    registry = trt.get_plugin_registry()
    ctypes.CDLL(sys.argv[1])  # a plain dlopen, as Triton's tensorrt backend does
    out = {"creators": [c.name for c in registry.all_creators if c.name.startswith(sys.argv[3])]}
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    out["parsed"] = bool(parser.parse(open(sys.argv[2], "rb").read()))
    if out["parsed"]:
        config = builder.create_builder_config()
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            t = network.get_input(i)
            profile.set_shape(t.name, *[tuple(d[k] for d in json.loads(sys.argv[4])[t.name]) for k in range(3)])
        config.add_optimization_profile(profile)
        engine = builder.build_serialized_network(network, config)
        out["engine_bytes"] = 0 if engine is None else engine.nbytes
    print(json.dumps(out))
""")


def test_tensorrt_plan_export_and_plugin_registration(rtx, trt_headers, tmp_path):
    from kernel_lens.codegen.profile import optimization_profile

    module = load_module(MODELS["toy_two_kernels"])
    out = tmp_path / "out"
    compiled = kl.compile(module.model, tuple(t.clone() for t in module.example_inputs),
                          dynamic_shapes=module.dynamic_shapes, arch=90, targets=["trt"], output_dir=out)
    env = {**os.environ, **rtx, "KERNEL_LENS_CACHE": str(tmp_path / "cache")}
    # The folder is data (issue 30, item 6): its plugin library is never opened by the export,
    # which builds the graph and library from the folder's IR. A planted constructor must not run.
    marker = tmp_path / "constructor_ran"
    planted = tmp_path / "planted.c"
    planted.write_text(f'#include <stdio.h>\n__attribute__((constructor)) static void ran(void) '
                       f'{{ FILE *f = fopen("{marker}", "w"); if (f) fclose(f); }}\n')
    library = compiled.artifacts["trt.library"]
    subprocess.run([compilers.find_cxx(), "-x", "c", "-shared", "-fPIC", str(planted), "-o", str(library)],
                   check=True)
    reseal_manifest(out)  # a folder whose manifest agrees: what is tested is that the export never opens it
    repo = tmp_path / "repo"
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "export-triton", str(out), "-o", str(repo),
                           "--backend", "tensorrt", "--name", "toy"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    model_dir = repo / "toy"
    (shim,) = (model_dir / "1").glob("libkl_ToyModel_trt_v3_*_register.so")
    assert f"--backend-config=tensorrt,plugins={shim.absolute()}" in proc.stdout + proc.stderr

    config = text_format.Parse((model_dir / "config.pbtxt").read_text(), mc.ModelConfig())
    graph = onnx.load(str(compiled.artifacts["trt.onnx"]), load_external_data=False).graph
    assert config.name == "toy" and config.platform == "tensorrt_plan" and not config.backend
    assert config.default_model_filename == "model.plan" and config.max_batch_size == 0
    assert _served(config.input) == _expected(graph.input)
    assert _served(config.output) == _expected(graph.output)
    assert [(g.count, g.kind) for g in config.instance_group] == [(1, mc.ModelInstanceGroup.KIND_GPU)]
    assert not marker.exists()
    version = model_dir / "1"
    (shipped,) = [p for p in version.glob("libkl_ToyModel_trt_v3_*.so") if p != shim]
    # issue 43: no GPU here, and TensorRT-RTX's engines do not load in Triton's tensorrt backend:
    # the graph and the plugins are shipped, the engine is left to trtexec on the serving GPU
    assert sorted(p.name for p in version.iterdir()) == sorted(["model.onnx", shipped.name, shim.name])
    assert hashlib.sha256(shipped.read_bytes()).hexdigest()[:12] in shipped.name
    assert shipped.read_bytes() != library.read_bytes()  # built from the IR, not the planted file
    assert f"trtexec --onnx={version.absolute()}/model.onnx --dynamicPlugins={shipped.absolute()}" in proc.stderr

    script = tmp_path / "load.py"
    script.write_text(LOAD)
    names = sorted(plugin_names(compiled.ir).values())
    profile = json.dumps(optimization_profile(compiled.ir))

    def load(path):
        run = subprocess.run([sys.executable, str(script), str(path), str(compiled.artifacts["trt.onnx"]),
                              f"kl_{compiled.ir.name}_", profile], env=env, capture_output=True, text=True,
                             timeout=600)
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.splitlines()[-1])

    unregistered = load(shipped)  # the plugin library alone: dlopen registers nothing
    assert unregistered["creators"] == [] and not unregistered["parsed"]

    trt, cuda = trt_headers
    fake = tmp_path / "fake" / "libnvinfer.so.10"
    fake.parent.mkdir()
    subprocess.run([compilers.find_cxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                    "-Wl,-soname,libnvinfer.so.10", "-isystem", str(trt), "-isystem", str(cuda),
                    str(ROOT / "tests" / "trt" / "fake_registry.cpp"), "-o", str(fake)], check=True)
    register = subprocess.run([sys.executable, "-c", REGISTER, str(fake), str(shim)], capture_output=True,
                              text=True, timeout=120)
    assert register.returncode == 0, register.stderr[-3000:]
    assert register.stdout.splitlines() == [f"{n}/1/kernel_lens" for n in names], register.stderr
    alone = subprocess.run([sys.executable, "-c", REGISTER, "", str(shim)], capture_output=True, text=True,
                           timeout=120)  # no TensorRT in the process: a clear message, nothing registered
    assert alone.returncode == 0 and alone.stdout == ""
    assert "TensorRT is not loaded in this process" in alone.stderr and "not with LD_PRELOAD" in alone.stderr


REGISTER = textwrap.dedent("""
    import ctypes, sys
    fake = ctypes.CDLL(sys.argv[1]) if sys.argv[1] else None  # TensorRT first, as in Triton
    ctypes.CDLL(sys.argv[2])  # the registration library, loaded by a plain dlopen
    if fake is not None:
        fake.fake_registered.restype = ctypes.c_char_p
        print("".join(sorted(fake.fake_registered().decode().splitlines(True))), end="")
""")


def test_a_cpu_host_export_ships_the_graph_and_the_trtexec_command_not_an_engine(trt_headers, tmp_path):
    """Issue 43 item 3, without TensorRT installed: exit 0, one warning line naming the engine
    left out, the filled-in trtexec command (the profile's min/opt/max shapes), no model.plan."""
    from kernel_lens.codegen.profile import optimization_profile

    module = load_module(MODELS["toy_two_kernels"])
    out = tmp_path / "out"
    compiled = kl.compile(module.model, tuple(t.clone() for t in module.example_inputs),
                          dynamic_shapes=module.dynamic_shapes, arch=90, targets=["trt"], output_dir=out)
    repo = tmp_path / "repo"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-m", "kernel_lens.cli", "export-triton", str(out), "-o", str(repo),
                           "--backend", "tensorrt", "--name", "toy"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    version = (repo / "toy" / "1").absolute()
    assert not (version / "model.plan").exists() and (version / "model.onnx").is_file()
    warning = [line for line in proc.stderr.splitlines() if "model.plan is not built" in line]
    assert len(warning) == 1 and "no CUDA GPU on this host" in warning[0] and "trtexec" in warning[0]
    (shipped,) = [p for p in version.glob("libkl_ToyModel_trt_v3_*.so") if not p.name.endswith("_register.so")]
    ((name, dims),) = list(optimization_profile(compiled.ir).items())[:1]
    shapes = ["x:{0},y:{0}".format("x".join(str(d[k]) for d in dims)) for k in range(3)]
    assert (f"trtexec --onnx={version}/model.onnx --dynamicPlugins={shipped} --saveEngine={version}/model.plan "
            f"--stronglyTyped --minShapes={shapes[0]} --optShapes={shapes[1]} --maxShapes={shapes[2]}") in proc.stderr
    assert "model.plan was not built by the export (no CUDA GPU on this host)" in (repo / "toy" / "config.pbtxt").read_text()
