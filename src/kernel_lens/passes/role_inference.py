"""Role inference: which tensor parameters a kernel reads, writes, or both.

A flow-sensitive dataflow analysis over the kernel's AST (from the IR's source text): every
value carries the set of pointer parameters it may point into; assignments, loops (to a fixed
point), branches (joined), @triton.jit helpers (bound per call site), block pointers and
tensor descriptors propagate those sets; ``tl.load``/``tl.store``/``tl.atomic_*`` record reads
and writes. A pointer that reaches code the analysis cannot see is an error asking for an
explicit ``roles={...}`` override — never a guess from the parameter's name.
"""

from __future__ import annotations

import ast
import builtins
from typing import Iterable

from dataclasses import dataclass
from typing import Union

from ..errors import PostconditionError, RoleInferenceError
from ..ir import GraphIR, JitValue, KernelIR, KernelParam, ParamKind, Role, SourceInfo, TupleValue
from .base import Pass, PassContext, PassResult

Sources = frozenset[str]
EMPTY: Sources = frozenset()


@dataclass(frozen=True)
class TupleVal:
    """A tuple value (a tuple argument, a tuple literal): its elements' values, kept apart so
    ``ptrs[0]`` and ``x, y = ptrs`` reach one element; named tuples keep their fields."""

    items: tuple
    fields: tuple[str, ...] | None = None


@dataclass(frozen=True)
class FnVal:
    """A @triton.jit function held in a variable (a constexpr argument such as an activation)."""

    qualname: str


Value = Union[Sources, TupleVal, FnVal]


def flat(v: Value) -> Sources:
    """Every parameter a value may point into."""
    if isinstance(v, TupleVal):
        return frozenset().union(*(flat(i) for i in v.items)) if v.items else EMPTY
    if isinstance(v, FnVal):
        return EMPTY
    return v


def join(a: Value, b: Value) -> Value:
    if a == b:
        return a
    if isinstance(a, TupleVal) and isinstance(b, TupleVal) and len(a.items) == len(b.items):
        return TupleVal(tuple(join(x, y) for x, y in zip(a.items, b.items)),
                        a.fields if a.fields == b.fields else None)
    if isinstance(a, FnVal) and b == EMPTY or isinstance(b, FnVal) and a == EMPTY:
        return a if isinstance(a, FnVal) else b  # unbound before the assignment: keep the function
    return flat(a) | flat(b)


def _key(v: Value) -> tuple:
    if isinstance(v, TupleVal):
        return ("t", tuple(_key(i) for i in v.items), v.fields)
    if isinstance(v, FnVal):
        return ("f", v.qualname)
    return ("s", tuple(sorted(v)))


def _param_value(p: KernelParam) -> Value:
    """A parameter's value on entry: its own name for tensors (and descriptors), the function
    for a @triton.jit constexpr, the elements' values for a tuple."""
    if p.binds_tensor:
        return frozenset({p.name})
    if p.kind == ParamKind.tuple:
        return TupleVal(tuple(_param_value(i) for i in p.items),
                        tuple(p.fields) if p.fields is not None else None)
    if p.kind == ParamKind.constexpr:
        return _constant_value(p.constexpr_value)
    return EMPTY


def _constant_value(value: object) -> Value:
    if isinstance(value, JitValue):
        return FnVal(value.jit)
    if isinstance(value, TupleValue):
        return TupleVal(tuple(_constant_value(i) for i in value.items),
                        tuple(value.fields) if value.fields is not None else None)
    return EMPTY


