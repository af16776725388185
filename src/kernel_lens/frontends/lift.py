"""Lift a model into GraphIR: capture + symbolic trace + AOT compile, joined launch by launch."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import itertools
import keyword
import logging
import math
import operator
import re
from typing import Any, Callable, Iterable, Sequence

import sympy
import torch
from torch.export.graph_signature import InputKind
from torch.fx.experimental.symbolic_shapes import CallMethodKey, ConvertIntKey
from torch.utils._pytree import SequenceKey

from ..archs import check_archs
from .. import progress
from ..errors import (CaptureError, DynamicConstexprError, InputError, SymbolicError, TraceError,
                      UnsupportedKernelError)
from ..ir import (CompileOptions, ConstantData, ConstArg, Dispatch, GraphIR, KernelIR, KernelParam, Launch,
                  LaunchArg, ListArg, ParamKind, Role, RuntimeCheck, RuntimeSymbol, SymArg, SymbolInfo,
                  TensorValue, TorchOp, ValueArg, format_expr, symbol)
from ..ir.names import is_identifier, safe_identifier
from ..ir.symbolic import parse, to_plain_sympy
from ..ir.kernel import Specialization
from ..ir.types import dtype_from_torch, dtype_from_triton, DType
from .aot import compile_binary, jit_resolver
from .capture.recorder import CapturedLaunch, capture, kernel_name
from .trace.decompose import decompose, needs_decomposition, tensor_args
from . import arguments
from . import value_branches
from .own_kernels import ATTENTION, NAME as OWN_GEMM, OwnKernels
from .trace import size_functions, size_pieces
from .trace.shapes_check import check_dynamic_shapes, check_forward_takes, one_dim_per_name
from .source import describe_kernel
from .trace.export import LAUNCH_OP, TracedLaunch, is_user_file, located, trace

log = logging.getLogger(__name__)

_OPTION_DEFAULTS = {"num_warps": 4, "num_stages": 3, "num_ctas": 1}
_RESERVED = set(dir(sympy)) | set(keyword.kwlist)


def check_example_inputs(example_inputs: object) -> tuple:
    """The example inputs as a tuple of tensors, or :class:`InputError` naming the culprit."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    if not isinstance(example_inputs, (tuple, list)):
        raise InputError(f"example_inputs must be a tuple of torch tensors, got "
                         f"{type(example_inputs).__name__}")
    if not example_inputs:
        raise InputError("example_inputs is empty; pass the tensors the model's forward takes")
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"example_inputs[{i}] is a {type(t).__name__}, not a torch.Tensor; "
                             f"kernel_lens compiles models whose inputs are tensors (make "
                             f"constants attributes of the model, or pass torch.tensor(value))")
    check_distinct(example_inputs, "example_inputs")
    return tuple(example_inputs)


def check_distinct(inputs: Sequence[torch.Tensor], what: str) -> None:
    """No two example tensors share memory: torch.export traces such inputs as one (a graph
    reading the first where the forward reads the second), wrong for any call passing two."""
    seen: dict[int, int] = {}
    for i, t in enumerate(inputs):
        if not isinstance(t, torch.Tensor) or t.numel() == 0 or t.device.type == "meta":
            continue
        j = seen.setdefault(t.untyped_storage().data_ptr(), i)
        if j != i:
            raise InputError(f"{what}[{j}] and {what}[{i}] share memory (the same tensor or views "
                             f"of one): the trace would take them for one input; pass distinct "
                             f"tensors (e.g. {what}[{i}].clone())")


def check_roles(roles: object) -> dict[str, dict[str, str]]:
    """``roles`` as {kernel: {param: role}}, or :class:`InputError` naming the bad entry."""
    if roles is None:
        return {}
    valid = [r.value for r in Role]
    if not isinstance(roles, dict):
        raise InputError(f"roles must be a dict {{kernel: {{param: role}}}}, got {type(roles).__name__}")
    for kernel, mapping in roles.items():
        if not isinstance(kernel, str) or not isinstance(mapping, dict):
            raise InputError(f"roles[{kernel!r}] must be a dict {{param: role}}, got "
                             f"{type(mapping).__name__}")
        for param, role in mapping.items():
            if role not in valid:
                raise InputError(f"roles[{kernel!r}][{param!r}] = {role!r} is not a role; use one "
                                 f"of {', '.join(valid)}")
    return roles


def default_arch() -> int:
    """The local GPU's compute capability, or 90 (H100/H200) on a host without one."""
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor
    progress.log.info("no CUDA GPU here: compiling for sm_90 (H100/H200); choose another with "
                      "--arch (e.g. --arch sm_80) or arch= in kernel_lens.compile")
    return 90


# --- kernels ---------------------------------------------------------------------------------
def _options(launch: CapturedLaunch) -> CompileOptions:
    opts = dict(launch.options)
    config = launch.autotune_config
    if config is not None:
        opts.update(config.all_kwargs())
        for name in config.kwargs:
            opts.pop(name, None)
    extra = {k: v for k, v in opts.items() if k not in _OPTION_DEFAULTS and v is not None}
    return CompileOptions(
        num_warps=opts.get("num_warps", 4), num_stages=opts.get("num_stages", 3),
        num_ctas=opts.get("num_ctas", 1), extra=extra,
        autotune_config=dict(config.kwargs) if config is not None else None,
        autotune_choice=launch.autotune_choice,
    )


def _kernel_key(launch: CapturedLaunch, options: CompileOptions) -> tuple:
    return (id(launch.jit), repr(launch.specialization), options.model_dump_json())


def build_kernels(captured: list[CapturedLaunch]) -> tuple[dict[str, KernelIR], list[str]]:
    """One KernelIR per distinct (kernel, specialization, options); the kernel id per launch."""
    by_key: dict[tuple, KernelIR] = {}
    order: list[tuple] = []
    for launch in captured:
        options = _options(launch)
        key = _kernel_key(launch, options)
        order.append(key)
        if key in by_key:
            continue
        name = kernel_name(launch.jit)
        bad = [n for n in [name, *(p.name for p in launch.jit.params)] if not is_identifier(n)]
        if bad:
            raise UnsupportedKernelError(
                f"kernel {name!r}: name {bad[0]!r} is not an ASCII identifier; kernel and parameter "
                f"names reach generated C++, so rename it to letters, digits and underscores")
        jit_functions: list = []
        params, specs = arguments.kernel_params(launch.jit, name, launch.params,
                                                launch.specialization, jit_functions)
        source, helpers = describe_kernel(launch.jit, name, jit_functions)
        digest = hashlib.sha256(repr((source.qualname, key[1:])).encode()).hexdigest()[:8]
        by_key[key] = KernelIR(id=f"{name}_{digest}", name=name, source=source, helpers=helpers,
                               params=params, specialization=specs, options=options)
        arguments.check_round_trip(by_key[key], launch.specialization, jit_resolver(by_key[key]))
    counts: dict[str, int] = {}
    for k in by_key.values():
        counts[k.name] = counts.get(k.name, 0) + 1
    for k in by_key.values():  # readable ids where the name alone is unique
        if counts[k.name] == 1:
            k.id = k.name
    return {k.id: k for k in by_key.values()}, [by_key[key].id for key in order]


