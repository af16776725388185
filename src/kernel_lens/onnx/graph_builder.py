"""The ONNX graph a :class:`kernel_lens.onnx.lower.Lowering` builds: fresh names, nodes, shared
constants and the integer arithmetic of symbolic sizes (computed at run time from the graph
inputs' dims). A mixin: the lowering's state (``nodes``, ``taken``, ``_cache``, ...) is set up by
:class:`Lowering`'s constructor."""

from __future__ import annotations

from typing import Any, Union

import onnx
import sympy
from onnx import helper

from ..errors import UnsupportedKernelError
from ..ir.graph import ConstArg, OpArg, SymArg, TensorValue
from ..ir.symbolic import parse
from ..ir.types import DType
from .context import onnx_dtype

_FP8 = {DType.fp8e4nv, DType.fp8e5}


class GraphBuilder:
    """Node and constant building for the lowering (see the module docstring)."""

    # --------------------------------------------------------------------- names and nodes
    def fresh(self, hint: str) -> str:
        while True:
            self._counter += 1
            name = f"{hint}.{self._counter}"  # '.' never occurs in IR value names
            if name not in self.taken:
                self.taken.add(name)
                return name

    def node(self, op_type: str, inputs: list[str], n_out: int = 1, *, domain: str = "",
             outputs: list[str] | None = None, **attrs: Any) -> Union[str, list[str]]:
        """Append a node; returns its output name (a list when ``n_out > 1``)."""
        outs = outputs or [self.fresh(f"{self._scope}/{op_type}") for _ in range(n_out)]
        self.taken.update(outs)
        self._counter += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, domain=domain or None,
                                           name=f"{self._scope}/{op_type}_{self._counter}",
                                           **attrs))
        return outs if len(outs) > 1 else outs[0]

    def _cached(self, key: Any, build, scope: str = "shape") -> str:
        """Build a helper tensor once (constants, symbolic sizes); shared by every user."""
        if key not in self._cache:
            scope, self._scope = self._scope, scope
            try:
                self._cache[key] = build()
            finally:
                self._scope = scope
            self.shared.add(self._cache[key])
        return self._cache[key]

    # --------------------------------------------------------------------- constants
    def constant(self, values: Any, dtype: DType, dims: list[int]) -> str:
        flat = values if isinstance(values, list) else [values]
        key = ("const", DType(dtype), tuple(dims), tuple(map(repr, flat)))
        if dtype in _FP8 and self.opset < 19:
            raise UnsupportedKernelError(f"{dtype.value} constants need opset 19+")

        def build() -> str:
            tensor = helper.make_tensor("value", onnx_dtype(dtype), dims, flat)
            return self.node("Constant", [], value=tensor)
        return self._cached(key, build, "const")

    def i64(self, values: list[int]) -> str:
        """A 1-D int64 constant."""
        return self.constant([int(v) for v in values], DType.i64, [len(values)])

    def scalar(self, value: Any, dtype: DType) -> str:
        """A 0-d constant of ``dtype`` (a Python number or bool)."""
        dtype = DType(dtype)
        if dtype == DType.i1:
            value = bool(value)
        elif not dtype.is_float:
            value = int(value)
        else:
            value = float(value)
        return self.constant(value, dtype, [])

    def full(self, shape: str, value: Any, dtype: DType) -> str:
        """A tensor of ``shape`` (a 1-D int64 tensor) filled with ``value``."""
        dtype = DType(dtype)
        # ConstantOfShape lacks some types at some opsets (bfloat16 before 20): fill, then cast
        vdt = dtype if self._type_ok("ConstantOfShape", "T2", dtype) else DType.fp32
        if vdt == DType.i1:
            value = bool(value)
        elif not vdt.is_float:
            value = int(value)
        out = self.node("ConstantOfShape", [shape],
                        value=helper.make_tensor("value", onnx_dtype(vdt), [1], [value]))
        return self.cast(out, vdt, dtype)

    def _type_ok(self, op_type: str, param: str, dtype: DType) -> bool:
        """Whether ``op_type`` at this opset accepts ``dtype`` for type parameter ``param``."""
        name = helper.tensor_dtype_to_string(onnx_dtype(dtype)).split(".")[-1].lower()
        schema = onnx.defs.get_schema(op_type, self.opset)
        return any(c.type_param_str == param and f"tensor({name})" in c.allowed_type_strs
                   for c in schema.type_constraints)

    def cast(self, name: str, src: DType, dst: DType) -> str:
        src, dst = DType(src), DType(dst)
        if src == dst:
            return name
        if (src in _FP8 or dst in _FP8) and self.opset < 19:
            raise UnsupportedKernelError(f"casting {src.value} -> {dst.value} needs opset 19+")
        return self.node("Cast", [name], to=onnx_dtype(dst))

    def scalar_of(self, name: str) -> str:
        """[1]-shaped -> 0-d."""
        return self.node("Squeeze", [name, self.i64([0])])

    # --------------------------------------------------------------------- symbolic integers
    def sym(self, expr: Union[str, sympy.Expr]) -> str:
        """A [1]-shaped int64 tensor holding the expression's value at run time."""
        e = parse(expr, self.sym_names) if isinstance(expr, str) else expr
        return self._cached(("sym", e), lambda: self._lower_expr(e))

    def _lower_expr(self, e: sympy.Expr) -> str:
        if e.is_Integer:
            return self.i64([int(e)])
        if e.is_Symbol:
            return self._symbol(e.name)
        if isinstance(e, sympy.Add):
            return self._fold("Add", [self.sym(a) for a in e.args])
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if not coeff.is_Integer:
                num, den = e.as_numer_denom()  # exact only if it divides: floor it explicitly
                raise UnsupportedKernelError(f"symbolic expression {e} is not an integer "
                                             f"expression (use floor({num}/{den}))")
            parts = [self.sym(a) for a in sympy.Mul.make_args(rest)]
            if coeff != 1:
                parts.append(self.i64([int(coeff)]))
            return self._fold("Mul", parts)
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = (self.sym(x) for x in sympy.fraction(sympy.together(e.args[0])))
            if isinstance(e, sympy.floor):  # (n - mod(n, d)) / d: exact, any signs (d > 0)
                exact = self.node("Sub", [num, self.node("Mod", [num, den], fmod=0)])
            else:  # (n + mod(-n, d)) / d
                neg = self.node("Neg", [num])
                exact = self.node("Add", [num, self.node("Mod", [neg, den], fmod=0)])
            return self.node("Div", [exact, den])
        if isinstance(e, sympy.Mod):
            return self.node("Mod", [self.sym(e.args[0]), self.sym(e.args[1])], fmod=0)
        if isinstance(e, (sympy.Min, sympy.Max)):
            return self.node("Min" if isinstance(e, sympy.Min) else "Max",
                             [self.sym(a) for a in e.args])
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp >= 0:
            return self._fold("Mul", [self.sym(e.base)] * int(e.exp)) if e.exp > 0 else self.i64([1])
        raise UnsupportedKernelError(f"symbolic expression {e} ({type(e).__name__}) cannot be "
                                     f"computed at run time by the ONNX lowering")

    def _fold(self, op_type: str, parts: list[str]) -> str:
        out = parts[0]
        for p in parts[1:]:
            out = self.node(op_type, [out, p])
        return out

    def truth(self, expr: Union[str, sympy.Basic]) -> str:
        """A [1]-shaped bool tensor holding a condition on sizes at run time."""
        e = parse(expr, self.sym_names) if isinstance(expr, str) else expr
        if e in (sympy.true, sympy.false):
            return self.constant(bool(e), DType.i1, [1])
        if isinstance(e, (sympy.And, sympy.Or)):
            return self._fold("And" if isinstance(e, sympy.And) else "Or", [self.truth(a) for a in e.args])
        if isinstance(e, sympy.Not):
            return self.node("Not", [self.truth(e.args[0])])
        compare = {sympy.Eq: "Equal", sympy.Ne: "Equal", sympy.Lt: "Less", sympy.Le: "LessOrEqual",
                   sympy.Gt: "Greater", sympy.Ge: "GreaterOrEqual"}.get(type(e))
        if compare is None:
            raise UnsupportedKernelError(f"condition {e} ({type(e).__name__}) cannot be computed at "
                                         f"run time by the ONNX lowering")
        out = self.node(compare, [self.sym(e.lhs), self.sym(e.rhs)])
        return self.node("Not", [out]) if isinstance(e, sympy.Ne) else out

    def _symbol(self, name: str) -> str:
        if name in self.ir.runtime_symbols:  # bound where the graph computes it
            bound = getattr(self, "runtime_bound", {}).get(name)
            if bound is None:
                raise UnsupportedKernelError(f"size {name} (from tensor values) is used before the "
                                             f"graph computes it")
            return bound
        info = self.ir.symbols.get(name)
        if info is None:
            raise UnsupportedKernelError(f"symbol {name!r} is not a graph-input dim")
        source = self.ir.inputs[info.input]
        out = self.node("Shape", [source], start=info.dim, end=info.dim + 1)
        if info.offset:
            out = self.node("Sub", [out, self.i64([info.offset])])
        if info.scale != 1:
            out = self.node("Div", [out, self.i64([info.scale])])
        return out

    def expr(self, text: str) -> sympy.Expr:
        return parse(text, self.sym_names)

    def expr_arg(self, arg: OpArg) -> sympy.Expr:
        """An integer argument (constant or symbolic) as a sympy expression."""
        if isinstance(arg, SymArg):
            return self.expr(arg.sym)
        if isinstance(arg, ConstArg) and isinstance(arg.const, int) and not isinstance(arg.const, bool):
            return sympy.Integer(arg.const)
        raise UnsupportedKernelError(f"expected an integer argument, got {arg.model_dump()}")

    def int1(self, arg: OpArg) -> str:
        """An integer argument (constant or symbolic) as a [1]-shaped int64 tensor."""
        if isinstance(arg, SymArg):
            return self.sym(arg.sym)
        if isinstance(arg, ConstArg) and isinstance(arg.const, int):
            return self.i64([arg.const])
        raise UnsupportedKernelError(f"expected an integer argument, got {arg.model_dump()}")

    def int0(self, arg: OpArg) -> str:
        """An integer argument (constant or symbolic) as a 0-d int64 tensor."""
        if isinstance(arg, ConstArg) and isinstance(arg.const, int):
            return self.constant(int(arg.const), DType.i64, [])
        return self.scalar_of(self.int1(arg))

    def concat_ints(self, parts: list[str]) -> str:
        return parts[0] if len(parts) == 1 else self.node("Concat", parts, axis=0)

    def shape(self, value: Union[TensorValue, str]) -> str:
        """The IR value's (symbolic) shape as a 1-D int64 tensor computed at run time."""
        value = self.ir.values[value] if isinstance(value, str) else value
        exprs = [parse(d, self.sym_names) for d in value.shape]
        if all(e.is_Integer for e in exprs):
            return self.i64([int(e) for e in exprs])
        return self._cached(("shape", tuple(exprs)),
                            lambda: self.concat_ints([self.sym(e) for e in exprs]))
