"""GraphIR → ONNX: kernel launches become custom-domain nodes, torch ops become standard ONNX.

Contract (the generated custom-op library implements the ``kernel_lens`` nodes):

* Opsets: the default domain at ``opset`` (18 or later) and ``("kernel_lens", 1)``.
* Graph inputs are ``ir.inputs`` (same names, dtypes, symbolic dims: a literal is a
  ``dim_value``, anything else a ``dim_param`` spelled as the IR spells it, so a plain symbol is
  its own name). Weights (``ir.constants``) are initializers.
* Launch ``idx`` of ``ir.launches`` is ONE node: op_type = kernel id, domain ``kernel_lens``,
  name ``launch{idx}_{kernel}``, INT attribute ``launch = idx``, wired exactly as
  :func:`kernel_lens.codegen.launch_io.launch_io` says (suffix ``__{launch.order}``): inputs are the
  current names of ``io.inputs``, outputs the new names of ``io.outputs`` (or the graph output's
  name, when that output is the kernel's result unchanged: constant folding drops the Identity);
  later uses of a written value refer to its new name. Bindings are positional.
* Graph outputs are ``output_0, output_1, ...`` (Identity of ``ir.outputs`` resolved through
  the renaming), then ``mutated_<input>`` for each graph input the model writes in place (a
  kernel or an in-place torch op): its final contents, which the runtime copies back into the
  caller's tensor (ONNX inputs are immutable). ``lower_to_onnx(..., mutated_inputs=False)``
  leaves them out.

Memory model. ONNX values are immutable, torch tensors are not, so each *root* tensor (one that
owns its memory: a graph input, a weight, the result of a non-aliasing op) has versions:

* A kernel that writes a root (directly or through a view) makes a new version of the whole root
  (its node receives the root and applies the IR's strides/offset itself).
* An in-place torch op (``aten.add_`` ...) computes the new contents functionally and makes a new
  version of its root. Writing through views is supported: reshape-like and transpose-like views
  map the values back, slice (step 1) and select splice them into the source's current contents;
  other views (strided slices, expand, split pieces, as_strided) are rejected.
* Torch ops and graph outputs always see the latest version of a root: a view is re-derived from
  the latest root version at each use (its ONNX view chain is re-emitted when the root changed
  since the last derivation). View ops feeding only kernels emit nothing.
* View-or-copy ops (``reshape``, ``contiguous``, ...) are views exactly when the IR lists their
  input in ``aliases`` (the front end records whether torch copied); a copy is translated like any
  op and is a root of its own, taken at its program point.
* Allocations (``empty*``) emit nothing: a kernel producing the buffer as a fresh output creates
  it; any other reader sees zeros.

Rejected (``UnsupportedKernelError``) because ONNX cannot express it faithfully: a kernel bound
to a root whose torch layout is not dense row-major (ONNX tensors are dense, the kernel would
apply torch's strides); a kernel argument that views its root as another dtype; an in-place
torch op writing through a view of the kinds above; any torch op that is actually needed and that
neither onnxscript's torchlib nor :mod:`kernel_lens.onnx.aten` translates (dead ops are pruned
first, so an untranslatable op whose result nothing uses is harmless). Torch ops are translated
by torchlib (:mod:`kernel_lens.onnx.torchlib`), then the graph is constant-folded (``optimize``).

Symbolic integers (reshape sizes, slice bounds, arange ends, ...) are computed at run time from
the graph inputs' dims (Shape on the input/dim ``ir.symbols`` names, then integer arithmetic),
never baked from the capture sizes.
"""

from __future__ import annotations

import os
import re
import tempfile
from importlib.metadata import version as dist_version
from pathlib import Path
from typing import Any, Sequence, Union

import onnx
import onnx.inliner
import onnx_ir as oir
from onnx import TensorProto, helper
from onnx.external_data_helper import load_external_data_for_model

from .. import aten_facts
from ..errors import KernelLensError, SymbolicError, UnsupportedKernelError
from ..fileio import atomic_write
from ..toolchain import entry_cache
from ..ir.graph import GraphIR, Launch, RuntimeCheck, RuntimeSymbol, TensorValue, TorchOp
from ..ir.types import DType
from ..codegen.launch_io import launch_io, root_of
from ..kernels import is_own_kernel
from . import aten, rewrites, torchlib
from .context import CHECK_OP, CHECK_OUTPUT, DOMAIN, DOMAIN_VERSION, onnx_dtype, value_info
from .graph_builder import GraphBuilder
from .graph_passes import GraphPassManager
from .memory import MemoryModel
from .branches import combine_branches, gate_checks
from .pieces import chain_pieces, combine_pieces
from .external_data import check_locations, tensors

MIN_OPSET = 18
MAX_IR_VERSION = 10  # ONNX Runtime 1.29+ reads IR version 10

_UNSUPPORTED_DOMAIN = "kernel_lens.unsupported"  # placeholder nodes; never in a returned model


_value_info = value_info