def apply_role_overrides(kernels: dict[str, KernelIR], roles: dict[str, dict[str, str]]) -> None:
    for kname, mapping in roles.items():
        matches = [k for k in kernels.values() if k.name == kname or k.id == kname]
        if not matches:
            raise UnsupportedKernelError(f"roles override names kernel {kname!r}, which the model "
                                         f"does not launch; launched: {sorted(kernels)}")
        for k in matches:
            for pname, role in mapping.items():
                try:
                    param = k.param(pname)
                except KeyError as exc:
                    raise UnsupportedKernelError(f"roles override: {exc.args[0]}") from None
                if not param.binds_tensor:
                    raise UnsupportedKernelError(f"roles override: kernel {kname} parameter "
                                                 f"{pname!r} is not a tensor")
                param.role, param.role_source = Role(role), "override"


MAX_VARIANTS = 128  # binaries one launch may dispatch between (constexprs computed from sizes)


def guard_variants(captured: list[CapturedLaunch], traced: list[TracedLaunch]):
    """For launches whose constexprs are booleans of dynamic dims (heuristics), one captured
    launch per combination of those booleans, so a binary exists for every input size."""
    out, owners = [], []
    for index, (cap, tr) in enumerate(zip(captured, traced)):
        names = sorted(tr.guards)
        domains = [tr.domains.get(n, (False, True)) for n in names]
        count = math.prod(len(d) for d in domains)
        if count > MAX_VARIANTS:
            raise UnsupportedKernelError(
                f"kernel {kernel_name(cap.jit)}: constexprs {names} depend on dynamic dims and "
                f"together need {count} binaries; at most {MAX_VARIANTS} per launch are compiled: "
                f"narrow the Dim ranges or mark dims static")
        for values in itertools.product(*domains):
            when = dict(zip(names, values))
            params = {**cap.params, **when}
            spec = [("constexpr", params[p.name]) if p.name in when else s
                    for p, s in zip(cap.jit.params, cap.specialization)]
            out.append((dataclasses.replace(cap, params=params, specialization=spec), when))
            owners.append(index)
    return out, owners


# --- symbols and expressions -------------------------------------------------------------------
class _Symbols:
    """Maps torch's shape symbols to IR symbols tied to (graph input, dim)."""

    def __init__(self, program: torch.export.ExportedProgram, user_inputs: list[torch.fx.Node],
                 dynamic_shapes: Any) -> None:
        self.table: dict[str, SymbolInfo] = {}
        self.runtime: dict[str, RuntimeSymbol] = {}  # sizes from tensor values (unbacked symbols)
        self.rename: dict[sympy.Symbol, sympy.Symbol] = {}
        self.ranges = {str(k): v for k, v in program.range_constraints.items()}
        self.dynamic_shapes = dynamic_shapes
        dims = [(i, node, d, size.node.shape_env.replace(size.node.expr), size)
                for i, node in enumerate(user_inputs)
                for d, size in enumerate(node.meta["val"].shape) if isinstance(size, torch.SymInt)]
        for i, node, d, expr, size in dims:  # dims that are a symbol
            if isinstance(expr, sympy.Symbol) and expr not in self.rename:
                self._add(expr, i, node.name, d, 1, 0, int(size.node.hint))
        for i, node, d, expr, size in dims:  # dims that are scale*symbol + offset (Dim("h")*2)
            free = [s for s in expr.free_symbols if s not in self.rename]
            if len(free) != 1 or len(expr.free_symbols) != 1:
                continue
            sym = free[0]
            poly = sympy.Poly(expr, sym) if expr.is_polynomial(sym) else None
            if poly is None or poly.degree() != 1:
                continue
            scale, offset = (int(c) for c in poly.all_coeffs())
            if scale >= 1:
                example = (int(size.node.hint) - offset) // scale
                self._add(sym, i, node.name, d, scale, offset, example)

    def _add(self, expr: sympy.Symbol, i: int, input_name: str, d: int, scale: int, offset: int,
             example: int) -> None:
        preferred = _dim_name(self.dynamic_shapes, i, input_name, d, root=scale != 1 or offset != 0)
        name = self._name(preferred, len(self.table))
        vr = self.ranges.get(str(expr))
        lower = int(vr.lower) if vr is not None and vr.lower.is_Integer else 0
        upper = int(vr.upper) if vr is not None and vr.upper.is_Integer else None
        self.rename[sympy.Symbol(expr.name, integer=True, nonnegative=True)] = symbol(name)
        self.rename[expr] = symbol(name)
        self.table[name] = SymbolInfo(input=i, dim=d, min=lower, max=upper, example=example,
                                      scale=scale, offset=offset)

    def _name(self, preferred: str | None, index: int) -> str:
        if preferred and is_identifier(preferred) and not preferred.startswith("_") \
                and preferred not in _RESERVED and preferred not in self.table:
            return preferred
        return f"s{index}"

    def add_runtime(self, expr: sympy.Symbol, order: int, value: str, dim: int | None,
                    example: int, where: str) -> str:
        """Name the unbacked symbol ``expr`` (a size torch computes from tensor values): dim
        ``dim`` of IR value ``value``, or (``dim`` None) the value of its one element."""
        name = next(n for k in itertools.count(len(self.runtime))
                    if (n := f"u{k}") not in self.table and n not in self.runtime)
        vr = self.ranges.get(str(expr))
        lower = max(0, int(vr.lower)) if vr is not None and vr.lower.is_Integer else 0
        upper = int(vr.upper) if vr is not None and vr.upper.is_Integer else None
        self.rename[sympy.Symbol(expr.name, integer=True, nonnegative=True)] = symbol(name)
        self.rename[sympy.Symbol(expr.name, integer=True)] = symbol(name)
        self.rename[expr] = symbol(name)
        self.runtime[name] = RuntimeSymbol(
            order=order, value=value, dim=dim, carrier=None if dim is not None else f"{name}_carrier",
            min=lower, max=upper, example=example, where=where[:2000])
        return name

    def expr(self, value: Any, what: str) -> str:
        if isinstance(value, bool):
            raise TraceError(f"{what}: expected an integer, got bool {value}")
        if isinstance(value, int):
            return str(value)
        if isinstance(value, (torch.SymInt, torch.SymBool)):
            return self.expr_of(value.node.shape_env.replace(value.node.expr),
                                value.node.shape_env.var_to_range, what)
        raise TraceError(f"{what}: {value!r} is not an integer size")

    def expr_of(self, torch_expr: sympy.Basic, ranges: Any, what: str) -> str:
        """IR text of ``torch_expr`` (torch's sympy expression, ``ranges`` its symbols')."""
        torch_expr = _without_piecewise(torch_expr)
        try:  # next_power_of_2 and friends: exact step functions over the declared range
            raw = size_functions.tighten(size_functions.rewrite(torch_expr, ranges), ranges)
        except SymbolicError as exc:
            raise TraceError(f"{what} = {torch_expr}: {exc}") from None
        plain = to_plain_sympy(raw)
        size_functions.check_same(torch_expr, plain, ranges, what)
        plain = plain.xreplace({s: self.rename.get(s, self.rename.get(
            sympy.Symbol(s.name, integer=True, nonnegative=True), s)) for s in plain.free_symbols})
        unknown = {s.name for s in plain.free_symbols} - set(self.table) - set(self.runtime)
        if unknown:
            raise TraceError(f"{what} = {raw} uses sizes {sorted(unknown)} that are not a "
                             f"dimension of any graph input (data-dependent or derived); "
                             f"kernel_lens needs every size to be a graph-input dimension")
        return format_expr(plain)