def _index(node: ast.expr) -> int | None:
    """A constant integer subscript (``t[1]``, ``t[-1]``), or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant) \
            and isinstance(node.operand.value, int):
        return -node.operand.value
    return None

_READ = {"load"}
_WRITE = {"store"}
_OPAQUE = {"inline_asm_elementwise"}
_BUILTINS = set(dir(builtins))


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return None


class _Analysis:
    """Reads/writes of one kernel, in terms of the kernel's own parameter names."""

    def __init__(self, kernel: KernelIR) -> None:
        self.kernel = kernel
        self.functions = {kernel.source.qualname: kernel.source, **{h.qualname: h for h in kernel.helpers}}
        self.reads: set[str] = set()
        self.writes: set[str] = set()
        self.opaque: dict[str, str] = {}  # param -> why its role cannot be proven
        self.memo: dict[tuple, Value] = {}
        self.active: set[tuple] = set()

    # --- functions ---------------------------------------------------------------------------
    def function(self, source: SourceInfo, args: dict[str, Value]) -> Value:
        key = (source.qualname, tuple(sorted((k, _key(v)) for k, v in args.items())))
        if key in self.memo:
            return self.memo[key]
        if key in self.active:
            return EMPTY
        self.active.add(key)
        tree = ast.parse(source.text)
        fn = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
        env = {a.arg: args.get(a.arg, EMPTY) for a in fn.args.args + fn.args.kwonlyargs}
        body = _Body(self, source)
        body.block(fn.body, env)
        self.active.discard(key)
        self.memo[key] = body.returns
        return body.returns

    def run(self) -> dict[str, Role]:
        tensors = [p.name for p in self.kernel.leaves() if p.binds_tensor]
        self.function(self.kernel.source, {p.name: _param_value(p) for p in self.kernel.params})
        roles = {}
        for t in tensors:
            r, w = t in self.reads, t in self.writes
            roles[t] = Role.inplace if r and w else Role.output if w else Role.input
        return roles