# Past this many bytes of weights a model is saved with an external-data file (protobuf's
# limit is 2 GB) and is not kept in the lowering cache.
EXTERNAL_DATA_BYTES = 1_800_000_000


class Lowering(GraphBuilder, MemoryModel):
    """State of one lowering; also the context :mod:`kernel_lens.onnx.aten` translators use.
    Node and constant building is :class:`.graph_builder.GraphBuilder`'s, roots, versions and
    views are :class:`.memory.MemoryModel`'s; this class holds the state and the loop (torch ops,
    launches, the assembled graph)."""

    def __init__(self, ir: GraphIR, opset: int, mutated_inputs: bool = True, launch_offset: int = 0):
        if opset < MIN_OPSET:
            raise ValueError(f"opset {opset} is too old: the ONNX lowering emits opset "
                             f"{MIN_OPSET}+ operators (Shape start/end, axes as inputs)")
        self.ir, self.opset, self.mutated_inputs = ir, opset, mutated_inputs
        self.launch_offset = launch_offset  # a piece's launches follow the earlier pieces'
        self.sym_names = ir.symbol_names()
        self.producer: dict[str, TorchOp] = {o: op for op in ir.ops for o in op.outputs}
        self.nodes: list[onnx.NodeProto] = []
        self.errors: dict[str, KernelLensError] = {}  # placeholder node name -> why
        # launches kept only when a node or output reads what they write (kernel_lens's own
        # kernels: a GEMM whose result became another GEMM's residual); the user's launches stay
        self.droppable: set[str] = set()
        self.taken: set[str] = set()  # ONNX tensor names in use
        self.shared: set[str] = set()  # cached helper tensors (never renamed)
        self.meta: dict[str, TensorValue] = {}  # ONNX name -> IR value it holds (value_info)
        self.current: dict[str, str | None] = {}  # root -> ONNX name of its latest version
        self.version: dict[str, int] = {}
        self.views: dict[tuple[str, int], str] = {}  # (view value, root version) -> ONNX name
        self._cache: dict[Any, str] = {}
        self.constant_farm: dict[Any, Any] = {}  # torchlib constants, shared by every op
        self.functions: dict[Any, onnx.FunctionProto] = {}  # torchlib functions called
        self.origin: dict[str, str] = {}  # recorded node name -> the torch op it translates
        self._op: TorchOp | None = None  # the torch op being translated
        self._counter = 0
        self._scope = "graph"
        for name in [*ir.inputs, *ir.constants]:
            self.current[name], self.version[name] = name, 0
            self.taken.add(name)

    def translate(self, op: TorchOp, name: str | None = None) -> list[str]:
        """ONNX names of ``op``'s results computed as ``name`` (default ``op.op``): torchlib's
        translation, or kernel_lens's own for the few forms it controls (:mod:`.aten`)."""
        name = name or op.op
        previous, self._op = self._op, op
        try:
            own = aten.TRANSLATIONS.get(name)
            if own is not None:
                return own(self, op)
            names = torchlib.translate(self, op, name)
        finally:
            self._op = previous
        if names is None:
            raise UnsupportedKernelError(
                f"no ONNX translation for {name}: onnxscript's torchlib has none and torch has no "
                f"decomposition the front end could apply (producing {', '.join(op.outputs)}); "
                f"compute it in a Triton kernel, or rewrite the forward with ops torchlib covers")
        return names

    def add_recorded(self, nodes: list[Any], functions: dict[Any, Any]) -> None:
        """Append nodes recorded by torchlib (onnx_ir nodes): every value gets a unique name,
        constants shared across ops keep theirs (never renamed)."""
        def name_all(recorded) -> None:
            for node in recorded:
                self._counter += 1
                if not node.name:
                    node.name = f"{self._scope}/{node.op_type}_{self._counter}"
                for out in node.outputs:
                    if not out.name:
                        out.name = self.fresh(f"{self._scope}/{node.op_type}")
                for attr in node.attributes.values():
                    graphs = (list(attr.value) if attr.type == oir.AttributeType.GRAPHS else
                              [attr.value] if attr.type == oir.AttributeType.GRAPH else [])
                    for g in graphs:
                        for i in g.inputs:
                            if not i.name:
                                i.name = self.fresh(f"{self._scope}/arg")
                        name_all(list(g))

        name_all(nodes)
        for value in self.constant_farm.values():
            self.shared.add(value.name)
        for node in nodes:
            proto = oir.serde.serialize_node(node)
            self.taken.update(proto.output)
            self.nodes.append(proto)
            if self._op is not None:
                self.origin[proto.name] = f"{self._op.op} (position {self._op.order})"
        for key, fn in functions.items():
            if key not in self.functions:
                self.functions[key] = (oir.serde.serialize_function(fn)
                                       if isinstance(fn, oir.Function) else fn.to_function_proto())

    # --------------------------------------------------------------------- program
    def torch_op(self, op: TorchOp) -> None:
        if aten_facts.allocates_uninitialized(op.op):
            for out in op.outputs:
                self.current[out], self.version[out] = None, 0
            return
        inplace = aten_facts.is_inplace(op.op)
        if op.aliases and not inplace:
            return  # a view: derived from its root's latest version where it is used
        scope, self._scope = self._scope, f"op{op.order}"
        start = len(self.nodes)
        try:
            try:
                if inplace and op.op not in aten.TRANSLATIONS:
                    names = self.translate(op, aten_facts.functional_name(op.op))
                else:
                    names = self.translate(op)
            except UnsupportedKernelError as exc:
                raise UnsupportedKernelError(f"torch op {op.op} at position {op.order}: {exc}") from None
            if inplace:
                names = [self._write_back(op, names[0])]
        except (UnsupportedKernelError, SymbolicError) as exc:
            names = self._placeholder(op, exc)
        finally:
            self._scope = scope
        if inplace:
            target = op.aliases[0]
            root = self.root(target)
            new = names[0]
            if target == root:
                new = self._adopt(new, op.outputs[0], start, op.outputs[0])
            else:
                new = self._adopt(new, f"{root}.v{self.version.get(root, 0) + 1}", start, root)
            self.version[root] = self.version.get(root, 0) + 1
            self.current[root] = new
            self.meta.setdefault(new, self.ir.values[root])
            return
        for out, name in zip(op.outputs, names):
            self.current[out] = self._adopt(name, out, start, out)
            self.version[out] = 0

    def _placeholder(self, op: TorchOp, exc: KernelLensError) -> list[str]:
        outs = [self.fresh(f"{o}.unsupported") for o in op.outputs] or [self.fresh("unsupported")]
        self.node("Unsupported", [], domain=_UNSUPPORTED_DOMAIN, outputs=outs)
        self.errors[self.nodes[-1].name] = exc
        return outs

    def launch(self, idx: int, launch: Launch) -> None:
        if launch.kernel == CHECK_OP:
            raise UnsupportedKernelError(f"a kernel is named {CHECK_OP}, the name of kernel_lens's "
                                         f"own run-time check node: rename the kernel")
        self._check_launch(launch)
        io = launch_io(self.ir, launch, f"__{launch.order}")
        inputs = [self._in_storage_order(self._root_now(v), self.ir.values[v]) for v in io.inputs]
        outputs = []
        for value, new in io.outputs:
            if new in self.taken:  # e.g. a second kernel also writing an allocation "fresh"
                raise KernelLensError(
                    f"launch {idx} ({launch.kernel}) would produce {new!r}, a name already in use "
                    f"(launch_io names a fresh output after its value; a buffer written fresh by "
                    f"two launches needs a versioned name)")
            outputs.append(new)
        self._scope = f"launch{idx}"
        self.node(launch.kernel, inputs, domain=DOMAIN, outputs=outputs, launch=idx)
        self.nodes[-1].name = f"launch{idx}_{launch.kernel}"
        if is_own_kernel(self.ir.kernels[launch.kernel].source.qualname) \
                and not any(root_of(self.ir, value) in self.ir.inputs for value, _ in io.outputs):
            self.droppable.add(self.nodes[-1].name)  # writes only what it allocated
        self._scope = "graph"
        for value, new in io.outputs:
            self.current[value] = new
            self.version[value] = self.version.get(value, 0) + 1
            self.meta[new] = self.ir.values[value]

    def _check_launch(self, launch: Launch) -> None:
        kernel = self.ir.kernels[launch.kernel]
        where = f"launch {launch.order} ({launch.kernel})"
        written = {root_of(self.ir, a.value) for a in launch.args if a.value is not None
                   and kernel.param(a.name).binds_tensor and a.role in ("output", "inplace")}
        for arg in launch.args:
            if arg.value is None or not kernel.param(arg.name).binds_tensor:
                continue
            if arg.role is None:
                raise KernelLensError(
                    f"{where} argument {arg.name!r} has no role: run role inference first "
                    f"(kl.compile runs the pass pipeline; kl.lift alone does not)")
            root = root_of(self.ir, arg.value)  # what launch_io binds
            rv = self.ir.values[root]
            if not self._dense(rv) and not (self._storage_order(rv) and rv.kind == "constant"
                                            and root not in written):
                raise UnsupportedKernelError(
                    f"{where} argument {arg.name!r} points into {root!r}, whose torch layout "
                    f"(strides {rv.strides} for shape {rv.shape}) is not dense row-major; ONNX "
                    f"tensors are, so the kernel's strides would not match (make it .contiguous() "
                    f"before the launch; a weight only read, dense in another dim order, is fine)")
            # launch_io binds the kernel to the root it reaches through every aliasing op
            for view in self.chain(arg.value):
                src = self.ir.values[view.aliases[0]]
                outs = [self.ir.values[o] for o in view.outputs if o in self.ir.values]
                if any(o.dtype != src.dtype for o in outs):
                    raise UnsupportedKernelError(
                        f"{where} argument {arg.name!r}: {arg.value!r} views {root!r} through "
                        f"{view.op} (position {view.order}) as another dtype; the kernel would be "
                        f"bound to {root!r}'s memory with {view.op}'s element type (bit casts of "
                        f"kernel arguments are not supported: pass the tensor itself)")

    # --------------------------------------------------------------------- assembly
    def runtime_symbol(self, name: str, info: RuntimeSymbol) -> None:
        """Compute a size from tensor values where the program makes it: a dim of its tensor, or
        the value of its one element (as int64)."""
        self._scope = f"size.{name}"
        source = self.tensor(info.value)
        if info.dim is not None:
            out = self.node("Shape", [source], start=info.dim, end=info.dim + 1)
        else:
            flat = self.node("Reshape", [source, self.i64([1])])
            out = self.cast(flat, self.ir.values[info.value].dtype, DType.i64)
            # sizes are >= 0 (a carrier's dim, and every condition on it reasons so): another
            # value stops the call before anything reads it as a size
            self.stop_unless(self.node("GreaterOrEqual", [out, self.i64([0])]),
                             f"the value of .item() at {info.where or 'an unknown line'} is negative; "
                             f"kernel_lens takes sizes and scalars from .item() values >= 0",
                             output=f"{CHECK_OUTPUT}item.{name}")
        self.runtime_bound[name] = out
        self._scope = "graph"

    def stop_unless(self, cond: str, message: str, output: str | None = None) -> None:
        """A ``kernel_lens::Check`` node: the call stops with ``message`` where ``cond`` (a bool
        tensor of one element) is false. Its output (``output``, else a fresh name), a tensor of
        no elements, is never read."""
        ok = output or self.fresh(f"{CHECK_OUTPUT}value")
        self.node(CHECK_OP, [cond], domain=DOMAIN, outputs=[ok], message=message)
        self.check_outputs.append(ok)

    def runtime_check(self, check: RuntimeCheck) -> None:
        """The check of a branch on tensor values: the call stops where ``cond`` is false (no
        traced graph serves it)."""
        self._scope = f"check{check.order}"
        self.stop_unless(self.truth(check.cond),
                         f"the model's code at {check.where or 'an unknown line'} took another branch "
                         f"for these inputs than for the example inputs (it needs {check.cond}); no "
                         f"traced graph serves them: compile with extra_examples that take this branch",
                         output=f"{CHECK_OUTPUT}{check.order}")
        self._scope = "graph"

    def run(self) -> onnx.ModelProto:
        ir = self.ir
        launch_index = {id(l): self.launch_offset + i for i, l in enumerate(ir.launches)}
        self.runtime_bound: dict[str, str] = {}
        self.check_outputs: list[str] = []
        events = sorted([(n.order, 0, n) for n in ir.nodes()]
                        + [(s.order, 1, (name, s)) for name, s in ir.runtime_symbols.items()]
                        + [(c.order, 2, c) for c in ir.checks], key=lambda e: e[:2])
        for _, kind, node in events:
            if kind == 1:
                self.runtime_symbol(*node)
            elif kind == 2:
                self.runtime_check(node)
            elif isinstance(node, Launch):
                self.launch(launch_index[id(node)], node)
            else:
                self.torch_op(node)
        outputs = []
        for i, value in enumerate(ir.outputs):
            src = self.tensor(value)
            name = f"output_{i}"
            if name in self.taken:
                raise KernelLensError(f"graph output name {name!r} collides with a value name")
            self._scope = "outputs"
            self.node("Identity", [src], outputs=[name])
            v = ir.values[value]
            outputs.append(_value_info(name, v.dtype, v.shape))
        for name in ir.inputs:  # inputs the model mutates: their final contents, for the caller
            if self.mutated_inputs and self.current.get(name) not in (None, name):
                oname = f"mutated_{name}"
                if oname in self.taken:
                    raise KernelLensError(f"output name {oname!r} collides with a value name")
                self._scope = "outputs"
                self.node("Identity", [self.current[name]], outputs=[oname])
                outputs.append(_value_info(oname, ir.values[name].dtype, ir.values[name].shape))
        # a check's output is a graph output until the graph is optimized (which removes nodes
        # whose outputs nothing reads); lower_graph then drops it from the outputs (_unchecked)
        outputs += [helper.make_tensor_value_info(name, TensorProto.BOOL, [0]) for name in self.check_outputs]
        live = self._prune([o.name for o in outputs])
        for node in live:
            if node.domain == _UNSUPPORTED_DOMAIN:
                raise self.errors[node.name]
        used = {x for n in live for x in n.input}
        produced = {x for n in live for x in n.output}
        inits = []
        for name, data in ir.constants.items():
            if name in used:
                tensor = TensorProto(name=name, data_type=onnx_dtype(data.dtype),
                                     dims=list(data.shape), raw_data=data.data)
                inits.append(tensor)
        inputs = [_value_info(n, ir.values[n].dtype, ir.values[n].shape) for n in ir.inputs]
        out_names = {o.name for o in outputs}
        infos = [_value_info(n, v.dtype, v.shape) for n, v in self.meta.items()
                 if n in produced and n not in out_names]
        graph = helper.make_graph(
            live, ir.name, inputs, outputs, initializer=inits, value_info=infos,
            doc_string=f"Lowered by kernel_lens from GraphIR {ir.name!r}: nodes in domain "
                       f"'{DOMAIN}' are Triton kernel launches (custom ops generated by "
                       f"kernel_lens); the rest is standard ONNX.")
        opsets = [helper.make_opsetid("", self.opset), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="kernel_lens",
                                  producer_version=_version(),
                                  doc_string="kernel_lens lowering of a PyTorch model with "
                                             "Triton kernels")
        needed = helper.find_min_ir_version_for([helper.make_opsetid("", self.opset)])
        model.ir_version = max(min(onnx.IR_VERSION, MAX_IR_VERSION), needed)
        if self.functions:
            model = self._inline_functions(model)
        return model

    def _inline_functions(self, model: onnx.ModelProto) -> onnx.ModelProto:
        """Inline the torchlib functions the graph calls (those that are not trace-only, e.g.
        ``aten_log_sigmoid``), so the graph holds standard ops and launch nodes only: TensorRT's
        parser handles local functions poorly, and a call whose function the model does not
        carry is refused by ONNX Runtime ("not a registered function/op").

        torchlib's functions import the default domain at opset 18. onnx's inliner silently
        leaves a call in place when the function's opset differs from the model's (the ORT
        target's graph is at opset 23), and its ``convert_version=True`` path duplicates the
        Constant nodes feeding the call (an invalid graph). So a function whose every op means
        the same at both opsets (:func:`_same_op_at`) is imported at the model's opset first, as
        torch's exporter does when its optimizer inlines torchlib into a newer-opset model; a
        function that cannot be is not inlined and is shipped in ``model.functions`` with its
        own opset (ONNX Runtime runs that). :func:`check_ops` verifies the result."""
        functions = [_at_opset(fn, self.opset) for fn in self.functions.values()]
        model.functions.extend(functions)
        known = {o.domain for o in model.opset_import}
        for fn in functions:
            for o in [*fn.opset_import, helper.make_opsetid(fn.domain, 1)]:
                if o.domain not in known:
                    model.opset_import.append(o)
                    known.add(o.domain)
        model = onnx.inliner.inline_local_functions(model)
        called = {(n.domain, n.op_type) for n in all_nodes(model.graph)}
        for fn in model.functions:  # functions calling functions
            called |= {(n.domain, n.op_type) for n in fn.node}
        kept = [fn for fn in model.functions if (fn.domain, fn.name) in called]
        del model.functions[:]
        model.functions.extend(kept)
        used = {n.domain for n in all_nodes(model.graph)} | {"", DOMAIN}
        for fn in kept:
            used |= {fn.domain} | {n.domain for n in fn.node}
        imports = [o for o in model.opset_import if o.domain in used]
        del model.opset_import[:]
        model.opset_import.extend(imports)
        return model

    def _prune(self, outputs: list[str]) -> list[onnx.NodeProto]:
        needed = set(outputs)
        keep = []
        for node in reversed(self.nodes):
            if (node.domain == DOMAIN and node.name not in self.droppable) \
                    or any(o in needed for o in node.output):
                keep.append(node)
                needed.update(_inputs(node))
        return keep[::-1]