def _without_implied(checks: list[RuntimeCheck]) -> list[RuntimeCheck]:
    """``checks`` less those an equality among them implies (torch asserts ``u0 >= 12`` and
    ``u0 <= 12`` beside ``Eq(u0, 12)``): the equality, which names why, is the one checked."""
    exprs = [parse(c.cond) for c in checks]
    pinned = {e.lhs: e.rhs for e in exprs if isinstance(e, sympy.Eq) and e.lhs.is_Symbol
              and e.rhs.is_Integer}
    return [c for c, e in zip(checks, exprs)  # only conditions on pinned symbols alone
            if not pinned or (isinstance(e, sympy.Eq) and e.lhs in pinned)
            or not e.free_symbols <= set(pinned) or e.xreplace(pinned) is not sympy.true]


def _same_sizes_from_values(node: torch.fx.Node, result: Any) -> list[tuple[Any, Any]]:
    """(outer, inner) unbacked symbols that are the same size: dims of ``node``'s result and of
    its decomposition's ``result`` (re-traced, the decomposition made sizes of its own)."""
    outer = node.meta.get("val")
    outer = list(outer) if isinstance(outer, (list, tuple)) else [outer]
    inner = result if isinstance(result, (list, tuple)) else [result]
    pairs = []
    for o, i in zip(outer, [r.meta.get("val") if isinstance(r, torch.fx.Node) else None for r in inner]):
        if isinstance(o, torch.Tensor) and isinstance(i, torch.Tensor) and o.dim() == i.dim():
            for so, si in zip(o.shape, i.shape):
                if isinstance(so, torch.SymInt) and isinstance(si, torch.SymInt):
                    eo, ei = so.node.expr, si.node.expr
                    if eo != ei and eo.is_Symbol and ei.is_Symbol and eo.name.startswith("u") \
                            and ei.name.startswith("u"):
                        pairs.append((eo, ei))
    return pairs


def _size_fact(cond: Any) -> bool:
    """An assert that holds for every size (``u0 >= 0``, which torch asserts of each count):
    no line of the model's code is behind it."""
    try:
        return all(bool(cond.xreplace({s: sympy.Integer(v) for s in cond.free_symbols}))
                   for v in (0, 1, 7, 1 << 20))
    except TypeError:  # not decidable at a point: a real condition
        return False


def _constant_of_trace(val: Any) -> bool:
    """A value the trace made a constant: an int/bool, or a symbolic one torch specialized."""
    if isinstance(val, (torch.SymInt, torch.SymBool)):
        expr = val.node.shape_env.replace(val.node.expr)
        return bool(expr.is_Number) or expr in (sympy.true, sympy.false)
    return isinstance(val, (bool, int))


def _without_piecewise(expr: sympy.Basic) -> sympy.Basic:
    """A condition on a ``Piecewise`` (``sym_ite(b, 1, 0)``: an ``.item()`` of a bool tensor) as
    the same condition in plain logic: Or over its branches of (branch condition, not an earlier
    one, the condition on the branch's value)."""
    while isinstance(expr, (sympy.Rel, sympy.And, sympy.Or, sympy.Not)) and expr.has(sympy.Piecewise):
        pw = next(iter(expr.atoms(sympy.Piecewise)))
        parts, taken = [], sympy.false
        for value, cond in pw.args:
            parts.append(sympy.And(cond, sympy.Not(taken), expr.xreplace({pw: value})))
            taken = sympy.Or(taken, cond)
        expr = sympy.simplify_logic(sympy.Or(*parts))
    return expr


def _dim_name(dynamic_shapes: Any, i: int, input_name: str, d: int, root: bool = False) -> str | None:
    """The user's Dim name for input ``i`` (``input_name``), dimension ``d``, if any; with
    ``root``, the name of the Dim a derived dim (``16*k``) is derived from (the symbol is it)."""
    if isinstance(dynamic_shapes, dict):
        entry = dynamic_shapes.get(input_name)
    elif isinstance(dynamic_shapes, (tuple, list)) and i < len(dynamic_shapes):
        entry = dynamic_shapes[i]
    else:
        entry = None
    if isinstance(entry, dict):
        dim = entry.get(d)
    elif isinstance(entry, (tuple, list)) and d < len(entry):
        dim = entry[d]
    else:
        dim = None
    if dim is not None and not hasattr(dim, "__name__") and input_name:  # Dim.AUTO / DYNAMIC
        return None if root else f"{input_name}_{d}"
    if root:
        return getattr(getattr(dim, "root", None), "__name__", None)
    return getattr(dim, "__name__", None)


