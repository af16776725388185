"""The lowering's memory model: torch values are versions of root tensors (a graph input, a
weight, the result of a non-aliasing op); views are re-derived from the latest version of their
root at each use, kernels bind to roots (in memory order for a weight stored transposed), and
in-place writes through views are mapped back to the root. A mixin of
:class:`kernel_lens.onnx.lower.Lowering`, whose constructor sets up ``current``, ``version`` and
``meta``."""

from __future__ import annotations

from typing import Union

import sympy

from .. import aten_facts
from ..errors import UnsupportedKernelError
from ..ir.graph import OpArg, TensorValue, TorchOp, ValueArg
from ..ir.symbolic import bounds, parse
from . import aten


class MemoryModel:
    """Roots, versions and views for the lowering (see the module docstring)."""

    # --------------------------------------------------------------------- IR values
    def value_of(self, arg: Union[OpArg, str]) -> TensorValue:
        name = arg.ref if isinstance(arg, ValueArg) else arg
        if not isinstance(name, str) or name not in self.ir.values:
            raise UnsupportedKernelError(f"expected a tensor argument, got {arg!r}")
        return self.ir.values[name]

    def out(self, op: TorchOp, i: int = 0) -> TensorValue:
        return self.ir.values[op.outputs[i]]

    def root(self, value: str) -> str:
        """The tensor owning ``value``'s memory (the IR's ``aliases`` say which ops returned
        views when torch ran them: a reshape that copied is a root of its own)."""
        chain = self.chain(value)
        return chain[-1].aliases[0] if chain else value

    def chain(self, value: str) -> list[TorchOp]:
        """Aliasing ops from ``value`` up to its root (nearest first)."""
        ops, seen = [], set()
        while value in self.producer and value not in seen:
            op = self.producer[value]
            if not op.aliases:
                break
            seen.add(value)
            ops.append(op)
            value = op.aliases[0]
        return ops

    def tensor(self, arg: Union[OpArg, str]) -> str:
        """ONNX name of a tensor's contents *now*: the latest root version, views re-derived."""
        name = arg.ref if isinstance(arg, ValueArg) else arg
        if not isinstance(name, str):
            raise UnsupportedKernelError(f"expected a tensor argument, got {arg.model_dump()}")
        root = self.root(name)
        if name == root:
            return self._root_now(root)
        key = (name, self.version.get(root, 0))
        if key not in self.views:
            self._derive(name)
        return self.views[key]

    def _root_now(self, root: str) -> str:
        if root not in self.current:
            raise UnsupportedKernelError(f"value {root!r} is used before it is produced")
        if self.current[root] is None:  # an allocation read before any kernel wrote it
            value = self.ir.values[root]
            scope, self._scope = self._scope, f"{root}.zeros"
            try:
                self.current[root] = self.full(self.shape(value), 0, value.dtype)
            finally:
                self._scope = scope
            self.meta[self.current[root]] = value
        return self.current[root]

    def _derive(self, value: str) -> None:
        op = self.producer[value]
        root = self.root(value)
        version = self.version.get(root, 0)
        if aten_facts.is_inplace(op.op):  # returns self: the target's contents now
            names = [self.tensor(op.aliases[0])] * len(op.outputs)
        else:
            scope, self._scope = self._scope, f"op{op.order}"
            start = len(self.nodes)
            try:
                names = self.translate(op)
            except UnsupportedKernelError as exc:
                raise UnsupportedKernelError(f"torch op {op.op} at position {op.order}: {exc}") from None
            finally:
                self._scope = scope
            names = [self._adopt(n, o if o not in self.taken else f"{o}.v{version}", start, o)
                     for n, o in zip(names, op.outputs)]
        for out, name in zip(op.outputs, names):
            self.views[(out, version)] = name

    def _adopt(self, name: str, desired: str, start: int, value: str) -> str:
        """Rename a result produced since node ``start`` to ``desired`` (an IR name) if free."""
        if desired in self.taken or name in self.shared or name in self.current.values():
            return name
        hits = [n for n in self.nodes[start:] if name in n.output]
        if not hits:
            return name
        for n in self.nodes[start:]:
            for field in (n.input, n.output):
                for i, x in enumerate(field):
                    if x == name:
                        field[i] = desired
        self.taken.add(desired)
        self.meta[desired] = self.ir.values[value]
        return desired

    def _write_back(self, op: TorchOp, new: str) -> str:
        """Map the in-place result (in the target's coordinates) back to its root's."""
        for view in self.chain(op.aliases[0]):
            if aten_facts.is_inplace(view.op):
                continue
            inverse = aten.INVERSE_VIEWS.get(view.op)
            why = f"no way to write through {view.op} is known"
            if inverse is not None:
                try:
                    new = inverse(self, view, new)
                    continue
                except UnsupportedKernelError as exc:
                    why = str(exc)
            raise UnsupportedKernelError(
                f"in-place torch op {op.op} at position {op.order} writes {op.aliases[0]!r}, "
                f"a view ({view.op}, position {view.order}) of {self.root(op.aliases[0])!r}: "
                f"{why}; ONNX has no in-place update (write into a full tensor, or use a kernel)")
        return new

    def _storage_order(self, value: TensorValue) -> list[int] | None:
        """The dim order in which a static tensor's memory is dense row-major (a transposed
        weight: strides [1, K] for shape [K, N] gives [1, 0]), or None (not dense in any order,
        or sizes not all known)."""
        try:
            shape = [int(x) for x in value.shape]
            strides = [int(x) for x in value.strides]
        except (TypeError, ValueError):
            return None
        order = sorted(range(len(shape)), key=lambda d: (-strides[d], d))
        expected = 1
        for d in reversed(order):
            if shape[d] != 1 and strides[d] != expected:
                return None
            expected *= shape[d]
        return order

    def _in_storage_order(self, name: str, value: TensorValue) -> str:
        """A kernel bound to a weight stored in another dim order reads its memory: the weight's
        (row-major) initializer transposed to that order has the same bytes as torch's storage."""
        if value.kind != "constant" or self._dense(value):
            return name
        perm = self._storage_order(value)
        return self._cached(("storage", name, tuple(perm)),
                            lambda: self.node("Transpose", [name], perm=perm), scope="weights")

    def _dense(self, value: TensorValue) -> bool:
        """Whether torch's layout is dense row-major for every size the graph serves. A dim of
        size 1 over the symbols' ranges (``cdiv(tokens, 512)`` in the piece tokens <= 512) has any
        stride; torch's ``Max(1, size)`` in a stride is ``size`` (at size 0 nothing is stored)."""
        ranges = {n: (i.min, i.max) for n, i in {**self.ir.symbols, **self.ir.runtime_symbols}.items()}
        sizes = [parse(size, self.sym_names) for size in value.shape]
        # only for symbolic sizes: Max(1, 0) is the number 1, which must stay 1
        at_least_one = {m: s for s in sizes if s.free_symbols
                        for m in (sympy.Max(1, s), sympy.Max(s, 1))}
        expected = sympy.Integer(1)
        for s, stride in reversed(list(zip(sizes, value.strides))):
            if s == 1 or bounds(s, ranges) == (1, 1):
                continue
            if not self._equal(parse(stride, self.sym_names).xreplace(at_least_one), expected):
                return False
            expected = expected * s
        return True

    @staticmethod
    def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
        """Whether two size/stride expressions are equal for every value of the symbols: proven
        by sympy, never guessed from sample values (unproven counts as unequal: not dense)."""
        diff = sympy.expand(a - b)
        return diff == 0 or sympy.simplify(diff) == 0