def _at_opset(fn: onnx.FunctionProto, opset: int) -> onnx.FunctionProto:
    """``fn`` importing the default domain at ``opset`` when each of its ops means the same there
    as at the opset it imports (else ``fn`` as it is)."""
    imports = {o.domain or "": o.version for o in fn.opset_import}
    own = imports.get("", imports.get("ai.onnx"))
    if own is None or own == opset:
        return fn

    def ok(nodes) -> bool:
        for node in nodes:
            if node.domain in ("", "ai.onnx") and not _same_op_at(node.op_type, own, opset):
                return False
            for attr in node.attribute:
                if not all(ok(g.node) for g in ([attr.g] if attr.HasField("g") else attr.graphs)):
                    return False
        return True

    if not ok(fn.node):
        return fn
    out = onnx.FunctionProto()
    out.CopyFrom(fn)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = opset
    return out


def _same_op_at(op_type: str, old: int, new: int) -> bool:
    """Whether ONNX op ``op_type`` at opset ``old`` reads the same at opset ``new``: the same
    schema, or a newer one that only adds what an old node cannot use (more element types,
    optional attributes), with the same inputs and outputs. Between torchlib's opset 18 and the
    ORT target's 23 every op torchlib's functions use changed only so (Cast, Reshape, Shape,
    ReduceMax ... gained types: float8, int4, bfloat16, bool)."""
    try:
        a, b = onnx.defs.get_schema(op_type, old), onnx.defs.get_schema(op_type, new)
    except onnx.defs.SchemaError:
        return False
    if a.since_version == b.since_version:
        return True
    if a.deprecated or b.deprecated:
        return False
    if [(i.name, i.option) for i in a.inputs] != [(i.name, i.option) for i in b.inputs] or \
            [(o.name, o.option) for o in a.outputs] != [(o.name, o.option) for o in b.outputs]:
        return False
    if not set(a.attributes) <= set(b.attributes) or any(
            attr.required for name, attr in b.attributes.items() if name not in a.attributes):
        return False
    new_types = {c.type_param_str: set(c.allowed_type_strs) for c in b.type_constraints}
    return all(set(c.allowed_type_strs) <= new_types.get(c.type_param_str, set())
               for c in a.type_constraints)