# --- graph ---------------------------------------------------------------------------------
def _tensor_value(name: str, val: torch.Tensor, kind: str, syms: _Symbols) -> TensorValue:
    return TensorValue(
        name=name, dtype=dtype_from_torch(val.dtype), kind=kind,
        shape=[syms.expr(s, f"size {i} of {name}") for i, s in enumerate(val.shape)],
        strides=[syms.expr(s, f"stride {i} of {name}") for i, s in enumerate(val.stride())],
    )


def _storage_id(t: torch.Tensor) -> int | None:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError):
        return None


def user_line(node: torch.fx.Node) -> str | None:
    """Where the user's code made ``node``: the last frame of its stack trace outside torch,
    Triton, kernel_lens and installed packages, as ``file:line: code`` (None when unknown)."""
    trace = node.meta.get("stack_trace") or ""
    frames = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*(?:\n +(\S[^\n]*))?', trace)
    mine = [f for f in frames if is_user_file(f[0])]
    return located(*mine[-1]) if mine else None


def _returns_dtype(target: Any) -> bool:
    """An ATen op whose one result is a ScalarType (``result_type``, ``promote_types``)."""
    schema = getattr(target, "_schema", None)
    return schema is not None and len(schema.returns) == 1 \
        and str(schema.returns[0].real_type) == "ScalarType"  # (its .type prints as int)


