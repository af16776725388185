"""A TensorRT optimization profile from the IR: (min, opt, max) of every graph input dim.

Computed from the IR's symbol ranges alone, so the runner that builds an engine (``runtime``)
and the serving export need no target to get it.
"""

from __future__ import annotations

from ..errors import KernelLensError
from ..ir import GraphIR, evaluate, parse


def optimization_profile(ir: GraphIR) -> dict[str, list[tuple[int, int, int]]]:
    """(min, opt, max) of every dim of every graph input, from the IR's symbol ranges, with the
    captured (example) sizes as ``opt``: what a TensorRT optimization profile needs. A symbol
    without an upper bound is refused (TensorRT needs one: declare ``Dim(..., max=...)``)."""
    names = list(ir.symbols)
    points = {}
    for which, attr in (("min", "min"), ("opt", "example"), ("max", "max")):
        values = {}
        for n, info in ir.symbols.items():
            value = getattr(info, attr)
            if value is None:
                raise KernelLensError(f"{ir.name}: dimension {n} has no upper bound; a TensorRT "
                                      f"optimization profile needs one: declare Dim({n!r}, max=...)")
            values[n] = value
        points[which] = values
    profile = {}
    for name in ir.inputs:
        dims = []
        for text in ir.values[name].shape:
            expr = parse(text, names)
            lo, opt, hi = (evaluate(expr, points[w]) for w in ("min", "opt", "max"))
            if not lo <= opt <= hi:
                raise KernelLensError(f"{ir.name}: input {name} dim {text} is not increasing over the "
                                      f"symbol ranges ({lo}, {opt}, {hi}); no TensorRT profile fits it")
            dims.append((lo, opt, hi))
        profile[name] = dims
    return profile