def all_nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attr in node.attribute:
            for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                yield from all_nodes(g)


def _inputs(node: onnx.NodeProto) -> set[str]:
    """Names a node reads, including outer-scope names its subgraphs (If/Loop bodies) use."""
    names = {x for x in node.input if x}
    for attr in node.attribute:
        for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
            inner = {i.name for i in g.input} | {o for n in g.node for o in n.output}
            for n in g.node:
                names |= {x for x in _inputs(n) if x not in inner}
    return names


def _version() -> str:
    try:
        return dist_version("kernel_lens")
    except Exception:  # pragma: no cover - running from a source tree
        return "0.0.0+source"


def supported(op_name: str, opset: int = MIN_OPSET) -> bool:
    """Whether the lowering can translate the ATen overload ``op_name`` (views and in-place
    forms through their functional op; allocations emit nothing)."""
    if aten_facts.allocates_uninitialized(op_name) or op_name in aten.TRANSLATIONS:
        return True
    if aten_facts.is_inplace(op_name):
        op_name = aten_facts.functional_name(op_name)
    return op_name in aten.TRANSLATIONS or torchlib.translatable(op_name, opset)


def lower_to_onnx(ir: GraphIR, *, opset: int = MIN_OPSET, mutated_inputs: bool = True,
                  launch_offset: int = 0, gate: bool = True) -> onnx.ModelProto:
    """Lower ``ir`` to an ONNX model (see the module docstring for the contract).

    ``mutated_inputs``: also output ``mutated_<input>`` for each graph input the model writes
    in place (ONNX cannot mutate inputs; the runtime copies these back into the caller's tensors).
    A model split by size (``ir.pieces``) becomes one graph choosing its piece with ``If``
    (:mod:`kernel_lens.onnx.pieces`); one traced from several examples (``ir.branches``) tries
    its branches in order with ``If`` (:mod:`kernel_lens.onnx.branches`); a piece may have
    branches. Launch ``i`` (of :meth:`GraphIR.graphs`, in order) has attribute
    ``launch = launch_offset + i``. A graph's run-time checks gate what follows them
    (:func:`~kernel_lens.onnx.branches.gate_checks`; ``gate=False``: a value branch, whose checks
    :func:`combine_branches` turns into attempts).
    """
    if not ir.parts():
        model = lower_graph(ir, opset=opset, mutated_inputs=mutated_inputs,
                            launch_offset=launch_offset, graph_passes=ir.graph_passes)
        return gate_checks(model) if gate else model
    models, offset = [], launch_offset
    for part in ir.parts():  # weights the parts share are kept once, at the top level
        graph = part.graph.model_copy(update={"constants": {**ir.constants, **part.graph.constants},
                                              "graph_passes": ir.graph_passes})
        models.append(lower_to_onnx(graph, opset=opset, mutated_inputs=mutated_inputs,
                                    launch_offset=offset, gate=not ir.branches))
        offset += sum(len(g.launches) for g in part.graph.graphs())
    if ir.branches:
        model = combine_branches(ir, models)
    elif any(g.runtime_symbols or g.checks for g in ir.graphs()):  # shapes may follow values
        model = chain_pieces(ir, models)
    else:
        model = combine_pieces(ir, models, Lowering(ir, opset, mutated_inputs))
    check_ops(model)
    return model