def _constant(t: torch.Tensor) -> ConstantData:
    t = t.detach().contiguous().cpu()
    return ConstantData(dtype=dtype_from_torch(t.dtype), shape=list(t.shape),
                        data=t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


_SKIP_OPS = ("_assert", "sym_constrain", "_check")
_ITEM_OPS = ("aten.item.default", "aten._local_scalar_dense.default")
# data_ptr() of a fake tensor under torch.export (tensor_likes.Tokens): 2**40 apart per storage
_ADDRESS_TOKENS = (1 << 40, (1 << 40) * 4097)
# torch.export wraps a region that changes grad mode or turns autocast off (HF's rotary embedding
# does, on CUDA) in a higher-order op whose body is a submodule: inlined, it is the same ops.
_WRAPPERS = ("wrap_with_set_grad_enabled", "wrap_with_autocast")


class _GraphBuilder:
    def __init__(self, program, traced: list[TracedLaunch], captured: list[CapturedLaunch],
                 kernels: dict[str, KernelIR], launch_kernels: list[str], dynamic_shapes: Any,
                 variants: dict[int, list[tuple[dict[str, bool], str]]],
                 translatable: Callable[[str], bool] | None = None):
        self.program = program
        self.translatable = translatable
        self.variants = variants
        self.traced, self.captured = traced, captured
        self.kernels, self.launch_kernels = kernels, launch_kernels
        self.values: dict[str, TensorValue] = {}
        self.constants: dict[str, ConstantData] = {}
        self.alias: dict[str, str] = {}
        self.dtypes: dict[str, torch.dtype] = {}  # nodes computing a dtype (torch.result_type)
        self.ops: list[TorchOp] = []
        self.launches: list[Launch] = []
        self.checks: list[RuntimeCheck] = []
        self.items_seen = 0  # .item() nodes met so far (the replay's items are in this order)
        sig = program.graph_signature
        placeholders = {n.name: n for n in program.graph.nodes if n.op == "placeholder"}
        self.user_inputs = [placeholders[s.arg.name] for s in sig.input_specs
                            if s.kind == InputKind.USER_INPUT]
        self.syms = _Symbols(program, self.user_inputs, dynamic_shapes)
        state = {**program.state_dict, **program.constants}
        for s in sig.input_specs:
            node = placeholders[s.arg.name]
            if s.kind == InputKind.USER_INPUT:
                if not isinstance(node.meta.get("val"), torch.Tensor):
                    raise UnsupportedKernelError(f"graph input {node.name!r} is not a tensor; "
                                                 f"pass only tensors to the model")
                self.values[node.name] = _tensor_value(node.name, node.meta["val"], "input", self.syms)
            else:
                self.values[node.name] = _tensor_value(node.name, node.meta["val"], "constant", self.syms)
                self.constants[node.name] = _constant(state[s.target])

    def arg(self, a: Any) -> Any:
        if isinstance(a, torch.fx.Node):
            val = a.meta.get("val")
            if isinstance(val, torch.Tensor):
                return ValueArg(ref=self.alias.get(a.name, a.name))
            if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
                return SymArg(sym=self.syms.expr(val, f"value {a.name}"))
            if a.name in self.dtypes:  # torch.result_type(...): a constant of the trace
                return ConstArg(const=str(self.dtypes[a.name]))
            raise UnsupportedKernelError(f"torch value {a.name} of type {type(val).__name__} "
                                         f"cannot be represented in the IR")
        if isinstance(a, torch.SymInt):  # a size a decomposition took as a constant
            return SymArg(sym=self.syms.expr(a, "size argument"))
        if isinstance(a, (list, tuple)):
            return ListArg(items=[self.arg(x) for x in a])
        if isinstance(a, int) and not isinstance(a, bool) and _ADDRESS_TOKENS[0] <= a < _ADDRESS_TOKENS[1]:
            raise UnsupportedKernelError(
                f"torch op argument {a} is a tensor's address (data_ptr()) under torch.export: the "
                f"forward computes with tensor addresses (a table of pointers for a kernel to "
                f"dereference); a deployed model's buffers have addresses unknown at compile time: "
                f"pass the tensors to the kernel as arguments (a tuple of tensors works)")
        if a is None or isinstance(a, (bool, int, float, str)):
            return ConstArg(const=a)
        if isinstance(a, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
            return ConstArg(const=str(a))
        raise UnsupportedKernelError(f"torch op argument {a!r} of type {type(a).__name__} "
                                     f"cannot be represented in the IR")

    def build(self) -> tuple[list[str], list[str]]:
        order = 0
        for node in self.program.graph.nodes:
            if node.op == "call_function":
                try:
                    order = self._node(node, order)
                except (TraceError, UnsupportedKernelError) as exc:
                    where = user_line(node)
                    if where is None or type(exc) not in (TraceError, UnsupportedKernelError):
                        raise
                    raise type(exc)(f"{exc} (in the model at {where})") from exc
        out_node = next(n for n in self.program.graph.nodes if n.op == "output")
        outputs = []
        for o in out_node.args[0]:
            if not isinstance(o, torch.fx.Node) or not isinstance(o.meta.get("val"), torch.Tensor):
                raise UnsupportedKernelError(f"model output {o!r} is not a tensor; return tensors only")
            outputs.append(self.alias.get(o.name, o.name))
        return [n.name for n in self.user_inputs], outputs

    def _node(self, node: torch.fx.Node, order: int, depth: int = 0) -> int:
        """Add one call_function node at position ``order``; returns the next position."""
        val = node.meta.get("val")
        if node.target is LAUNCH_OP:
            self.launches.append(self.launch(node, order))
        elif node.target is operator.getitem:
            item = f"{self.alias.get(node.args[0].name, node.args[0].name)}_{node.args[1]}"
            self.alias[node.name] = self.alias.get(item, item)  # an inlined body's result
            return order
        elif "_assert_scalar" in str(node.target):
            return self._runtime_check(node, order)
        elif any(s in str(node.target) for s in _SKIP_OPS) or isinstance(val, (torch.SymInt, torch.SymBool, int, bool)):
            return self._bind_unbacked(node, order, items=True)
        elif _returns_dtype(node.target):  # result_type, promote_types: fixed by the input dtypes
            args = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
            self.dtypes[node.name] = node.target(*args)
            return order
        elif getattr(node.target, "__name__", None) in _WRAPPERS:
            return self._inline_wrapper(node, order, depth)
        elif depth < 4 and self.translatable is not None \
                and needs_decomposition(node.target, self.translatable) and (graph := decompose(node)) is not None:
            return self._inline(node, graph, order, depth)
        else:
            after = self._bind_unbacked(node, order + 1, items=False)  # names its sizes first
            self.ops.append(self.torch_op(node, order, val))
            return after
        return order + 1

    # --- sizes from tensor values (see frontends/capture/data_values.py) ----------------------
    def _bind_unbacked(self, node: torch.fx.Node, order: int, items: bool) -> int:
        """Name the unbacked symbols ``node`` makes (torch's ``unbacked_bindings``): a dim of its
        result (nonzero's count) after its op, or (``items``) the value of its input's one
        element (``.item()``), with a carrier: a tensor of no elements whose dim 0 it is."""
        replay = getattr(self.traced, "replay", None)
        if items and str(node.target) in _ITEM_OPS and replay is not None:
            k, self.items_seen = self.items_seen, self.items_seen + 1
            if k < len(replay.items) and _constant_of_trace(node.meta.get("val")):
                return self._pinned_item(node, order, *replay.items[k])
        for sym, path in (node.meta.get("unbacked_bindings") or {}).items():
            if str(sym) in {str(k) for k in self.syms.rename}:
                continue
            path = tuple(path)
            example = replay.values.get(sym) if replay is not None else None
            where = (replay.made_at.get(sym, "") if replay is not None else "") or user_line(node) or ""
            if example is None:
                raise TraceError(f"torch made the size {sym} from tensor values at {where or node.name}, "
                                 f"and the eager run gave kernel_lens no value for it: the forward's "
                                 f"data-dependent ops differ between the eager run and torch.export")
            index = None
            if path and isinstance(path[0], SequenceKey):
                index, path = path[0].idx, path[1:]
            if len(path) == 2 and isinstance(path[0], CallMethodKey) and path[0].name == "size" \
                    and isinstance(path[1], SequenceKey) and not items:
                value = node.name if index is None else f"{node.name}_{index}"
                self.syms.add_runtime(sym, order, value, path[1].idx, example, where)
                order += 1
            elif items and index is None and path in ((), (ConvertIntKey(),)) and node.args \
                    and isinstance(node.args[0], torch.fx.Node) \
                    and isinstance(node.args[0].meta.get("val"), torch.Tensor):
                self._item_symbol(sym, order, node.args[0], example, where)
                order += 1
            elif not items and path == (CallMethodKey("storage_offset"),):
                continue  # a view's offset: ONNX copies views; anything reading it is refused unnamed
            else:
                raise UnsupportedKernelError(
                    f"torch computes the size {sym} from tensor values at {where or node.name} "
                    f"through {node.target} ({path}); kernel_lens takes sizes from a dim of a "
                    f"tensor (nonzero's count) or the value of a one-element tensor (.item())")
        return order

    def _item_symbol(self, sym: Any, order: int, tensor: torch.fx.Node, example: int, where: str) -> str:
        """The run-time symbol ``sym`` = ``tensor.item()`` at ``order``, with its carrier (a
        tensor of no elements and shape [symbol, 0], made by an allocation at ``order``)."""
        source = self.alias.get(tensor.name, tensor.name)
        if example < 0:
            raise UnsupportedKernelError(
                f"the value of .item() at {where} is negative in the example ({example}): "
                f"kernel_lens takes run-time sizes and scalars from .item() values >= 0")
        if self.values[source].dtype.is_float:
            raise UnsupportedKernelError(
                f"a size is computed from the value of a floating-point tensor ({source}) at "
                f"{where}: run-time sizes come from integer or bool tensors")
        name = self.syms.add_runtime(sym, order, source, None, example, where)
        carrier = self.syms.runtime[name].carrier
        self.values[carrier] = TensorValue(name=carrier, dtype=DType.u8, kind="intermediate",
                                           shape=[name, "0"], strides=["1", "1"])
        self.ops.append(TorchOp(order=order, op="aten.empty.memory_format",
                                args=[ListArg(items=[SymArg(sym=name), ConstArg(const=0)])],
                                kwargs={"dtype": ConstArg(const="torch.uint8")}, outputs=[carrier]))
        return name

    def _pinned_item(self, node: torch.fx.Node, order: int, sym: Any, value: int, where: str) -> int:
        """An ``.item()`` whose value the model's code made a constant of the trace (``int()``
        of it, or a branch that pins it): the graph computes it at run time and checks that it
        is still the example's value; another value is refused, naming the line."""
        if not isinstance(node.args[0], torch.fx.Node):
            return order
        fake = sympy.Symbol(f"pinned_{order}", integer=True)
        name = self._item_symbol(fake, order, node.args[0], int(value), where)
        self.checks.append(RuntimeCheck(
            order=order + 1, cond=f"Eq({name}, {int(value)})",
            where=f"{where} (the model's code makes this tensor value a constant of the trace, "
                  f"{int(value)}: int() of a tensor, or a branch pinning it; keep it a size "
                  f"with .item() instead of int(), or give extra_examples)"[:2000]))
        return order + 2

    def _runtime_check(self, node: torch.fx.Node, order: int) -> int:
        """torch's run-time assert on sizes from tensor values: an IR check, naming the line of
        the model's branch it stands for (the other asserts hold over the declared ranges:
        trace checked them)."""
        cond = node.args[0]
        val = cond.meta.get("val") if isinstance(cond, torch.fx.Node) else cond
        if not isinstance(val, torch.SymBool):
            return order
        expr = val.node.shape_env.replace(val.node.expr)
        if not any(s.name.startswith("u") for s in expr.free_symbols):
            return order
        replay = getattr(self.traced, "replay", None)
        where = ""
        if replay is not None:
            mine = {s.name for s in expr.free_symbols}
            same = [w for g, w in replay.guards if {s.name for s in g.free_symbols} == mine]
            near = [w for g, w in replay.guards if {s.name for s in g.free_symbols} & mine]
            asserted = [w for g, w in replay.asserts
                        if {s.name for s in g.free_symbols} & mine and w and not _size_fact(g)]
            where = (same or near or asserted or [""])[-1]  # a branch, else a torch._check
            if not where:
                where = next((replay.made_at[s] for s in expr.free_symbols if s in replay.made_at), "")
        text = self.syms.expr(val, f"run-time condition {expr}")
        if text == "True":
            return order
        self.checks.append(RuntimeCheck(order=order, cond=text, where=where[:2000]))
        return order + 1

    def _inline_wrapper(self, node: torch.fx.Node, order: int, depth: int) -> int:
        """Replace a grad-mode or autocast-off wrapper by the ops of its body."""
        at = next(i for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node) and a.op == "get_attr")
        if node.target.__name__ == "wrap_with_autocast" and node.args[2]:
            raise UnsupportedKernelError(
                f"node {node.name}: an autocast region (torch.autocast(..., enabled=True)) inside "
                f"the forward: ONNX has no autocast; cast explicitly (.to(dtype)) instead")
        # the body is an attribute of the module owning the node's graph (a wrapper's body may
        # itself hold wrappers: HF's rotary embedding is no_grad around autocast-off)
        body = getattr(node.graph.owning_module, node.args[at].target)
        return self._inline(node, body, order, depth, list(node.args[at + 1:]))

    def _inline(self, node: torch.fx.Node, graph: torch.fx.GraphModule, order: int,
                depth: int, args: list | None = None) -> int:
        """Replace ``node`` by the ops of ``graph`` (its decomposition, see :mod:`.decompose`,
        or a wrapper's body), whose placeholders take ``args`` (default: the tensor arguments)."""
        subs = list(graph.graph.nodes)
        for sub in subs:
            sub.name = f"{node.name}_{sub.name}"
        for placeholder, arg in zip([n for n in subs if n.op == "placeholder"],
                                    tensor_args(node) if args is None else args):
            if isinstance(arg, torch.fx.Node):
                self.alias[placeholder.name] = self.alias.get(arg.name, arg.name)
        result = next(n for n in subs if n.op == "output").args[0]
        same = _same_sizes_from_values(node, result)
        replay = getattr(self.traced, "replay", None)
        for outer, inner in same if replay is not None else ():  # the re-trace made new symbols
            if outer in replay.values and inner not in replay.values:
                replay.values[inner] = replay.values[outer]
                replay.made_at[inner] = replay.made_at.get(outer, "")
        for sub in subs:
            if sub.op == "call_function":
                order = self._node(sub, order, depth + 1)
        for outer, inner in same:  # the forward's later ops read the outer symbol: the same size
            named = self.syms.rename.get(inner)
            if named is not None:
                for variant in (outer, sympy.Symbol(outer.name, integer=True),
                                sympy.Symbol(outer.name, integer=True, nonnegative=True)):
                    self.syms.rename[variant] = named
        leaves = result if isinstance(result, (list, tuple)) else [result]
        if not all(isinstance(r, torch.fx.Node) for r in leaves):
            raise UnsupportedKernelError(
                f"torch op {node.target} (node {node.name}) decomposes to a graph whose result is "
                f"a constant ({[r for r in leaves if not isinstance(r, torch.fx.Node)][:3]}), not "
                f"a tensor; kernel_lens cannot lower it: compute it outside the compiled forward")
        if isinstance(node.meta.get("val"), (list, tuple)):
            for i, r in enumerate(result):
                self.alias[f"{node.name}_{i}"] = self.alias.get(r.name, r.name)
        else:
            result = result[0] if isinstance(result, (list, tuple)) else result
            self.alias[node.name] = self.alias.get(result.name, result.name)
        return order

    def torch_op(self, node: torch.fx.Node, order: int, val: Any) -> TorchOp:
        vals = val if isinstance(val, (list, tuple)) else [val]
        names = [node.name] if not isinstance(val, (list, tuple)) else \
            [f"{node.name}_{i}" for i in range(len(vals))]
        outputs = []
        for name, v in zip(names, vals):
            if isinstance(v, torch.Tensor):
                self.values[name] = _tensor_value(name, v, "intermediate", self.syms)
                outputs.append(name)
        return TorchOp(order=order, op=_op_name(node.target),
                       args=[self.arg(a) for a in node.args],
                       kwargs={k: self.arg(v) for k, v in node.kwargs.items()}, outputs=outputs,
                       aliases=self._aliased_inputs(node))

    def _aliased_inputs(self, node: torch.fx.Node) -> list[str]:
        """Tensor inputs whose memory the op's outputs really share (views, in-place ops).

        Decided by storage identity of the traced fake tensors, not by the schema's may-alias
        annotations: reshape/contiguous alias only when torch did not copy.
        """
        val = node.meta.get("val")
        outs = [v for v in (val if isinstance(val, (list, tuple)) else [val])
                if isinstance(v, torch.Tensor)]
        storages = {_storage_id(v) for v in outs} - {None}
        return [self.alias.get(a.name, a.name) for a in node.all_input_nodes
                if isinstance(a.meta.get("val"), torch.Tensor)
                and _storage_id(a.meta["val"]) in storages]

    def launch(self, node: torch.fx.Node, order: int) -> Launch:
        index = node.args[0]
        traced, captured = self.traced[index], self.captured[index]
        kernel = self.kernels[self.launch_kernels[index]]
        tensor_nodes = iter(node.args[1])
        values = {name: value for name, value, _ in arguments.walk_values(captured.jit, traced.args)}
        args = []
        for p in kernel.leaves():
            value = values[p.name]
            what = f"kernel {kernel.name} argument {p.name!r}"
            if p.kind == ParamKind.tensordesc:
                base = value.base
                args.append(LaunchArg(
                    name=p.name, role=p.role.value if p.role else None,
                    value=self._tensor_ref(next(tensor_nodes)),
                    shape=[self.syms.expr(s, what) for s in base.shape],
                    strides=[self.syms.expr(s, what) for s in base.stride()],
                    storage_offset=self.syms.expr(base.storage_offset(), what),
                    desc_shape=[self.syms.expr(s, what) for s in value.shape],
                    desc_strides=[self.syms.expr(s, what) for s in value.strides],
                    constant=value.padding))
            elif isinstance(value, torch.Tensor):
                args.append(LaunchArg(
                    name=p.name, role=p.role.value if p.role else None,
                    value=self._tensor_ref(next(tensor_nodes)),
                    shape=[self.syms.expr(s, what) for s in value.shape],
                    strides=[self.syms.expr(s, what) for s in value.stride()],
                    storage_offset=self.syms.expr(value.storage_offset(), what)))
            elif p.kind == ParamKind.constexpr:
                args.append(LaunchArg(name=p.name, role="constexpr", constant=p.constexpr_value))
            elif isinstance(value, torch.SymInt) or (isinstance(value, int) and not isinstance(value, bool)
                                                     and -2**63 <= value < 2**63):
                args.append(LaunchArg(name=p.name, role="scalar", expr=self.syms.expr(value, what)))
            else:
                args.append(LaunchArg(name=p.name, role="scalar", constant=value))
        grid = tuple(self.syms.expr(g, f"kernel {kernel.name} grid[{i}]")
                     for i, g in enumerate(traced.grid))
        guards = {name: self.syms.expr(value, f"kernel {kernel.name} constexpr {name!r}")
                  for name, value in traced.guards.items()}
        dispatch = [Dispatch(when=when, kernel=self.kernels[kid].id)
                    for when, kid in self.variants.get(index, [])]
        return Launch(order=order, kernel=kernel.id, grid=grid, args=args,
                      captured_grid=captured.grid, guards=guards, dispatch=dispatch)

    def _tensor_ref(self, ref: torch.fx.Node) -> str:
        return self.alias.get(ref.name, ref.name)


def _op_name(target: Any) -> str:
    name = str(target)
    return name.removeprefix("torch.ops.")


# --- entry point ----------------------------------------------------------------------------
def auto_dynamic_shapes(example_inputs: tuple) -> tuple:
    """``dynamic=True``: every dim of every input may vary (torch.export's ``Dim.AUTO``); torch
    keeps static the dims the forward pins (weights' sizes, size-1 dims) and settles the rest."""
    return tuple({d: torch.export.Dim.AUTO for d in range(t.dim())} for t in example_inputs)


def describe_dims(ir: GraphIR) -> str:
    """One line per dynamic dim: which input and dim, and the range torch settled on."""
    lines = []
    for name, info in ir.symbols.items():
        where = f"{ir.inputs[info.input]}.shape[{info.dim}]"
        if info.scale != 1 or info.offset:
            where = f"({where} - {info.offset}) / {info.scale}" if info.offset else f"{where} / {info.scale}"
        upper = "inf" if info.max is None else str(info.max)
        lines.append(f"{name} = {where} in [{info.min}, {upper}] (example {info.example})")
    return "\n".join(lines) if lines else "(no dynamic dims: every size is static)"


def _make_static(model: Callable, shapes: tuple, dims: list[tuple[str, int]]) -> bool:
    """Mark ``dims`` ((forward argument name or ``args[i]``, dim)) static in ``shapes``;
    False when none of them could be (so tracing again would fail the same way)."""
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        names = list(inspect.signature(forward).parameters)
    except (TypeError, ValueError):
        names = []
    changed = False
    for label, d in dims:
        match = re.fullmatch(r"\w+\[(\d+)\]", label)
        i = int(match.group(1)) if match else names.index(label) if label in names else None
        static = torch.export.Dim.STATIC
        if i is not None and i < len(shapes) and shapes[i].get(d, static) is not static:
            shapes[i][d] = static
            changed = True
    return changed


def lift_with_outputs(model: Callable, example_inputs: tuple, *, dynamic_shapes: Any = None,
                      arch: int | Iterable[int] | None = None,
                      roles: dict[str, dict[str, str]] | None = None,
                      autotune: dict[str, dict] | None = None,
                      name: str | None = None, dynamic: bool = False,
                      translatable: Callable[[str], bool] | None = None,
                      extra_examples: Any = None, own_kernels: frozenset[str] = frozenset()) -> tuple[GraphIR, Any]:
    """The front half (capture, trace, AOT compile) ending in GraphIR, and what the captured
    eager forward returned (:func:`kernel_lens.compiler.lift` is the public entry).

    ``translatable`` says which ATen ops (``"aten.name.overload"``) the back end translates;
    the others are replaced by torch's decomposition where there is one. None keeps every op
    as traced. (The driver, :func:`kernel_lens.compiler.lift`, passes the ONNX lowering's.)

    ``dynamic=True`` makes every input dim that can vary dynamic (``Dim.AUTO``) instead of
    ``dynamic_shapes``; the ranges torch settled on are logged and are the IR's ``symbols``.

    A forward whose Python code branches on a size inside the declared range is lifted piece by
    piece (:mod:`.size_pieces`): the result then has ``pieces``, one graph per part of the range.

    ``arch`` is one compute capability or several (``[80, 90]``): every kernel gets binaries for
    each; the capture runs for the first (the IR's ``arch``).

    ``extra_examples`` (a list of input tuples) are traced too; where they take other branches on
    tensor values than the example, the result has ``branches`` (:mod:`.value_branches`).

    ``own_kernels`` (``optimize=2``'s front-end pass names) puts kernel_lens's own skinny GEMM in
    place of ``F.linear`` calls with at most 16 rows and its decode attention in place of
    one-position ``F.scaled_dot_product_attention`` calls (:mod:`.own_kernels`)."""
    example_inputs = check_example_inputs(example_inputs)
    if dynamic and dynamic_shapes is not None:
        raise InputError("pass either dynamic=True or dynamic_shapes, not both (dynamic=True "
                         "makes every input dim that can vary dynamic)")
    if dynamic:
        dynamic_shapes = auto_dynamic_shapes(example_inputs)
    else:
        check_dynamic_shapes(model, example_inputs, dynamic_shapes)  # before any work
        dynamic_shapes = one_dim_per_name(dynamic_shapes)
    archs = check_archs(default_arch() if arch is None else arch)
    roles = check_roles(roles)
    if not callable(model):
        raise InputError(f"model must be a torch.nn.Module or a callable, got {type(model).__name__}")
    check_forward_takes(model, example_inputs, _forward_line(model))  # before the capture
    display = name or getattr(model, "__name__", None) or type(model).__name__

    def lift_one(inputs: tuple, shapes: Any) -> tuple[GraphIR, Any]:
        return _lift_graph(model, inputs, shapes, archs=archs, roles=roles, autotune=autotune,
                           display=display, dynamic=dynamic, translatable=translatable,
                           needed=inputs is example_inputs, own_kernels=own_kernels)

    names = input_names(model, len(example_inputs))
    example_inputs = tuple(example_inputs)  # the one object lift_one sees for the user's example
    extra = value_branches.check_extra_examples(extra_examples, tuple(example_inputs), names)
    for k, inputs in enumerate(extra):
        check_distinct(inputs, f"extra_examples[{k}]")
    ir, outputs = size_pieces.lift_in_pieces(lift_one, example_inputs, dynamic_shapes, names)

    def traced_again(inputs: tuple, shapes: Any) -> GraphIR:  # the same, without binaries
        return _lift_graph(model, inputs, shapes, archs=archs, roles=roles, autotune=autotune,
                           display=display, dynamic=dynamic, translatable=translatable,
                           binaries=False, own_kernels=own_kernels)[0]
    native = any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)
    ir = size_pieces.prove_ends(ir, traced_again, tuple(example_inputs), dynamic_shapes, names,
                                size_pieces.PROOF_BUDGET_GPU if native else size_pieces.PROOF_BUDGET_CPU,
                                forward=_forward_line(model))
    ir = value_branches.lift_branches(lift_one, ir, extra, dynamic_shapes, names)
    if not any(g.launches for g in ir.graphs()):
        raise CaptureError("the forward launched no @triton.jit kernel; nothing to compile")
    if dynamic:
        log.info("dynamic=True settled on:\n%s", describe_dims(ir))
    return ir, outputs


