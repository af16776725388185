"""Real TensorRT engines on a host without a GPU: TensorRT-RTX 1.7.1 (NVIDIA's TensorRT for RTX
GPUs, same builder API; pinned PyPI wheels fetched and cached by scripts/fetch_tensorrt_rtx.py)
loads kernel_lens's IPluginV3 library into its plugin registry, parses kernel_lens's ONNX for
every corpus model and example (its kernel nodes become plugin layers) and builds a serialized
engine with an optimization profile from the IR's symbol ranges. The IPluginV2DynamicExt
library registers one creator per kernel and create -> serialize -> deserialize round-trips
through TensorRT-RTX's registry (TensorRT-RTX builds no V2 plugin into a network).
Engine execution needs an RTX GPU; none is available here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernel_lens.codegen.plan import build_plan
from kernel_lens.onnx.lower import save_onnx
from kernel_lens.codegen.profile import optimization_profile
from kernel_lens.targets.trt.target import plugin_names, trt_onnx, trt_sources
from kernel_lens.toolchain.build import build_shared_library

from test_trt_plugins import MODELS, TRT_TYPES, _ir

ROOT = Path(__file__).resolve().parents[1]


def _run(jobs, rtx, folder):
    path = folder / "jobs.json"
    path.write_text(json.dumps(jobs))
    env = {**os.environ, **rtx}
    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "trt" / "rtx_build.py"), str(path)],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {r["stem"]: r for r in map(json.loads, proc.stdout.splitlines())}


SHARDS = 2  # the models in halves: with `--dist load` (the long set in .ci/run) two workers build


@pytest.fixture(scope="module", params=range(SHARDS), ids=lambda k: f"shard{k}")
def built(request, tmp_path_factory, trt_headers):
    folder = tmp_path_factory.mktemp("rtx")
    trt, cuda = trt_headers
    out = {}
    for stem in sorted(MODELS)[request.param::SHARDS]:
        ir = _ir(stem)
        plan = build_plan(ir)
        if not {v.dtype for p in plan.launches for v in [*p.inputs, *p.outputs]} <= set(TRT_TYPES):
            continue  # refused with a clear error: tests/test_trt_plugins.py
        onnx_path = save_onnx(trt_onnx(ir), folder / f"{stem}.onnx")
        # the session's build cache: test_trt_plugins.py builds the same libraries
        libs = {kind: build_shared_library(f"kl_{stem}_trt_{kind}", trt_sources(ir, kind, plan),
                                           include_dirs=[trt, cuda])
                for kind in ("v3", "v2")}
        out[stem] = (ir, plan, onnx_path, libs)
    assert len(out) >= 20 // SHARDS
    return folder, out


def test_tensorrt_rtx_builds_an_engine_for_every_model(rtx, built):
    folder, models = built
    jobs = [{"stem": stem, "kind": "v3", "library": str(libs["v3"]), "onnx": str(onnx_path),
             "prefix": f"kl_{ir.name}_", "profile": optimization_profile(ir)}
            for stem, (ir, plan, onnx_path, libs) in models.items()]
    results = _run(jobs, rtx, folder)
    for stem, (ir, plan, _, _) in models.items():
        r = results[stem]
        assert "exception" not in r, (stem, r)
        assert set(plugin_names(ir, plan).values()) <= set(r["creators"]), (stem, r)
        assert r["parsed"] and not r["parse_errors"], (stem, r)
        assert r["plugin_layers"] == len(plan.launches), (stem, r)
        assert r["engine_bytes"] > 0, (stem, r)


def test_v2_plugins_round_trip_through_the_registry(rtx, built):
    folder, models = built
    jobs = []
    for stem, (ir, plan, _, libs) in models.items():
        names = plugin_names(ir, plan)
        jobs.append({"stem": stem, "kind": "v2", "library": str(libs["v2"]), "prefix": f"kl_{ir.name}_",
                     "plugins": [[names[p.kernel], p.index] for p in plan.launches]})
    results = _run(jobs, rtx, folder)
    for stem, (ir, plan, _, _) in models.items():
        r = results[stem]
        assert "exception" not in r, (stem, r)
        assert set(plugin_names(ir, plan).values()) <= set(r["creators"])
        assert len(r["round_trips"]) == len(plan.launches)
        for (name, ptype, again, blob, blob2), launch in zip(r["round_trips"], plan.launches):
            assert ptype == again == name
            assert blob == blob2 == launch.index.to_bytes(4, "little").hex()


def test_profile_comes_from_the_symbol_ranges():
    ir = _ir("toy_two_kernels")
    info = ir.symbols["n"]
    assert optimization_profile(ir) == {"x": [(info.min, info.example, info.max)],
                                       "y": [(info.min, info.example, info.max)]}
    unbounded = ir.model_copy(deep=True)
    unbounded.symbols["n"].max = None
    with pytest.raises(Exception, match="has no upper bound.*Dim\\('n', max=...\\)"):
        optimization_profile(unbounded)