def lower_graph(ir: GraphIR, *, opset: int = MIN_OPSET, mutated_inputs: bool = True,
                launch_offset: int = 0, graph_passes: Sequence[str] = ()) -> onnx.ModelProto:
    """One graph (no pieces) lowered; its launch ``i`` has attribute ``launch = launch_offset + i``;
    ``graph_passes`` (names of :mod:`kernel_lens.onnx.graph_passes`) run after constant folding."""
    lowering = Lowering(ir, opset, mutated_inputs, launch_offset)
    model = _unchecked(widen_fp8_expands(optimize(lowering.run(), graph_passes)))
    check_ops(model, lowering.origin)
    check_types(model, lowering.origin)
    return model


def check_types(model: onnx.ModelProto, origin: dict[str, str] | None = None) -> None:
    """Every standard node's input types are ones its schema takes (onnx's type inference, strict):
    otherwise ``UnsupportedKernelError`` naming the node and the ATen op that produced it. ONNX's
    reference evaluator, which the CPU tests run, accepts some such graphs (int32 indices of
    ``GatherND``) that ONNX Runtime refuses to load."""
    try:
        onnx.shape_inference.infer_shapes(_without_weights(model), check_type=True, strict_mode=True)
    except onnx.shape_inference.InferenceError as exc:
        text = str(exc)
        node = re.search(r"node name: ([^)]*)\)", text)
        made_by = (origin or {}).get(node.group(1)) if node else None
        raise UnsupportedKernelError(
            f"the lowered ONNX graph is not well typed{f' (from torch op {made_by})' if made_by else ''}: "
            f"{text.strip()[:400]}; ONNX Runtime would refuse to load it") from exc