def _forward_line(model: Callable) -> str:
    """``file:line`` of the model's forward (the code a size-range error is about), or ''."""
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        return f"{inspect.getsourcefile(forward)}:{inspect.getsourcelines(forward)[1]}"
    except (OSError, TypeError):
        return ""


def input_names(model: Callable, count: int) -> list[str]:
    """The forward's argument names: ``caches[k]`` for the k-th argument a ``*caches`` parameter
    takes (as torch.export names its sources), ``args[i]`` for unknown ones."""
    forward = model.forward if isinstance(model, torch.nn.Module) else model
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    rest = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), None)
    return [names[i] if i < len(names) else f"{rest}[{i - len(names)}]" if rest else f"args[{i}]"
            for i in range(count)]


def _trace(model: Callable, example_inputs: tuple, dynamic_shapes: Any, captured: Any,
           dynamic: bool, substituted: Callable[[bool], Any]) -> tuple[Any, list[TracedLaunch]]:
    """torch.export of the forward; ``dynamic=True``: again with the dims a constexpr pins
    made static."""
    while True:
        try:
            with progress.stage("trace"), substituted(True):  # torch.export
                return trace(model, tuple(example_inputs), dynamic_shapes, captured.launches)
        except DynamicConstexprError as exc:  # dynamic=True: a constexpr pins these dims
            if not dynamic or not _make_static(model, dynamic_shapes, exc.dims):
                raise
            log.info("dynamic=True: %s are static (a kernel constexpr depends on them)",
                     ", ".join(f"{n}.shape[{d}]" for n, d in exc.dims))


