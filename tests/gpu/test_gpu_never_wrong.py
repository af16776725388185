"""GPU host only (issue 38): the models that compiled silently wrong before (a value computed from a
size inside a piece, a size-1 path, a kernel writing part of a buffer torch filled), the partial
write patterns, and the CPU suite's generated models, each compiled natively for the ORT target
and run through the CUDA op at every size tried, bit for bit against the model run eagerly."""

from __future__ import annotations

import copy
import os
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import kernel_lens as kl
from kernel_lens.errors import KernelLensError

from conftest import ROOT, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

never_wrong = load_module(ROOT / "tests" / "models" / "never_wrong.py")
GPU_EXAMPLES = int(os.environ.get("KL_DIFFERENTIAL_EXAMPLES", "40"))


def _x(rows: int) -> torch.Tensor:
    return torch.randn(rows, never_wrong.COLS, generator=torch.Generator().manual_seed(rows)).cuda()


@pytest.mark.parametrize("name", sorted(never_wrong.CASES))
def test_each_case_equals_eager_on_the_gpu_at_every_size_tried(name):
    model, inputs, dims = never_wrong.CASES[name]
    model = copy.deepcopy(model).cuda()
    compiled = kl.compile(model, tuple(t.cuda() for t in inputs), dynamic_shapes=dims,
                          targets=["ort"])
    (symbol, info), = compiled.ir.symbols.items()
    scale = 2 if name == "strided_view_write" else 1
    tried = never_wrong.sizes_to_try(info.min, info.max)
    for size in tried:
        x = _x(size * scale)
        want = model(x.clone())
        got = compiled.run(x.clone())
        torch.cuda.synchronize()
        assert torch.equal(got, want), (name, size, (got - want).abs().max().item())
    print(f"never_wrong {name}: bit-exact at {symbol} in {tried} "
          f"({len(compiled.ir.pieces) or 1} pieces)")


@settings(max_examples=GPU_EXAMPLES, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.randoms(use_true_random=False))
def test_generated_models_equal_eager_on_the_gpu(r):
    model = never_wrong.Program(r.choice(sorted(never_wrong.SIZE_FUNCTIONS)), r.randint(1, 9),
                                tuple(r.choice([0.5, 1.0, 2.0, 3.0, 0.25]) for _ in range(r.randint(2, 5))),
                                r.random() < 0.5, r.random() < 0.5, r.choice(never_wrong.BUFFERS),
                                r.random() < 0.5)
    lo, hi = r.choice([1, 2]), r.choice([9, 17, 40])
    example = r.randint(max(lo, 2), hi)
    dims = {"x": {0: torch.export.Dim("rows", min=lo, max=hi)}}
    try:
        compiled = kl.compile(model, (_x(example),), dynamic_shapes=dims, targets=["ort"])
    except KernelLensError as exc:
        print(f"refused: {model}: {str(exc).splitlines()[0][:160]}")
        return
    boxes = [p.when[0].ranges["rows"] for p in compiled.ir.pieces] or [(lo, hi)]
    sizes = sorted({s for a, b in boxes for s in (a, b, random.Random(a).randint(a, b))})
    for rows in sizes:
        x = _x(rows)
        want = model(x.clone())
        got = compiled.run(x.clone())
        torch.cuda.synchronize()
        assert torch.equal(got, want), (model, rows, (got - want).abs().max().item())
    print(f"checked on the GPU: {model} at rows={sizes} over {len(boxes)} pieces")
