"""What kernel_lens needs to know about ATen ops, read from torch's own op schemas.

One place for the facts the front end, the ONNX lowering, launch wiring and the specialization
pass rely on. Where torch states a fact (alias annotations on the schema: ``Tensor(a)`` views,
``Tensor(a!)`` in-place writes), it is read from the schema; the IR names ops by overload
(``'aten.add_.Tensor'``), resolved here to ``torch.ops.aten.add_.Tensor``.

Whether a view-or-copy op (``reshape``, ``contiguous``, ``to``) copied is not a schema fact: the
front end records it per use in ``TorchOp.aliases`` (storage identity while tracing), and
consumers read that, never a list of op names.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

# Ops whose result has undefined contents (torch does not state it; these are the ATen
# allocators): a kernel that writes such a buffer fully produces it.
_UNINITIALIZED = frozenset({"empty", "empty_like", "empty_strided", "empty_permuted",
                            "new_empty", "new_empty_strided"})

# Copies that an ONNX lowering may express as a no-op on the input (Identity, Reshape, Cast to
# the same type...), so the "fresh" result may share the input's (possibly misaligned) buffer.
_MAY_FORWARD_INPUT = frozenset({"clone", "contiguous", "alias", "detach", "lift_fresh_copy",
                                "_to_copy", "to", "type_as", "dropout", "reshape", "flatten",
                                "view_as", "reshape_as", "unflatten"})


@lru_cache(maxsize=None)
def overload(name: str) -> Any:
    """``'aten.add.Tensor'`` -> ``torch.ops.aten.add.Tensor`` (None when torch has no such op)."""
    import torch  # lazy: passes and codegen import this module without torch

    parts = name.split(".")
    if len(parts) != 3:
        return None
    namespace, packet, variant = parts
    try:
        return getattr(getattr(getattr(torch.ops, namespace), packet), variant)
    except (AttributeError, RuntimeError):
        return None


def _packet(name: str) -> str:
    parts = name.split(".")
    return parts[1] if len(parts) >= 3 else parts[-1]


@lru_cache(maxsize=None)
def is_inplace(name: str) -> bool:
    """The op writes its first argument and returns it (schema ``Tensor(a!) self -> Tensor(a!)``)."""
    op = overload(name)
    if op is None:  # unknown to this torch: ATen's naming (a trailing '_')
        base = _packet(name)
        return base.endswith("_") and not base.endswith("__")
    schema = op._schema
    args = schema.arguments
    if not args or args[0].alias_info is None or not args[0].alias_info.is_write:
        return False
    return any(r.alias_info is not None and r.alias_info.is_write for r in schema.returns)


@lru_cache(maxsize=None)
def is_view(name: str) -> bool:
    """The op's outputs may share its input's memory (schema ``Tensor(a) -> Tensor(a)``)."""
    op = overload(name)
    return bool(op is not None and op.is_view)


def functional_name(name: str) -> str:
    """``'aten.add_.Tensor'`` -> ``'aten.add.Tensor'`` (the out-of-place form of an in-place op)."""
    parts = name.split(".")
    parts[1] = parts[1][:-1]
    return ".".join(parts)


def allocates_uninitialized(name: str) -> bool:
    """The op returns fresh memory with undefined contents (``empty``, ``empty_like``, ...)."""
    return name.startswith("aten.") and _packet(name) in _UNINITIALIZED


def may_forward_input(name: str) -> bool:
    """A copy in torch that a lowering may turn into a no-op sharing the input's buffer."""
    return is_view(name) or _packet(name) in _MAY_FORWARD_INPUT
