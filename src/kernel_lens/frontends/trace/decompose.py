"""Decompose the ATen ops the ONNX lowering cannot translate, as ``torch.onnx.export`` does.

torch's exporter runs torch's decompositions for every op its translation library (onnxscript's
torchlib) has no function for, before translating. kernel_lens does the same while lifting the
traced program: such a node is re-traced through its decomposition (the op's
CompositeImplicitAutograd kernel or torch's decomposition table) on the program's own fake
tensors, so sizes stay symbolic in the program's symbols, and the resulting ops replace it in
the IR. ``aten.diff`` becomes slices and a subtraction, ``aten.__and__`` ``bitwise_and``,
``aten.outer`` a broadcast multiply, and so on. Views, in-place ops and allocations are left to
kernel_lens's memory model.

Which ops the back end translates is the back end's knowledge: the driver hands it in as a
predicate (``translatable``, the ONNX lowering's ``supported``); the front end imports no back end.
"""

from __future__ import annotations

import contextlib
import logging
from functools import lru_cache
from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions
from torch._guards import detect_fake_mode
from torch.fx.experimental.proxy_tensor import make_fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from ... import aten_facts

log = logging.getLogger(__name__)


def needs_decomposition(target: Any, translatable: Callable[[str], bool]) -> bool:
    """An ATen op the back end cannot translate (``translatable`` says which it can), which
    torch can decompose."""
    if not isinstance(target, torch._ops.OpOverload):
        return False
    name = str(target).removeprefix("torch.ops.")
    if not name.startswith("aten.") or aten_facts.allocates_uninitialized(name) \
            or aten_facts.is_inplace(name):
        return False
    if translatable(name):
        return False
    return _decomposition(target) is not None


def _decomposition(target: Any) -> Any:
    if torch._C._dispatch_has_kernel_for_dispatch_key(target.name(), "CompositeImplicitAutograd"):
        return target  # tracing below the autograd key runs its composite kernel
    return _table().get(target)


@lru_cache(maxsize=1)
def _table() -> Any:
    return core_aten_decompositions()


def decompose(node: torch.fx.Node) -> torch.fx.GraphModule | None:
    """``node``'s op re-traced through its decomposition on the node's own fake tensors: a graph
    whose placeholders are the node's tensor arguments (in :func:`tensor_args` order). None when
    the decomposition cannot be traced (the lowering then reports the op)."""
    fn = _decomposition(node.target)
    flat, spec = tree_flatten((node.args, node.kwargs))
    positions = [i for i, a in enumerate(flat)
                 if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]
    consts = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in flat]
    vals = [consts[i] for i in positions]

    def run(*tensors: Any) -> Any:
        args = list(consts)
        for i, t in zip(positions, tensors):
            args[i] = t
        a, k = tree_unflatten(args, spec)
        return node.target(*a, **k)

    table = {} if fn is node.target else {node.target: fn}
    fake_mode = detect_fake_mode(vals)
    try:
        with fake_mode if fake_mode is not None else contextlib.nullcontext():
            return make_fx(run, decomposition_table=table, tracing_mode="real")(*vals)
    except Exception as exc:  # noqa: BLE001 - any failure leaves the op for the lowering to name
        log.debug("decomposing %s failed: %s", node.target, exc)
        return None


def tensor_args(node: torch.fx.Node) -> list[torch.fx.Node]:
    """The node's tensor arguments, in the order :func:`decompose`'s placeholders take them."""
    flat, _ = tree_flatten((node.args, node.kwargs))
    return [a for a in flat
            if isinstance(a, torch.fx.Node) and isinstance(a.meta.get("val"), torch.Tensor)]

