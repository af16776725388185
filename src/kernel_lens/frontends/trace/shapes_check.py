"""``dynamic_shapes`` checked against the forward's signature and the example inputs before any
work starts (a wrong key, a wrong length or an example outside its Dim's range would otherwise
surface from torch.export after the capture, in torch's words).

Checked: a dict's keys are the forward's parameter names; a tuple/list has one entry per example
input; a tensor's spec names dims it has; each example size lies inside its ``Dim``'s
``[min, max]``. What torch.export decides itself (Dim relations, derived Dims, hints such as
``Dim.AUTO``) is left to it.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

import torch
from torch.export.dynamic_shapes import Dim, _DerivedDim

from ...errors import InputError

_FIX = "see torch.export's dynamic_shapes: {name: {dim index: Dim(...)}} or one entry per input"


def _parameters(model: Callable) -> tuple[list[str], int] | None:
    """The forward's parameter names (``*args`` included: dynamic_shapes may name it) and how
    many of them take one example input each (those before ``*args``); None when they cannot be
    read or it takes ``**kwargs``."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    single = next((i for i, p in enumerate(params) if p.kind is p.VAR_POSITIONAL), len(params))
    return [p.name for p in params], single


def _is_dim(spec: Any) -> bool:
    """A plain ``torch.export.Dim`` (a derived one, ``2 * n``, is torch.export's to check)."""
    return type(spec) is torch.export.Dim


def _check_tensor(name: str, tensor: torch.Tensor, spec: Any) -> None:
    if spec is None:
        return
    if isinstance(spec, dict):
        items = list(spec.items())
    elif isinstance(spec, (tuple, list)):
        if len(spec) != tensor.dim():
            raise InputError(f"dynamic_shapes[{name!r}] has {len(spec)} entries but the example "
                             f"input has {tensor.dim()} dims (shape {tuple(tensor.shape)}); give one "
                             f"entry (None or a Dim) per dim, or a dict {{dim index: Dim}}")
        items = list(enumerate(spec))
    else:
        return  # a hint (Dim.AUTO, ...) or something torch.export explains itself
    for dim, dspec in items:
        if not isinstance(dim, int) or not -tensor.dim() <= dim < tensor.dim():
            raise InputError(f"dynamic_shapes[{name!r}] names dim {dim!r}, but the example input "
                             f"has {tensor.dim()} dims (shape {tuple(tensor.shape)}); use a dim "
                             f"index from 0 to {tensor.dim() - 1}")
        if not _is_dim(dspec):
            continue
        size = int(tensor.shape[dim])
        lo, hi = dspec.min, dspec.max  # hi may be torch's int_oo (unbounded)
        if not lo <= size <= hi:
            raise InputError(
                f"example input {name!r} has size {size} along dim {dim}, outside its Dim "
                f"{dspec.__name__!r} = [{lo}, {hi}]; use an example inside the range (the capture "
                f"runs it), or declare the Dim as torch.export.Dim({dspec.__name__!r}, "
                f"min={min(lo, size)}, max={size if size > hi else hi})")


def check_forward_takes(model: Callable, example_inputs: tuple, where: str = "") -> None:
    """:class:`InputError` naming the forward's parameter that ``example_inputs`` leave without a
    value (or the count it cannot take), before anything runs; ``where``: the forward's file:line."""
    fn = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(*example_inputs)
    except TypeError as exc:
        params = [p for p in signature.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        missing = [p.name for p in params[len(example_inputs):] if p.default is p.empty]
        at = f" ({where})" if where else ""
        if missing:
            raise InputError(f"example_inputs give {len(example_inputs)} input(s) but forward{signature}{at} "
                             f"also needs {', '.join(repr(m) for m in missing)}: add an example tensor for "
                             f"each (model files: example_inputs = (...))") from None
        raise InputError(f"example_inputs give {len(example_inputs)} input(s); forward{signature}{at} "
                         f"cannot take them ({exc})") from None


def check_dynamic_shapes(model: Callable, example_inputs: tuple, dynamic_shapes: Any) -> None:
    """:class:`InputError` naming the culprit and the fix for a ``dynamic_shapes`` that cannot
    fit ``model``'s forward and ``example_inputs``; None when nothing cheap is wrong."""
    if dynamic_shapes is None:
        return
    found = _parameters(model)
    names, single = found if found is not None else (None, 0)
    if isinstance(dynamic_shapes, dict):
        if names is None:
            return
        unknown = [k for k in dynamic_shapes if k not in names]
        if unknown:
            raise InputError(f"dynamic_shapes names {unknown[0]!r}, which forward does not take; "
                             f"its parameters: {', '.join(names) or 'none'} ({_FIX})")
        pairs = [(k, example_inputs[names.index(k)]) for k in dynamic_shapes
                 if names.index(k) < min(single, len(example_inputs))]
        specs = [dynamic_shapes[k] for k, _ in pairs]
    elif isinstance(dynamic_shapes, (tuple, list)):
        if names is not None and single < len(names):
            return  # *args: torch.export matches the entries to it
        if len(dynamic_shapes) != len(example_inputs):
            raise InputError(f"dynamic_shapes has {len(dynamic_shapes)} entries but there are "
                             f"{len(example_inputs)} example inputs; give one entry per input "
                             f"(None for a static one), or a dict by parameter name")
        labels = names if names is not None and len(names) >= len(example_inputs) \
            else [f"input {i}" for i in range(len(example_inputs))]
        pairs = list(zip(labels, example_inputs))
        specs = list(dynamic_shapes)
    else:
        raise InputError(f"dynamic_shapes must be a dict by parameter name or a tuple with one "
                         f"entry per input, got {type(dynamic_shapes).__name__} ({_FIX})")
    for (name, tensor), spec in zip(pairs, specs):
        if isinstance(tensor, torch.Tensor):
            _check_tensor(name, tensor, spec)


def one_dim_per_name(dynamic_shapes: Any) -> Any:
    """``dynamic_shapes`` with every ``Dim`` of a name replaced by the first one of that name
    (torch.export takes Dims of one name for one size; kernel_lens's size pieces follow each Dim
    object, and two objects of one name would be split as two sizes). Dims of one name with
    other ranges are refused, naming both."""
    first: dict[str, Any] = {}

    def same(entry: Any) -> Any:
        if isinstance(entry, dict):
            return {k: same(v) for k, v in entry.items()}
        if isinstance(entry, (tuple, list)):
            return type(entry)(same(v) for v in entry)
        if isinstance(entry, _DerivedDim):
            root = same(entry.root)
            return entry if root is entry.root else _DerivedDim(entry.__name__, root, entry.fn)
        if isinstance(entry, Dim) and type(entry).__name__ != "_StaticDim":
            kept = first.setdefault(entry.__name__, entry)
            if (kept.min, kept.max) != (entry.min, entry.max):
                raise InputError(f"dynamic_shapes has two Dims named {entry.__name__!r}, with ranges "
                                 f"[{kept.min}, {kept.max}] and [{entry.min}, {entry.max}]; one name "
                                 f"is one size: give them one range (one Dim object) or other names")
            return kept
        return entry
    return same(dynamic_shapes)

