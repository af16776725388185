"""Tensor-like pointer arguments: any object with ``data_ptr()`` and ``dtype``, as Triton accepts.

Libraries pass their own buffer classes to kernels (FlagGems' ``StridedBuffer`` reinterprets a
tensor with its own shape, strides and offset). A kernel sees only the pointer and the dtype, so
kernel_lens replaces such an argument by a view of the tensor storage it points into, with the
same data pointer: ``as_strided(t, (extent - k,), (1,), k)`` where ``t`` is the tensor whose
storage holds the pointer and ``k`` the pointer's element offset in that storage. Roles,
aliasing and the ONNX graph then see the storage the kernel really touches.

In the eager capture, the tensor is found among the object's attributes by address. Under
torch.export fake tensors have no address, so while tracing ``data_ptr()`` of a fake tensor
returns a *token*: a distinct synthetic base per storage (2**40 apart) plus the view's byte
offset. Host code that builds a tensor-like from it (``base.data_ptr() + offset * itemsize``)
keeps working, and the token says which fake storage, and where in it, the object points.
Tokens keep a real allocation's alignment residues (bases are 2**40-aligned, like a real
allocation is at least 16-byte aligned), which is all host code uses addresses for (cache keys,
alignment checks).
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor

from ...errors import UnsupportedKernelError

_TOKEN_SPACING = 1 << 40


def is_tensor_like(value: Any) -> bool:
    return not isinstance(value, torch.Tensor) and callable(getattr(value, "data_ptr", None)) \
        and isinstance(getattr(value, "dtype", None), torch.dtype)


def _extent(t: torch.Tensor) -> Any:
    """Elements of ``t``'s storage up to the last one ``t`` reaches (symbolic under export)."""
    reach = 1
    for size, stride in zip(t.shape, t.stride()):
        reach = reach + (size - 1) * stride
    return t.storage_offset() + reach


def _view(t: torch.Tensor, offset_bytes: Any, obj: Any, kernel: str, name: str) -> torch.Tensor:
    if obj.dtype != t.dtype:
        raise UnsupportedKernelError(
            f"kernel {kernel}: argument {name!r} ({type(obj).__qualname__}) reinterprets a "
            f"{t.dtype} tensor as {obj.dtype}; kernel_lens maps tensor-like arguments to views "
            f"of the same dtype: pass t.view({obj.dtype}) as the base")
    itemsize = t.element_size()
    example = int(offset_bytes.node.hint) if isinstance(offset_bytes, torch.SymInt) else offset_bytes
    if example % itemsize:
        raise UnsupportedKernelError(
            f"kernel {kernel}: argument {name!r} ({type(obj).__qualname__}) points "
            f"{offset_bytes} bytes into its tensor's storage, not a whole number of {t.dtype} "
            f"elements")
    k = offset_bytes // itemsize
    return torch.as_strided(t, (_extent(t) - k,), (1,), k)


def _tensors_in(obj: Any, depth: int = 2) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in (vars(obj).values() if hasattr(obj, "__dict__") else ()):
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif depth > 1 and hasattr(value, "__dict__") and not isinstance(value, type):
            found += _tensors_in(value, depth - 1)
    return found


def eager_view(obj: Any, kernel: str, name: str) -> torch.Tensor:
    """The view (same data pointer) of the tensor storage that ``obj`` points into."""
    ptr = obj.data_ptr()
    for t in _tensors_in(obj):
        storage = t.untyped_storage()
        start = storage.data_ptr()
        if start <= ptr < start + max(storage.nbytes(), 1):
            return _storage_view(t, ptr - start, obj, kernel, name)
    raise UnsupportedKernelError(
        f"kernel {kernel}: argument {name!r} is a {type(obj).__qualname__} (tensor-like: "
        f"data_ptr() and dtype) whose pointer lies in no tensor it holds as an attribute; "
        f"kernel_lens maps such arguments to the tensor storage they view: keep the tensor as "
        f"an attribute of the object, or pass a tensor view")


def _storage_view(t: torch.Tensor, offset_bytes: Any, obj: Any, kernel: str, name: str) -> torch.Tensor:
    """A view of ``t``'s storage at ``offset_bytes`` from the storage's start."""
    root = torch.as_strided(t, (_extent(t),), (1,), 0)
    return _view(root, offset_bytes, obj, kernel, name)


class Tokens:
    """Synthetic addresses of fake tensors under torch.export (see the module docstring)."""

    def __init__(self) -> None:
        self.roots: list[torch.Tensor] = []

    def address(self, t: torch.Tensor) -> int:
        root = t._base if t._base is not None else t
        index = next((i for i, r in enumerate(self.roots) if r is root), None)
        if index is None:
            self.roots.append(root)
            index = len(self.roots) - 1
        offset = t.storage_offset()
        if not isinstance(offset, int):
            raise UnsupportedKernelError(
                f"data_ptr() of a view whose storage offset depends on a dynamic size "
                f"({offset}) was asked for under torch.export; kernel_lens can only follow "
                f"addresses of views at a fixed offset")
        return (index + 1) * _TOKEN_SPACING + offset * t.element_size()

    def view(self, obj: Any, kernel: str, name: str) -> torch.Tensor:
        ptr = obj.data_ptr()
        # a token plus an offset computed from sizes is symbolic: the storage is the example's
        # (offsets stay below the spacing), the offset stays an expression
        example = int(ptr.node.hint) if isinstance(ptr, torch.SymInt) else int(ptr)
        index = example // _TOKEN_SPACING
        offset_bytes = ptr - index * _TOKEN_SPACING
        if not 1 <= index <= len(self.roots):
            raise UnsupportedKernelError(
                f"kernel {kernel}: argument {name!r} is a {type(obj).__qualname__} whose "
                f"data_ptr() does not come from a tensor of this forward under torch.export")
        root = self.roots[index - 1]
        return _storage_view(root, offset_bytes, obj, kernel, name)

    @contextlib.contextmanager
    def active(self) -> Iterator["Tokens"]:
        tokens = self

        def data_ptr(self: Any) -> int:
            return tokens.address(self)

        had = "data_ptr" in FakeTensor.__dict__
        old = FakeTensor.__dict__.get("data_ptr")
        FakeTensor.data_ptr = data_ptr
        try:
            yield self
        finally:
            if had:
                FakeTensor.data_ptr = old
            else:
                del FakeTensor.data_ptr


def replace(names: list[str], args: tuple, kwargs: dict, convert: Any) -> tuple[tuple, dict]:
    """``args``/``kwargs`` of a kernel with parameters ``names``, every tensor-like argument
    (inside tuple arguments too) replaced by ``convert(obj, name)``."""
    if not any(_has_tensor_like(v) for v in (*args, *kwargs.values())):
        return args, kwargs
    new_args = tuple(_replace(v, names[i] if i < len(names) else f"#{i}", convert)
                     for i, v in enumerate(args))
    new_kwargs = {k: _replace(v, k, convert) for k, v in kwargs.items()}
    return new_args, new_kwargs


def _has_tensor_like(value: Any) -> bool:
    if isinstance(value, tuple):
        return any(_has_tensor_like(v) for v in value)
    return is_tensor_like(value)


def _replace(value: Any, name: str, convert: Any) -> Any:
    if isinstance(value, tuple):
        items = [_replace(v, f"{name}[{i}]", convert) for i, v in enumerate(value)]
        return type(value)(*items) if hasattr(type(value), "_fields") else tuple(items)
    return convert(value, name) if is_tensor_like(value) else value
