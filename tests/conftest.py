import atexit
import importlib.util
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

# Hermetic: every test session builds into its own caches, never the user's ~/.cache, nor
# Triton's ~/.triton (whose key omits the kernel's file: an entry from another checkout would
# hand back a binary whose line info names that checkout).
# pytest-xdist workers (README: -n 2) share the cache their controller made: builds and lowerings
# are content-addressed and locked, so a model compiled on one worker is reused by the other.
_SHARED = "KL_TEST_SHARED_CACHE"
_WORKER = "PYTEST_XDIST_WORKER" in os.environ and os.environ.get(_SHARED)
os.environ["KERNEL_LENS_CACHE"] = _WORKER or tempfile.mkdtemp(prefix="kl_test_cache_")
os.environ[_SHARED] = os.environ["KERNEL_LENS_CACHE"]
os.environ["TRITON_HOME"] = os.environ["KERNEL_LENS_CACHE"]
os.environ.pop("TRITON_CACHE_DIR", None)
_OWNER = os.getpid()  # forked children (mutmut) and xdist workers share it: only its maker removes it
if not _WORKER:
    atexit.register(lambda folder=os.environ["KERNEL_LENS_CACHE"]: os.getpid() == _OWNER
                    and shutil.rmtree(folder, True))


@pytest.fixture(scope="session", autouse=True)
def _fresh_build_cache():
    """A fresh kernel_lens cache for each test session, made when the session starts: a process
    that imports this file once and runs several sessions in forked children (mutmut) must not
    hand one session's cached lowerings and builds to the next. xdist workers keep the run's
    shared cache."""
    if _WORKER:
        yield
        return
    folder = tempfile.mkdtemp(prefix="kl_test_cache_")
    previous, os.environ["KERNEL_LENS_CACHE"] = os.environ["KERNEL_LENS_CACHE"], folder
    yield
    os.environ["KERNEL_LENS_CACHE"] = previous
    shutil.rmtree(folder, True)


# --- the fast set and the long set (docs/testing.md) ----------------------------------------
# The README's test command runs `-m "not long"`; .ci/run runs the long set after it.
# Long by nature: TensorRT-RTX engine builds (the `rtx` fixture), the third-party library
# conformance run, a real tritonserver.
_LONG_FILES = {"test_trt_rtx.py", "test_library_conformance.py"}
_LONG_FIXTURES = {"tritonserver", "rtx"}
# Tests that build a native library (or harness) for every corpus model: the fast set keeps the
# models below, which together use every launch feature; the long set builds the rest.
_PER_MODEL = {"test_trt_plugins.py": "stem", "test_targets.py": "name",
              "test_launch_sweep.py": "stem", "test_serving_triton.py": "compiled",
              "test_hf_models.py": "case"}
FAST_MODELS = {"toy_two_kernels", "llama_block", "inplace_input", "constexpr_from_sizes",
               "autotune_features", "heuristics", "llama", "bert"}  # heuristics: a true/false guard


def pytest_collection_modifyitems(config, items):
    for item in items:
        key = _PER_MODEL.get(item.path.name)
        params = getattr(getattr(item, "callspec", None), "params", {})
        if item.path.name in _LONG_FILES or _LONG_FIXTURES & set(item.fixturenames) or \
                (key in params and str(params[key]) not in FAST_MODELS):
            item.add_marker(pytest.mark.long)


ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "corpus"
EXAMPLES = ROOT / "examples"


def load_module(path: Path):
    """Import a corpus/example file by path (its folder on sys.path for sibling imports)."""
    if str(path.parent) not in sys.path:
        sys.path.insert(0, str(path.parent))
    name = path.stem
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == str(path):
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def flatten(x):
    """A model's outputs (a tensor or nested tuples of them) as a flat list."""
    import torch

    return [x] if isinstance(x, torch.Tensor) else [t for item in x for t in flatten(item)]


def corpus_files():
    return sorted(p for p in CORPUS.glob("*.py") if not p.name.startswith("_"))