def _unchecked(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` without the run-time checks' outputs among its graph outputs (they were there
    only to keep the optimizer from removing the checks; ONNX Runtime runs every node)."""
    kept = [o for o in model.graph.output if not o.name.startswith(CHECK_OUTPUT)]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    return model


_FP8_TYPES = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E5M2}


def _tensor_bytes(t: onnx.TensorProto) -> int:
    """About what ``t`` takes serialized: its raw data's length (protobuf's ByteSize() walks the
    message: 0.1 s a 100 MB weight), else ByteSize()."""
    raw = len(t.raw_data)
    return raw if raw else t.ByteSize()


def _without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with each initializer past 64 KiB turned into a graph input of its type and
    dims: what type inference reads of it, without serializing the weights (past 2 GB protobuf
    cannot). Small ones (shapes, indices) stay: inference reads their values."""
    g = model.graph
    sized = [(t, _tensor_bytes(t)) for t in g.initializer]
    small = [t for t, n in sized if n <= 1 << 16]
    large = [helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t, n in sized if n > 1 << 16]
    graph = helper.make_graph(g.node, g.name, [*g.input, *large], g.output, small,
                              value_info=g.value_info)
    return helper.make_model(graph, opset_imports=model.opset_import, functions=model.functions,
                             ir_version=model.ir_version)


def widen_fp8_expands(model: onnx.ModelProto) -> onnx.ModelProto:
    """``Expand`` takes no float8 tensor in any ONNX opset (``zeros_like`` of an fp8 tensor
    lowers to one): expand it as float32 between two Casts, which is exact (every fp8 value is
    a float32 value)."""
    graph = model.graph
    types = {t.name: t.data_type for t in graph.initializer}
    types.update({v.name: v.type.tensor_type.elem_type
                  for v in [*graph.input, *graph.value_info, *graph.output]})
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].HasField("t"):
            types[node.output[0]] = node.attribute[0].t.data_type
        elif node.op_type == "Cast":
            types[node.output[0]] = next(a.i for a in node.attribute if a.name == "to")
    nodes = []
    for node in graph.node:
        fp8 = types.get(node.input[0]) if node.op_type == "Expand" and node.domain in ("", "ai.onnx") else None
        if fp8 not in _FP8_TYPES:
            nodes.append(node)
            continue
        wide, out = f"{node.output[0]}.fp32", f"{node.input[0]}.fp32"
        nodes.append(helper.make_node("Cast", [node.input[0]], [out], name=f"{node.name}.widen",
                                     to=TensorProto.FLOAT))
        nodes.append(helper.make_node("Expand", [out, node.input[1]], [wide], name=node.name))
        nodes.append(helper.make_node("Cast", [wide], [node.output[0]], name=f"{node.name}.narrow",
                                     to=fp8))
    del graph.node[:]
    graph.node.extend(nodes)
    return model


def check_ops(model: onnx.ModelProto, origin: dict[str, str] | None = None) -> None:
    """Every node of ``model`` (subgraphs and local functions included) is a standard ONNX op
    known to onnx's schema registry at the opset its graph imports, a ``kernel_lens`` launch node,
    or a call of a function in ``model.functions``; otherwise ``UnsupportedKernelError`` naming
    the op and, when ``origin`` (node name -> torch op) knows it, the ATen op that produced it.
    ``onnx.checker`` does not see this: it skips nodes of domains it has no schemas for, and ONNX
    Runtime then refuses the model ("... is not a registered function/op")."""
    functions = {(fn.domain, fn.name) for fn in model.functions}
    origin = origin or {}

    def norm(domain: str) -> str:
        return "" if domain in ("", "ai.onnx") else domain

    def visit(nodes, imports: dict[str, int], where: str) -> None:
        for node in nodes:
            domain = norm(node.domain)
            ok = (domain == DOMAIN and DOMAIN in imports
                  or (node.domain, node.op_type) in functions
                  or domain in imports and onnx.defs.has(node.op_type, imports[domain], domain))
            if not ok:
                made_by = origin.get(node.name)
                opset = imports.get(domain, imports.get(""))
                raise UnsupportedKernelError(
                    f"the lowered ONNX graph{where} has node {node.name!r} of op "
                    f"{node.domain or 'ai.onnx'}::{node.op_type}"
                    f"{f', produced by torch op {made_by},' if made_by else ''} which is neither "
                    f"a standard ONNX op at opset {opset}, a {DOMAIN} launch node, nor a function "
                    f"the model carries (ONNX Runtime would refuse to load it: 'not a registered "
                    f"function/op')")
            for attr in node.attribute:
                for g in [attr.g] if attr.HasField("g") else list(attr.graphs):
                    visit(g.node, imports, where)

    visit(model.graph.node, {norm(o.domain): o.version for o in model.opset_import}, "")
    for fn in model.functions:
        visit(fn.node, {norm(o.domain): o.version for o in fn.opset_import},
              f" (function {fn.domain}::{fn.name})")


def optimize(model: onnx.ModelProto, graph_passes: Sequence[str] = ()) -> onnx.ModelProto:
    """onnxscript's constant folding and dead-node removal (part of what
    ``torch.onnx.export(..., optimize=True)`` runs): folds what is constant (a shape-derived
    attention scale for a static head size, CastLike, small weight transposes), removes what is
    unused. No rewrite rules; the one renaming is folding's: a value that only reaches a graph
    output through Identity takes the output's name (``output_0``), kernel outputs included. Without it, ORT places the leftover shape arithmetic on the CPU, which CUDA-graph mode
    refuses."""
    import onnxscript.optimizer  # lazy: onnxscript takes ~0.3 s; a cached lowering never needs it

    version = model.ir_version
    graph = oir.serde.deserialize_model(model)
    for _ in range(2):  # constant folding and dead-node removal: nothing here renames
        onnxscript.optimizer.fold_constants(graph)
        onnxscript.optimizer.remove_unused_nodes(graph)
    if rewrites.apply(graph):  # attention on the layout the model keeps (see rewrites.py)
        onnxscript.optimizer.remove_unused_nodes(graph)
    if graph_passes:  # the user's choice of optimizations (graph_passes.py)
        GraphPassManager(graph_passes).run_on(graph)
        onnxscript.optimizer.remove_unused_nodes(graph)
    out = oir.serde.serialize_model(graph)
    out.ir_version = version
    return out


def lowering_key(ir: GraphIR, opset: int) -> str:
    """What a cached lowering of ``ir`` is keyed by: the IR (its graph passes with it), the opset,
    every source file of the lowering (the graph passes' code among them) and the versions of the
    libraries it calls."""
    import torch  # lazy: torch takes seconds; the onnx layer imports no torch (targets emit and build without it)

    here = Path(__file__).parent
    code = sorted(here.glob("*.py"))  # every module of the lowering (a list by hand missed some)
    code += [here.parent / "aten_facts.py", here.parent / "codegen" / "launch_io.py"]
    return entry_cache.key_of("onnx/1", _version(), torch.__version__, dist_version("onnxscript"),
                              onnx.__version__, opset, *(p.read_bytes() for p in code),
                              ir.fingerprint())


def _raw_bytes(model: onnx.ModelProto) -> int:
    """The raw data of every tensor of ``model`` (initializers, attribute tensors, subgraphs,
    functions), in bytes: what decides external data (``ByteSize()`` of GBs takes seconds)."""
    return sum(len(t.raw_data) for t, _ in tensors(model))


def lower_to_onnx_cached(ir: GraphIR, *, opset: int = MIN_OPSET) -> onnx.ModelProto:
    """:func:`lower_to_onnx`, reused from the kernel_lens cache when the same IR was lowered by
    the same lowering code and library versions (a recompile with nothing changed never imports
    torchlib). Models past protobuf's 2 GB limit are not cached."""
    key = lowering_key(ir, opset)
    body = entry_cache.read("onnx", key, ".onnx")
    if body is not None:
        try:
            return onnx.ModelProto.FromString(body)
        except Exception:  # noqa: BLE001 - a damaged entry is rebuilt
            pass
    model = lower_to_onnx(ir, opset=opset)
    if _raw_bytes(model) < EXTERNAL_DATA_BYTES and model.ByteSize() < EXTERNAL_DATA_BYTES:
        entry_cache.write("onnx", key, model.SerializeToString(), ".onnx")
    return model


def save_onnx(model: onnx.ModelProto, path: Union[str, Path]) -> Path:
    """Write ``model`` to ``path``; weights go to an external-data file beside it past 2 GB
    (``model`` itself is left as it was, weights inside). Every tensor (initializers, attribute
    tensors such as ``Constant``'s, subgraphs, functions) is counted, and one that already keeps
    its data outside the model must name a plain file beside it (``external_data``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    check_locations(model, path)
    big = _raw_bytes(model) > EXTERNAL_DATA_BYTES
    if not big:
        return atomic_write(path, model.SerializeToString())
    # Past protobuf's 2 GB limit: write both files in a private folder beside, then move them in.
    with tempfile.TemporaryDirectory(prefix=".kl_onnx_", dir=path.parent) as work:
        onnx.save_model(model, os.path.join(work, path.name), save_as_external_data=True,
                        all_tensors_to_one_file=True, location=path.name + ".data")
        os.replace(os.path.join(work, path.name + ".data"), path.parent / (path.name + ".data"))
        os.replace(os.path.join(work, path.name), path)
    # onnx.save_model moved the weights out of the caller's model: give them back
    load_external_data_for_model(model, str(path.parent))
    return path