class _Body:
    """Flow-sensitive walk of one function body."""

    def __init__(self, analysis: _Analysis, source: SourceInfo) -> None:
        self.a = analysis
        self.source = source
        self.returns: Value = EMPTY

    # --- statements ----------------------------------------------------------------------------
    def block(self, stmts: Iterable[ast.stmt], env: dict[str, Value]) -> dict[str, Value]:
        for s in stmts:
            env = self.stmt(s, env)
        return env

    def stmt(self, s: ast.stmt, env: dict[str, Value]) -> dict[str, Value]:
        if isinstance(s, ast.Assign):
            value = self.expr(s.value, env)
            for target in s.targets:
                self.assign(target, s.value, value, env)
        elif isinstance(s, ast.AnnAssign) and s.value is not None:
            self.assign(s.target, s.value, self.expr(s.value, env), env)
        elif isinstance(s, ast.AugAssign):
            value = self.expr(s.value, env)
            if isinstance(s.target, ast.Name):
                env[s.target.id] = join(env.get(s.target.id, EMPTY), flat(value))
        elif isinstance(s, ast.Expr):
            self.expr(s.value, env)
        elif isinstance(s, ast.Return) and s.value is not None:
            self.returns = join(self.returns, self.expr(s.value, env))
        elif isinstance(s, ast.If):
            self.expr(s.test, env)
            env = _join(self.block(s.body, dict(env)), self.block(s.orelse, dict(env)))
        elif isinstance(s, (ast.For, ast.While)):
            if isinstance(s, ast.For):
                self.assign(s.target, s.iter, self.expr(s.iter, env), env)
            else:
                self.expr(s.test, env)
            while True:  # iterate the body to a fixed point of the environment
                after = _join(env, self.block(s.body, dict(env)))
                if isinstance(s, ast.While):
                    self.expr(s.test, after)
                if after == env:
                    break
                env = after
            env = self.block(s.orelse, env)
        elif isinstance(s, ast.With):
            env = self.block(s.body, env)
        elif isinstance(s, ast.Assert):
            self.expr(s.test, env)
        return env

    def assign(self, target: ast.expr, value_node: ast.expr, value: Value, env: dict) -> None:
        if isinstance(target, ast.Name):
            env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            if isinstance(value_node, (ast.Tuple, ast.List)) and len(value_node.elts) == len(target.elts):
                for t, v in zip(target.elts, value_node.elts):
                    self.assign(t, v, self.expr(v, env), env)
            elif isinstance(value, TupleVal) and len(value.items) == len(target.elts):
                for t, v in zip(target.elts, value.items):
                    self.assign(t, value_node, v, env)
            else:
                for t in target.elts:
                    self.assign(t, value_node, flat(value), env)

    # --- expressions ---------------------------------------------------------------------------
    def expr(self, e: ast.expr | None, env: dict[str, Value]) -> Value:
        if e is None:
            return EMPTY
        if isinstance(e, ast.Name):
            return env.get(e.id, EMPTY)
        if isinstance(e, (ast.Tuple, ast.List)):
            return TupleVal(tuple(self.expr(x, env) for x in e.elts))
        if isinstance(e, ast.Call):
            return self.call(e, env)
        if isinstance(e, ast.Compare):
            self.expr(e.left, env)
            for c in e.comparators:
                self.expr(c, env)
            return EMPTY
        if isinstance(e, ast.BoolOp):
            for v in e.values:
                self.expr(v, env)
            return EMPTY
        if isinstance(e, ast.Attribute):
            base = self.expr(e.value, env)
            if isinstance(base, TupleVal) and base.fields is not None and e.attr in base.fields:
                return base.items[base.fields.index(e.attr)]  # a named tuple's field
            return EMPTY  # .dtype, .shape, .T of values: metadata, not memory
        if isinstance(e, ast.Subscript):
            self.expr(e.slice, env)
            base = self.expr(e.value, env)
            i = _index(e.slice)
            if isinstance(base, TupleVal) and i is not None and -len(base.items) <= i < len(base.items):
                return base.items[i]
            return flat(base)
        if isinstance(e, ast.IfExp):
            self.expr(e.test, env)
            return join(self.expr(e.body, env), self.expr(e.orelse, env))
        out = EMPTY
        for child in ast.iter_child_nodes(e):
            if isinstance(child, ast.expr):
                out = out | flat(self.expr(child, env))
        return out

    def _resolve(self, func: ast.expr) -> str | None:
        """'tl:<fn>' for triton.language functions, 'jit:<qualname>' for helpers."""
        name = _dotted(func)
        if name is None:
            return None
        callees = self.source.callees
        if name in callees:
            target = callees[name]
            if target.startswith("jit:"):
                return target
            if target.startswith("triton.language."):
                return "tl:" + target.rsplit(".", 1)[1]
        head, _, rest = name.partition(".")
        if rest and (callees.get(head, "").startswith("triton.language")
                     or callees.get(head) == "triton" and rest.startswith("language.")):
            return "tl:" + rest.rsplit(".", 1)[-1]
        return None

    def call(self, e: ast.Call, env: dict[str, Value]) -> Value:
        args = [self.expr(a, env) for a in e.args]
        kwargs = {k.arg: self.expr(k.value, env) for k in e.keywords if k.arg}
        every = frozenset().union(*map(flat, args), *map(flat, kwargs.values())) \
            if (args or kwargs) else EMPTY
        held = env.get(e.func.id) if isinstance(e.func, ast.Name) else None
        target = f"jit:{held.qualname}" if isinstance(held, FnVal) else self._resolve(e.func)

        def operand(position: int, keyword: str) -> Sources:
            return flat(args[position] if len(args) > position else kwargs.get(keyword, EMPTY))

        if target and target.startswith("tl:"):
            fn = target[3:]
            if fn in _READ:
                self.a.reads |= operand(0, "pointer")
                return EMPTY
            if fn in _WRITE:
                self.a.writes |= operand(0, "pointer")
                return EMPTY
            if fn.startswith("atomic_"):
                ptr = operand(0, "pointer")
                self.a.reads |= ptr
                self.a.writes |= ptr
                return EMPTY
            if fn in _OPAQUE and every:
                self._opaque(every, f"passed to tl.{fn}, whose memory effects are unknown")
                return EMPTY
            if fn in ("make_block_ptr", "make_tensor_descriptor"):
                return operand(0, "base")
            return every  # any other tl function: its result may carry its operands' pointers
        if target and target.startswith("jit:"):
            helper = self.a.functions.get(target[4:])
            if helper is None:
                self._opaque(every, f"passed to {target[4:]}, whose source is not in the IR")
                return EMPTY
            tree = ast.parse(helper.text)
            fn = next(n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))
            names = [a.arg for a in fn.args.args]
            bound = dict(zip(names, args))
            bound.update(kwargs)
            return self.a.function(helper, bound)
        func = e.func
        if isinstance(func, ast.Attribute) and not (
                isinstance(func.value, ast.Name) and func.value.id not in env):
            # A method on a value: descriptor/block-pointer loads and stores, casts, reductions.
            base = flat(self.expr(func.value, env))
            if func.attr == "load":
                self.a.reads |= base
                return EMPTY
            if func.attr == "store":
                self.a.writes |= base
                return EMPTY
            if func.attr.startswith("atomic_"):
                self.a.reads |= base
                self.a.writes |= base
                return EMPTY
            return base | every
        name = _dotted(e.func)
        if name in _BUILTINS or name in ("range",):
            return every
        if every:
            self._opaque(every, f"passed to {name or ast.unparse(e.func)}(), which is neither "
                                f"triton.language nor a @triton.jit function")
        return EMPTY

    def _opaque(self, params: Sources, why: str) -> None:
        for p in params:
            self.a.opaque.setdefault(p, f"in {self.source.qualname}: {why}")


