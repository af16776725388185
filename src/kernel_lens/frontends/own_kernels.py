"""``optimize=2``: kernel_lens's own skinny GEMM (:func:`kernel_lens.kernels.skinny_gemm.linear`)
in place of ``F.linear`` (every ``nn.Linear``) where the rows are few (issue 41).

The substitution is made while the forward runs, in the capture and in the trace alike, so the
own kernel's launches are captured, traced and AOT-compiled like the user's (the IR holds them
as ordinary launches; their configs are their constexprs). A call is taken when, for the size
the example has, x and the weight are fp16 or bf16 on one device, the weight is 2-D, x has at
least two dims and 1 <= rows <= 16 (rows: all of x's dims but the last, multiplied), and the
target arch has the tensor cores it needs (sm_80 or newer). In the trace the rows may be a
size expression: where its range is inside 1..16 the call is taken as is; where the range is
wider and the rows are one size, ``1 <= rows <= 16`` is a Python branch on a size, so the range
is split into pieces (:mod:`.trace.size_pieces`) and only the small-rows piece gets the own
kernel. A call the trace cannot take as the capture took it (rows from several sizes over a
range wider than 16, or from tensor values) is left to ``F.linear`` in both, and the forward is
captured again. The user's Triton launches are never changed.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any, Iterator

import torch
import torch.nn.functional as F

from ..kernels.skinny_gemm import MAX_ROWS, linear as own_linear
from .capture.patching import patched

log = logging.getLogger(__name__)

NAME = "own_skinny_gemm"  # the graph-pass name (kernel_lens.onnx.graph_passes.FRONT_END)
_DTYPES = (torch.float16, torch.bfloat16)


class OwnLinear:
    """``F.linear`` replaced while :meth:`active`; call sites are counted in call order."""

    def __init__(self, arch: int):
        self.arch = arch
        self.excluded: set[int] = set()  # sites left to F.linear (the trace could not take them)
        self.taken: dict[int, bool] = {}  # the capture's decision per site
        self.mismatched: set[int] = set()  # sites the trace decided otherwise
        self._tracing = False
        self._site = 0

    @contextlib.contextmanager
    def active(self, model: Any, tracing: bool) -> Iterator["OwnLinear"]:
        """``F.linear`` replaced; sites are counted from 0 in each call of ``model``'s forward
        (torch.export may run it more than once)."""
        if not isinstance(model, torch.nn.Module) or "forward" in model.__dict__:
            log.info("optimize=2: %s is not a torch.nn.Module with its class's forward; "
                     "F.linear is left as it is", type(model).__name__)
            yield self
            return
        self._tracing = tracing
        if tracing:
            self.mismatched = set()
        forward = model.forward

        @functools.wraps(forward)  # the forward's signature, which torch.export reads
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._site = 0
            return forward(*args, **kwargs)

        model.forward = counted
        try:
            with patched(F, "linear", self._linear(F.linear)):
                yield self
        finally:
            del model.forward

    def _linear(self, original: Any) -> Any:
        def linear(input: Any, weight: Any, bias: Any = None) -> Any:  # F.linear's names
            x = input
            site, self._site = self._site, self._site + 1
            if self._tracing:  # only what the capture took, where the trace can take it too
                take = self.taken.get(site, False) and self._fits(x, weight, bias) \
                    and self._rows_take(x, site)
                if take != self.taken.get(site, False):
                    self.mismatched.add(site)
            else:
                take = site not in self.excluded and self._fits(x, weight, bias) and _rows_fit(x)
                self.taken[site] = take
            return own_linear(x, weight, bias) if take else original(x, weight, bias)
        return linear

    def _fits(self, x: Any, weight: Any, bias: Any) -> bool:
        """What does not depend on the rows: dtypes, devices, dims, the arch."""
        if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)) or self.arch < 80:
            return False
        if x.dtype not in _DTYPES or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 2:
            return False
        if not all(isinstance(d, int) for d in weight.shape) or x.device != weight.device:
            return False
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != x.dtype
                                 or tuple(bias.shape) != (weight.shape[0],)
                                 or bias.device != x.device):  # a broadcast bias is MatMul's
            return False
        return isinstance(x.shape[-1], int) and x.shape[-1] == weight.shape[1]

    @staticmethod
    def _rows_take(x: torch.Tensor, site: int) -> bool:
        """The trace's decision for symbolic rows (see the module docstring)."""
        rows = _rows(x)
        if isinstance(rows, int):
            return 1 <= rows <= MAX_ROWS
        node = rows.node
        hint = node.hint
        if hint is None or not 1 <= hint <= MAX_ROWS:
            return False
        expr = node.expr
        bound = node.shape_env.bound_sympy(expr)
        if bound.lower >= 1 and bound.upper <= MAX_ROWS:
            return True
        dims = [d for d in x.shape[:-1] if not isinstance(d, int)]
        if len({d.node.expr for d in dims}) != 1 or not dims[0].node.expr.is_Symbol:
            log.info("optimize=2: F.linear call %d keeps ONNX MatMul: its rows %s range over "
                     "%s..%s, and are not one size times constants", site, expr, bound.lower,
                     bound.upper)
            return False
        # rows = c * s**p grows with s: the small-rows piece is s <= top (an integer bound for
        # torch: a guard like 3*s <= 16 would make it solve for s <= 16/3)
        size, top = dims[0].node.expr, 0
        while top < MAX_ROWS and int(expr.subs(size, top + 1)) <= MAX_ROWS:
            top += 1
        return bool(dims[0] >= 1) and bool(dims[0] <= top)  # a size branch: the range is split


def _rows(x: torch.Tensor) -> Any:
    rows = 1
    for d in x.shape[:-1]:
        rows = rows * d
    return rows


def _rows_fit(x: torch.Tensor) -> bool:
    return 1 <= _rows(x) <= MAX_ROWS
