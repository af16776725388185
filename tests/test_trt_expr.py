"""codegen.trt_expr: IR expressions printed as TensorRT IExprBuilder calls, compiled against the
real TensorRT 10.14 headers with an evaluating IExprBuilder of the test's own (TensorRT's
classes are pImpl wrappers: the test implements apiv::VExprBuilder / VDimensionExpr) and
compared with sympy's exact value at many points (tests/trt/eval_builder.h)."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest
import sympy

from kernel_lens.codegen.trt_expr import to_trt
from kernel_lens.errors import SymbolicError
from kernel_lens.ir import parse
from kernel_lens.toolchain import compilers

NAMES = ["s0", "s1", "s2"]
TRT_TESTS = Path(__file__).parent / "trt"  # eval_builder.h: an IExprBuilder that evaluates
EXPRESSIONS = [
    "s0", "7", "s0 + s1", "s0 - s1 + 3", "2*s0*s1 - 5", "s0**3", "ceiling(s0/1024)",
    "floor(s0/16)", "floor((s0 + 1)/2)", "ceiling(s0/3 + 1/2)", "Mod(s0, 16)", "Max(s0, s1, 4)",
    "Min(s0, 2*s1)", "s0*ceiling(s1/64) + floor(s2/7)", "floor(s0/s1)", "ceiling(s0*s1/s2)",
    "-s0 + 2*s1 + 100", "256*ceiling(12*s0*ceiling(s1/128)/256)",
]

HARNESS = r"""
#include <cstdio>
#include <cstdlib>

#include "eval_builder.h"

using namespace nvinfer1;

int main(int argc, char** argv) {
  kl_test::ExprBuilder exprBuilder;
  for (int i = 1; i + 2 < argc; i += 3) {
    IDimensionExpr const* s0 = exprBuilder.constant(std::atoll(argv[i]));
    IDimensionExpr const* s1 = exprBuilder.constant(std::atoll(argv[i + 1]));
    IDimensionExpr const* s2 = exprBuilder.constant(std::atoll(argv[i + 2]));
    (void)s0; (void)s1; (void)s2;
%(lines)s
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def harness(tmp_path_factory, trt_headers):
    trt, cuda = trt_headers
    symbols = {sympy.Symbol(n, integer=True, nonnegative=True): n for n in NAMES}
    lines = "\n".join(f'    std::printf("%lld\\n", static_cast<long long>(({to_trt(parse(e, NAMES), symbols)})->getConstantValue()));'
                      for e in EXPRESSIONS)
    folder = tmp_path_factory.mktemp("trt_expr")
    (folder / "h.cpp").write_text(HARNESS.replace("%(lines)s", lines))
    exe = folder / "h"
    subprocess.run([compilers.find_cxx(), "-std=c++17", "-Wall", "-Wextra", "-Werror", "-O1",
                    "-isystem", str(trt), "-isystem", str(cuda), f"-I{TRT_TESTS}", str(folder / "h.cpp"), "-o", str(exe)],
                   check=True, capture_output=True, text=True)
    return exe


def test_printed_expressions_evaluate_exactly_in_cxx(harness):
    rng = random.Random(0)
    points = [(rng.randint(1, 5000), rng.randint(1, 300), rng.randint(1, 90)) for _ in range(40)]
    points += [(1, 1, 1), (1024, 64, 7), (1025, 65, 8)]
    argv = [str(v) for p in points for v in p]
    out = subprocess.run([str(harness), *argv], check=True, capture_output=True, text=True).stdout.split()
    got = iter(int(v) for v in out)
    for p in points:
        values = dict(zip(NAMES, p))
        for e in EXPRESSIONS:
            want = parse(e, NAMES).subs({sympy.Symbol(n, integer=True, nonnegative=True): v
                                          for n, v in values.items()})
            assert next(got) == int(want), (e, values)


@pytest.mark.parametrize("text, reason", [("s0/2", "rational coefficient"),
                                          ("s0**(-1)", "rational coefficient|not a positive integer"),
                                          ("s3 + 1", "no TensorRT dimension expression")])
def test_inexpressible_is_refused_with_the_expression(text, reason):
    names = NAMES + ["s3"]
    symbols = {sympy.Symbol(n, integer=True, nonnegative=True): n for n in NAMES}
    with pytest.raises(SymbolicError, match=reason) as exc:
        to_trt(parse(text, names), symbols)
    assert "cannot express" in str(exc.value)


@pytest.mark.parametrize("scale,offset,want", [(1, 0, "inputs[1].d[2]"), (2, 0, "kFLOOR_DIV"), (1, 3, "kSUB"),
                                               (3, 1, "kFLOOR_DIV")])
def test_a_symbol_read_from_a_scaled_or_shifted_dim_is_divided_and_shifted_back(scale, offset, want):
    """n read from a dim 2n (scale 2) or n + 3 (offset 3): TensorRT's expression undoes both."""
    from kernel_lens.codegen.plan import ModelPlan, SymbolRead
    from kernel_lens.targets.trt.target import _printers

    plan = ModelPlan.model_construct(symbols=["n"])
    printed = _printers(plan)["trt_read"](SymbolRead(name="n", input=1, dim=2, scale=scale, offset=offset, min=1, max=None))
    assert want in printed and "inputs[1].d[2]" in printed
    if scale == 1 and offset == 0:
        assert printed == "inputs[1].d[2]"