def example_files():
    """Example model files (``_*.py`` are helper modules they import)."""
    return sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


@pytest.fixture(scope="session")
def corpus_ids():
    return [p.stem for p in corpus_files()]


@pytest.fixture(scope="session")
def ort_headers():
    """ORT headers from the package registries through the repo's own script (cached), for any
    test that builds a library, whatever order the tests run in."""
    import subprocess

    from kernel_lens.toolchain.headers import find_ort_include

    if "ORT_INCLUDE_DIR" not in os.environ:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_headers.py")], check=True,
                       capture_output=True)
    return find_ort_include()


@pytest.fixture(scope="session")
def trt_headers():
    """TensorRT headers (and the CUDA runtime headers they include) for tests that compile
    against them, fetched by the repo's own script (cached) unless TENSORRT_INCLUDE_DIR is set."""
    import subprocess

    from kernel_lens.toolchain.headers import find_cuda_include, find_tensorrt_include

    if "TENSORRT_INCLUDE_DIR" not in os.environ:
        subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_headers.py"), "--trt"],
                       check=True, capture_output=True)
    return find_tensorrt_include(), find_cuda_include()


@pytest.fixture(scope="session")
def rtx():
    """The environment of a process that runs TensorRT-RTX 1.7.1 (pinned wheels, fetched and
    cached by scripts/fetch_tensorrt_rtx.py): PYTHONPATH and LD_LIBRARY_PATH."""
    import re
    import subprocess

    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "fetch_tensorrt_rtx.py")],
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr
    found = dict(re.findall(r"^(TENSORRT_RTX_\w+)=(.+)$", proc.stdout, re.M))
    return {"PYTHONPATH": found["TENSORRT_RTX_SITE"], "LD_LIBRARY_PATH": found["TENSORRT_RTX_LIB"]}


_MODEL_IRS: dict = {}


def model_ir(path: Path):
    """The compiled IR of a corpus/example model file (arch 90, its example inputs and dynamic
    shapes), compiled once per test session and shared by every test file that asks for it."""
    path = Path(path)
    if path not in _MODEL_IRS:
        import kernel_lens as kl

        module = load_module(path)
        inputs = tuple(t.clone() for t in module.example_inputs)
        _MODEL_IRS[path] = kl.compile(module.model, inputs,
                                      dynamic_shapes=getattr(module, "dynamic_shapes", None),
                                      arch=90, roles=getattr(module, "roles", None)).ir
    return _MODEL_IRS[path]


def reseal_manifest(folder: Path) -> None:
    """Record a folder's artifacts, as they are now, in a new manifest: a test that edits an
    artifact on purpose reaches the checks past load's sha256 check (which refuses any edit)."""
    from kernel_lens.artifact_folder import MANIFEST, write_manifest  # after the cache env is set

    manifest = json.loads((Path(folder) / MANIFEST).read_text())
    write_manifest(Path(folder), manifest["name"], {k: Path(v) for k, v in manifest["artifacts"].items()})


# What ONNX Runtime's CPU EP says once it has loaded and resolved a kernel_lens graph with the
# custom-op library registered: it knows the kernel_lens ops (the library registered them) and
# lacks only a CPU implementation for them (they run on the CUDA EP). A graph that calls an op or
# function ORT does not know fails earlier, with "... is not a registered function/op".
ORT_LOADED_ONLY_LAUNCHES_LACK_CPU = (r"NOT_IMPLEMENTED.*(Could not find an implementation|"
                                     r"Failed to find kernel) for")


