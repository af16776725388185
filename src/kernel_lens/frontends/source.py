"""Source identity of @triton.jit functions and the closure of helpers a kernel calls.

Role inference reads kernels from the IR alone, so the IR carries each function's text and a
map from every name the text uses to what that name resolves to.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import sys
import inspect
import textwrap
import types
from typing import Any

import triton.language as tl
from triton.runtime.jit import JITFunction

from ..errors import KernelSourceError
from ..ir import SourceInfo

# (source_hash, qualname, file, line) -> JITFunction, for re-compiling from the IR. The same text
# defined elsewhere is another function: its binary's line info names its own file and line.
_registry: dict[tuple[str, str, str, int], Any] = {}


def _jit_types() -> tuple[type, ...]:
    return (JITFunction,)


def qualname(fn: Any) -> str:
    py = getattr(fn, "fn", fn)
    return f"{py.__module__}.{py.__qualname__}"


def source_text(jit_fn: Any, kernel: str) -> tuple[str, str, int]:
    """(dedented text, file, first line) of a JITFunction, or a KernelSourceError."""
    py = jit_fn.fn
    try:
        lines, start = inspect.getsourcelines(py)
        file = inspect.getsourcefile(py) or "<unknown>"
    except (OSError, TypeError) as exc:
        raise KernelSourceError(
            f"kernel {kernel}: the source of @triton.jit function {py.__qualname__} cannot be "
            f"retrieved ({exc}); define it in a .py file that is importable"
        ) from None
    text = textwrap.dedent("".join(lines))
    return text, file, start


def _resolve(value: Any) -> str | None:
    if isinstance(value, types.ModuleType):
        if value.__name__.startswith("triton.language"):
            return value.__name__
        if value.__name__ == "triton":
            return "triton"
        return None
    if isinstance(value, _jit_types()):
        return f"jit:{qualname(value)}"
    module = getattr(value, "__module__", "") or ""
    if module.startswith("triton.language"):
        name = getattr(value, "__name__", None)
        if name and getattr(tl, name, None) is value:
            return f"triton.language.{name}"
        if name:
            return f"{module}.{name}"
    return None


def _names_used(text: str) -> set[str]:
    tree = ast.parse(text)
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def describe(jit_fn: Any, kernel: str) -> tuple[SourceInfo, list[Any]]:
    """SourceInfo of one JIT function, plus the JIT functions it references directly."""
    text, file, line = source_text(jit_fn, kernel)
    glob = dict(jit_fn.fn.__globals__)
    if jit_fn.fn.__closure__:
        glob.update(zip(jit_fn.fn.__code__.co_freevars,
                        (c.cell_contents for c in jit_fn.fn.__closure__)))
    callees: dict[str, str] = {}
    called: list[Any] = []
    for name in sorted(_names_used(text)):
        if name not in glob:
            continue
        value = glob[name]
        target = _resolve(value)
        if target is None:
            continue
        callees[name] = target
        if target.startswith("jit:"):
            called.append(value)
    # Attribute access on plain modules (e.g. `helpers.load_row`) resolves through the module.
    for node in ast.walk(ast.parse(text)):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and isinstance(glob.get(node.value.id), types.ModuleType)
                and not glob[node.value.id].__name__.startswith("triton")):
            value = getattr(glob[node.value.id], node.attr, None)
            target = _resolve(value) if value is not None else None
            if target is not None:
                callees[f"{node.value.id}.{node.attr}"] = target
                if target.startswith("jit:"):
                    called.append(value)
    digest = hashlib.sha256(text.encode()).hexdigest()
    info = SourceInfo(qualname=qualname(jit_fn), file=file, line=line, source_hash=digest,
                      text=text, callees=callees)
    _registry[_identity(info)] = jit_fn
    return info, called


def describe_kernel(jit_fn: Any, kernel: str, passed: list | None = None) -> tuple[SourceInfo, list[SourceInfo]]:
    """The kernel's SourceInfo and those of every helper it calls, transitively; ``passed``
    adds @triton.jit functions the launch passes as constexprs (and what they call)."""
    info, todo = describe(jit_fn, kernel)
    todo = [*todo, *(passed or [])]
    helpers: dict[str, SourceInfo] = {}
    seen = {info.qualname}
    while todo:
        fn = todo.pop()
        name = qualname(fn)
        if name in seen:
            continue
        seen.add(name)
        h, more = describe(fn, kernel)
        helpers[name] = h
        todo.extend(more)
    return info, [helpers[k] for k in sorted(helpers)]


def _identity(source: SourceInfo) -> tuple[str, str, str, int]:
    return source.source_hash, source.qualname, source.file, source.line


def resolve_jit(source: SourceInfo, *, import_modules: bool = False) -> Any:
    """The live JITFunction for a SourceInfo: the one captured in this process, else the one in
    a module this process has already imported. An IR document is data: the module it names is
    imported only when the caller asks (``import_modules=True``), never on the document's word."""
    fn = _registry.get(_identity(source))
    if fn is not None:
        return fn
    module_name, _, attr = source.qualname.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None and not import_modules:
        raise KernelSourceError(
            f"kernel {source.qualname}: module {module_name!r} is not imported, and kernel_lens "
            f"imports nothing an IR document names; import it before compiling, or pass "
            f"import_kernels=True to import it"
        )
    try:
        if module is None:
            module = importlib.import_module(module_name)
        fn = getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise KernelSourceError(
            f"kernel {source.qualname}: cannot import it to compile ({exc}); compile in the "
            f"process that captured the model, or make module {module_name!r} importable"
        ) from None
    text, _, _ = source_text(fn, source.qualname)
    if hashlib.sha256(text.encode()).hexdigest() != source.source_hash:
        raise KernelSourceError(
            f"kernel {source.qualname}: its source changed since the IR was captured "
            f"(hash mismatch); capture the model again"
        )
    _registry[_identity(source)] = fn
    return fn
