"""Source identity of @triton.jit functions and the closure of helpers a kernel calls.

Role inference reads kernels from the IR alone, so the IR carries each function's text and a
map from every name the text uses to what that name resolves to.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import linecache
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


# --- a kernel rebuilt from the IR's text (the CPU evaluation of an artifact folder) -----------
_rebuilt: dict[tuple, Any] = {}  # (identity, callees) -> the function made from the text


def _callee(target: str, helpers: dict[str, SourceInfo]) -> Any:
    if target == "triton":
        return importlib.import_module("triton")
    if target.startswith("jit:"):
        name = target[4:]
        if name not in helpers:
            raise KernelSourceError(f"@triton.jit function {name} is called but its source is not "
                                    f"among the kernel's helpers in the IR; recompile the model")
        return jit_from_ir(helpers[name], helpers)
    module, _, attr = target.rpartition(".")
    if target.startswith("triton.language") and _is_module(target):
        return importlib.import_module(target)  # a module: triton.language, its extra.libdevice
    if not module.startswith("triton.language"):
        raise KernelSourceError(f"name {target!r} in a kernel's callees is not Triton's")
    value = getattr(importlib.import_module(module), attr, None)
    if value is None:
        raise KernelSourceError(f"{target} is not defined by this Triton ({tl.__name__})")
    return value


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a name inside a module that is not a package (`gdc.gdc_wait`)
        return False


def jit_from_ir(source: SourceInfo, helpers: dict[str, SourceInfo]) -> Any:
    """The @triton.jit function whose text the IR holds: the live one when this process has it
    (captured here, or its module imported: :func:`resolve_jit`, same text by hash), else the
    text itself turned into a function. Its names resolve through ``source.callees`` (Triton's
    modules and functions, and the other @triton.jit functions, from ``helpers``); a name the
    IR does not resolve fails when the interpreter reaches it (the caller names the kernel).

    Running the text runs code of the folder it came from, as running its plugin library does:
    only the CPU evaluation of a compiled folder (``run`` with CPU tensors) does it."""
    try:
        return resolve_jit(source)
    except KernelSourceError:
        pass
    key = (*_identity(source), tuple(sorted(source.callees.items())))  # what the text's names resolve to
    if key in _rebuilt:
        return _rebuilt[key]
    if hashlib.sha256(source.text.encode()).hexdigest() != source.source_hash:
        raise KernelSourceError(f"kernel {source.qualname}: its text in the IR does not match its "
                                f"recorded hash; recompile the model")
    try:
        tree = ast.parse(source.text)
    except SyntaxError as exc:
        raise KernelSourceError(f"kernel {source.qualname}: its text in the IR does not parse "
                                f"({exc.msg}, line {exc.lineno})") from None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    if len(defs) != 1 or len(tree.body) != 1:
        raise KernelSourceError(f"kernel {source.qualname}: its text in the IR is not one function "
                                f"definition")
    defs[0].decorator_list = []  # @triton.jit is applied below; a library's own decorators are not run
    # Line numbers as in the user's file, under a name that says where the text came from (the
    # interpreter reads the function's lines back through linecache, as inspect does).
    # One name per text: Triton's interpreter reads the lines back at every call, and helpers of one
    # file (or two versions of it) must not overwrite each other's lines.
    filename = f"{source.file} (kernel text from the IR, {source.source_hash[:12]})"
    ast.increment_lineno(tree, max(source.line, 1) - 1)
    lines = ["\n"] * (max(source.line, 1) - 1) + source.text.splitlines(keepends=True)
    linecache.cache[filename] = (sum(map(len, lines)), None, lines, filename)
    namespace: dict[str, Any] = {"__name__": source.qualname.rpartition(".")[0] or "kernel_lens_ir",
                                 # Triton's interpreter patches the triton.language its function's
                                 # globals hold; a helper's module imports it even when its text
                                 # never names it
                                 "__kernel_lens_triton_language__": tl}
    _rebuilt[key] = None  # a helper calling itself (recursion is refused by Triton anyway)
    try:
        for name, target in source.callees.items():
            head, _, attr = name.partition(".")
            value = _callee(target, helpers)
            if attr:  # `module.fn`: the module's namespace, as far as the kernel uses it
                holder = namespace.setdefault(head, types.SimpleNamespace())
                if isinstance(holder, types.SimpleNamespace):
                    setattr(holder, attr, value)
            else:
                namespace[name] = value
        exec(compile(tree, filename, "exec"), namespace)  # noqa: S102 (see the docstring)
    except BaseException:
        del _rebuilt[key]  # not a function that was made: the next call fails as this one did
        raise
    fn = namespace[defs[0].name]
    jit = importlib.import_module("triton").jit(fn)
    _rebuilt[key] = jit
    return jit