def _join(a: dict[str, Value], b: dict[str, Value]) -> dict[str, Value]:
    return {k: join(a.get(k, EMPTY), b.get(k, EMPTY)) for k in a.keys() | b.keys()}


def infer_roles(kernel: KernelIR) -> dict[str, Role]:
    """Roles of the kernel's tensor parameters; overrides in the IR win over inference."""
    analysis = _Analysis(kernel)
    try:
        roles = analysis.run()
    except SyntaxError as exc:
        raise RoleInferenceError(f"kernel {kernel.name}: cannot parse its source: {exc}") from None
    overrides = {p.name: p.role for p in kernel.leaves() if p.role_source == "override"}
    unresolved = {p: why for p, why in analysis.opaque.items() if p not in overrides}
    if unresolved:
        lines = "\n".join(f"  {p}: {why}" for p, why in sorted(unresolved.items()))
        example = ", ".join(f'"{p}": "input|output|inplace"' for p in sorted(unresolved))
        raise RoleInferenceError(
            f"kernel {kernel.name}: cannot prove the role of tensor parameter(s):\n{lines}\n"
            f'pass roles={{"{kernel.name}": {{{example}}}}} to kernel_lens.compile '
            f"(or --roles on the command line)")
    roles.update(overrides)
    return roles


class RoleInference(Pass):
    name = "role-inference"
    description = "infer input/output/inplace for every tensor parameter from the kernel's AST"
    provides = frozenset({"roles"})

    def run(self, ir: GraphIR, ctx: PassContext) -> PassResult:
        modified = False
        for kernel in ir.kernels.values():
            for name, role in infer_roles(kernel).items():
                param = kernel.param(name)
                if param.role != role:
                    param.role, modified = role, True
                if param.role_source is None:
                    param.role_source = "inferred"
        for launch in ir.launches:
            kernel = ir.kernels[launch.kernel]
            for arg in launch.args:
                p = kernel.param(arg.name)
                if p.binds_tensor and arg.value is not None:
                    arg.role = p.role.value
        return PassResult(ir, modified)

    def ensures(self, ir: GraphIR) -> None:
        for launch in ir.launches:
            for arg in launch.args:
                if arg.role is None:
                    raise PostconditionError(f"launch {launch.order} argument {arg.name} has no role")