def assert_loads_in_ort(model_path: Path, library: Path) -> None:
    """An ONNX Runtime CPU session over ``model_path`` with ``library`` registered gets past
    loading and graph resolution (every op and function the graph calls is known to ORT)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.register_custom_ops_library(str(library))
    with pytest.raises(Exception, match=ORT_LOADED_ONLY_LAUNCHES_LACK_CPU):
        ort.InferenceSession(str(model_path), so, providers=["CPUExecutionProvider"])


def with_reference_kernels(ir, model, impls: dict):
    """Attach a model-local ONNX function per kernel: ``impls[kernel name](read, write)`` returns
    nodes reading ``read[param]`` (a function input) and producing ``write[param]`` (an output)."""
    import onnx
    from onnx import helper

    from kernel_lens.codegen.launch_io import launch_io, root_of
    from kernel_lens.onnx import DOMAIN

    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next(o.version for o in model.opset_import if o.domain == "")
    done = set()
    for graph, launch in [(g, launch) for g in ir.graphs() for launch in g.launches]:
        if launch.kernel in done:
            continue
        done.add(launch.kernel)
        io = launch_io(graph, launch, f"__{launch.order}")
        read, write = {}, {}
        for arg in launch.args:
            if arg.value is None or arg.name not in io.bindings:
                continue
            root = root_of(graph, arg.value)
            if root in io.inputs:
                read[arg.name] = f"in{io.inputs.index(root)}"
            kind, index = io.bindings[arg.name]
            if kind == "out":
                write[arg.name] = f"out{index}"
        nodes = impls[graph.kernels[launch.kernel].name](read, write)
        model.functions.append(helper.make_function(
            DOMAIN, launch.kernel, [f"in{i}" for i in range(len(io.inputs))],
            [f"out{i}" for i in range(len(io.outputs))], nodes,
            [helper.make_opsetid("", opset)], attributes=["launch"]))
    return model


def eager_on_cpu(model, inputs):
    """The model run eagerly on CPU tensors, its Triton launches through Triton's interpreter
    (as capture runs them): the reference a CPU evaluation of the compiled model is held to."""
    from kernel_lens.frontends.capture.recorder import capture

    return capture(model, tuple(t.clone() if hasattr(t, "clone") else t for t in inputs), 90, launches_needed=False).outputs


CPU_BUDGET = 8192  # input elements: the largest end of a range the fast set evaluates


def evaluated_against_eager(module, compiled_model, budget: int = CPU_BUDGET) -> list[dict]:
    """The compiled model evaluated on the CPU (its graph by ONNX's reference evaluator, each
    launch by Triton's interpreter) against the model run eagerly through the interpreter, at the
    example's sizes and at both ends of every piece (of the declared range when unsplit), each end
    within ``budget`` input elements; returns the sizes checked. Sizes at which eager itself fails
    on the resized example data (an index out of range) are skipped; the example never is."""
    import torch

    from kernel_lens.errors import KernelLensError
    from kernel_lens.frontends.capture.recorder import capture
    from kernel_lens.frontends.lift import input_names
    from kernel_lens.verify import cpu_points, cpu_tolerance, inputs_at

    ir = compiled_model.ir
    names = input_names(module.model, len(module.example_inputs))
    example = {s: info.example for s, info in ir.symbols.items()}
    checked = []
    for sizes in cpu_points(ir, module.example_inputs, module.dynamic_shapes, budget):
        inputs = inputs_at(ir, module.example_inputs, module.dynamic_shapes, names, sizes)
        eager_inputs = [t.clone() for t in inputs]  # written in place by some models:
        try:                                         # compared after the call too
            want = flatten(capture(module.model, tuple(eager_inputs), 90).outputs) + eager_inputs
        except KernelLensError:
            if sizes == example:
                raise
            continue
        compiled_inputs = [t.clone() for t in inputs]
        got = flatten(compiled_model.run(*compiled_inputs)) + compiled_inputs
        assert len(got) == len(want), sizes
        for i, (g, w) in enumerate(zip(got, want)):
            assert g.dtype == w.dtype and g.shape == w.shape, (sizes, i)
            rtol, atol = cpu_tolerance(w.dtype)
            torch.testing.assert_close(g.float() if g.dtype.itemsize == 1 else g,
                                       w.float() if w.dtype.itemsize == 1 else w, rtol=rtol,
                                       atol=atol, equal_nan=True, msg=lambda m: f"{sizes} output {i}: {m}")
        checked.append(sizes)
    return checked