def _lift_graph(model: Callable, example_inputs: tuple, dynamic_shapes: Any, *,
                archs: tuple[int, ...],
                roles: dict, autotune: dict | None, display: str, dynamic: bool,
                translatable: Callable[[str], bool] | None,
                binaries: bool = True, needed: bool = False,
                own_kernels: frozenset[str] = frozenset()) -> tuple[GraphIR, Any]:
    """Capture, trace and AOT-compile one graph (see :func:`lift_with_outputs`); with
    ``binaries=False`` the kernels get no binaries (a graph traced only to be compared). It may
    launch no kernel (a piece or a branch where the forward launches none) unless ``needed``
    (the user's own example: said at once); the model as a whole must launch one
    (:func:`lift_with_outputs`)."""
    own = OwnKernels(archs[0], linear=OWN_GEMM in own_kernels, attention=ATTENTION in own_kernels,
                     archs=archs) \
        if own_kernels else None

    def substituted(tracing: bool) -> Any:
        return own.active(model, tracing) if own is not None else contextlib.nullcontext()

    while True:
        with progress.stage("capture"), substituted(False):  # the eager run recording the launches
            captured = capture(model, tuple(example_inputs), archs[0], autotune, launches_needed=needed,
                               after_launch=own.launched if own is not None else None)
        if own is not None and (own.mismatched or own.plan()):  # optimize=2: see own_kernels
            if own.mismatched:
                log.info("optimize=2: %s; capturing again", own.retry())
            continue
        try:
            program, traced = _trace(model, example_inputs, dynamic_shapes, captured, dynamic,
                                     substituted)
        except Exception:
            if own is None or not own.mismatched:
                raise
        if own is None or not own.mismatched:
            break
        log.info("optimize=2: %s; capturing again", own.retry())
    variant_launches, owners = guard_variants(captured.launches, traced)
    kernels, launch_kernels = build_kernels(captured.launches + [v for v, _ in variant_launches])
    variants: dict[int, list[tuple[dict[str, bool], str]]] = {}
    for (launch, when), owner, kid in zip(variant_launches, owners,
                                          launch_kernels[len(captured.launches):]):
        variants.setdefault(owner, []).append((when, kid))
    apply_role_overrides(kernels, roles or {})
    builder = _GraphBuilder(program, traced, captured.launches, kernels, launch_kernels,
                            dynamic_shapes, variants, translatable)
    inputs, outputs = builder.build()
    for kernel in kernels.values() if binaries else ():
        for arch in archs:
            kernel.binaries.append(compile_binary(kernel, arch, kernel.specialization, specialized=True))
    ir = GraphIR(
        name=safe_identifier(display), display_name=str(display)[:512], arch=archs[0], symbols=builder.syms.table, inputs=inputs,
        outputs=outputs, values=builder.values, constants=builder.constants, ops=builder.ops,
        launches=builder.launches, kernels=kernels, runtime_symbols=builder.syms.runtime,
        checks=_without_implied(builder.checks),
    )
    return ir, captured.outputs
