"""``optimize=2``: kernel_lens's own skinny GEMM (:func:`kernel_lens.kernels.skinny_gemm.linear`)
in place of ``F.linear`` (every ``nn.Linear``) where the rows are few (issue 41).

The substitution is made while the forward runs, in the capture and in the trace alike, so the
own kernel's launches are captured, traced and AOT-compiled like the user's (the IR holds them
as ordinary launches; their configs are their constexprs). A call is taken when, for the size
the example has, x and the weight are fp16 or bf16 on one device, the weight is 2-D, x has at
least two dims and 1 <= rows <= 16 (rows: all of x's dims but the last, multiplied), and the
target arch has the tensor cores it needs (sm_80 or newer). In the trace the rows may be a
size expression: where its range is inside 1..16 the call is taken as is; where the range is
wider and the rows are one size, ``1 <= rows <= 16`` is a Python branch on a size, so the range
is split into pieces (:mod:`.trace.size_pieces`) and only the small-rows piece gets the own
kernel. A call the trace cannot take as the capture took it (rows from several sizes over a
range wider than 16, or from tensor values) is left to ``F.linear`` in both, and the forward is
captured again. The user's Triton launches are never changed.

After the first capture (:meth:`OwnKernels.plan`):

* **Nothing is reused across a write.** "Not written since" below means torch's version counter
  has not moved and, in the capture, no launch of the user's kernels came between (a Triton
  kernel writes without torch's counter knowing; in the trace torch sees its writes).
* **Siblings are fused.** Taken calls on one input tensor (the same object, not written in
  between: q/k/v of attention, gate/up of a gated MLP) whose weights (and biases, all or none)
  are the model's parameters or buffers run as one GEMM (up to 3 calls) over the weights
  concatenated along N (a buffer the model holds while the compile runs, so the graph has it
  as a weight); the kernel writes each call's result as its own contiguous tensor (segments of
  one buffer: no split, no copy). Every output column is computed as the call alone would
  compute it with the same config.
* **Residual adds join the GEMM.** ``y + r`` (or ``r + y``; ``torch.add``, ``Tensor.add``)
  where ``y`` is an unfused call's result, neither it nor the call's input written since, and
  ``r`` a contiguous tensor of y's shape, dtype and device, runs as the GEMM again with ``r`` as
  its residual: the same bits as the add (:func:`kernel_lens.kernels.skinny_gemm.linear`). The
  first launch is left without a reader when nothing else reads ``y``, and the lowering drops it
  (one launch and one read of y saved; where something else reads y, both run).
* **Configs are timed** on a GPU (:func:`kernel_lens.kernels.skinny_gemm.tune`: block sizes
  and the split over K, its second launch included); elsewhere they come from the table.

The forward is then captured again with both; any call that does not find its sibling's input
unchanged in that capture or in the trace breaks its group, and the forward is captured again.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from ..kernels import is_own_kernel
from ..kernels.decode_attention import decode_attention, split_count
from ..kernels.skinny_gemm import MAX_ROWS, GemmConfig, linear as own_linear, shared_room, table_config, tune
from .capture.patching import patched

log = logging.getLogger(__name__)

NAME = "own_skinny_gemm"  # the graph-pass names (kernel_lens.onnx.graph_passes.FRONT_END)
ATTENTION = "own_decode_attention"
_DTYPES = (torch.float16, torch.bfloat16)


@dataclass
class _Site:
    """What the capture saw at one ``F.linear`` call."""

    take: bool
    x: Any = None  # the input (held until the next capture: identity within one call)
    version: int = 0
    weight: str | None = None  # the model's parameter or buffer, by name (None: not one)
    bias: str | None = None
    weight_tensor: Any = None
    bias_tensor: Any = None
    writes: int = 0  # the user's launches the capture had seen (OwnKernels.launched)


@dataclass
class _Group:
    """Sibling calls run as one GEMM (see the module docstring)."""

    sites: tuple[int, ...]
    sizes: tuple[int, ...]  # each call's N
    weights: tuple[str, ...]  # each call's weight and bias names (what the trace checks)
    biases: tuple[str | None, ...]
    buffer: str  # the concatenated weight (and ``buffer + "_bias"``), held by the model


class OwnKernels:
    """``F.linear`` (``linear``) and ``F.scaled_dot_product_attention`` (``attention``)
    replaced while :meth:`active`; call sites are counted in call order."""

    def __init__(self, arch: int, linear: bool = True, attention: bool = False,
                 archs: Any = None):
        self.arch = arch
        self.room = shared_room(archs or (arch,))  # the GEMM's tiles run on every arch built
        self.linear, self.attention = linear, attention
        self.attention_taken: dict[int, bool] = {}  # the capture's decision per SDPA call
        self._attention_site = 0
        # launches of the user's kernels seen in this capture: a kernel may write a tensor
        # without torch's version counter knowing, so what a call saw is reused only where no
        # such launch came between (the trace, where torch sees the writes, checks versions)
        self.writes = 0
        self._repeats = _Repeats(self)
        # sites left to torch (the trace could not take them): F.linear's by number, SDPA's as
        # ("attention", number)
        self.excluded: set[Any] = set()
        self.sites: dict[int, _Site] = {}  # the last capture's record per F.linear site
        self.mismatched: set[Any] = set()  # sites the trace (or capture) decided otherwise
        self.groups: dict[int, _Group] = {}  # by first site
        self.configs: dict[tuple, GemmConfig] = {}  # by (N, K, bias): timed on a GPU
        self._fused: dict[str, torch.Tensor] = {}  # buffer name -> concatenated weight/bias
        self._planned = False
        self._tracing = False
        self._site = 0
        self._names: dict[int, str] = {}
        self._pending: dict[int, tuple] = {}  # site -> (x, version, result, group): its share
        self._model: Any = None
        # residual adds: the capture's decision per F.linear site, and the results an add may
        # take into the GEMM (id -> (result, its version, site, x, x's version, weight, bias))
        self.residual_taken: dict[int, bool] = {}
        self._results: dict[int, tuple] = {}
        self._adds = _Adds(self)

    @contextlib.contextmanager
    def active(self, model: Any, tracing: bool) -> Iterator["OwnKernels"]:
        """The functions replaced; sites are counted from 0 in each call of ``model``'s forward
        (torch.export may run it more than once); the groups' weights are the model's buffers."""
        if not isinstance(model, torch.nn.Module) or "forward" in model.__dict__:
            log.info("optimize=2: %s is not a torch.nn.Module with its class's forward; "
                     "F.linear is left as it is", type(model).__name__)
            yield self
            return
        self._tracing = tracing
        if tracing:
            self.mismatched = set()
        else:
            self.sites, self.attention_taken, self.residual_taken = {}, {}, {}
        forward = model.forward

        @functools.wraps(forward)  # the forward's signature, which torch.export reads
        def counted(*args: Any, **kwargs: Any) -> Any:
            self._site, self._pending, self._attention_site, self._results = 0, {}, 0, {}
            self.writes = 0
            self._repeats.seen = {}
            self._names = {id(t): n for n, t in itertools.chain(
                model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))}
            self._model = model
            return forward(*args, **kwargs)

        model.forward = counted
        for name, tensor in self._fused.items():
            model.register_buffer(name, tensor, persistent=False)
        try:
            with contextlib.ExitStack() as stack:
                if self.linear:
                    stack.enter_context(patched(F, "linear", self._linear(F.linear)))
                    stack.enter_context(self._adds)
                if self.attention:
                    stack.enter_context(patched(F, "scaled_dot_product_attention",
                                                self._sdpa(F.scaled_dot_product_attention)))
                    stack.enter_context(self._repeats)
                yield self
        finally:
            del model.forward
            for name in self._fused:
                delattr(model, name)
            self._pending, self._model, self._results = {}, None, {}

    def _linear(self, original: Any) -> Any:
        def linear(input: Any, weight: Any, bias: Any = None) -> Any:  # F.linear's names
            x = input
            site, self._site = self._site, self._site + 1
            if site in self._pending:
                return self._sibling(site, x, weight, bias, original)
            if self._tracing:  # only what the capture took, where the trace can take it too
                was = site in self.sites and self.sites[site].take
                take = was and self._fits(x, weight, bias) and self._rows_take(x, site)
                if take != was:
                    self.mismatched.add(site)
            else:
                take = site not in self.excluded and self._fits(x, weight, bias) and _rows_fit(x)
                self.sites[site] = _Site(take, x, x._version, *self._named(weight, bias), weight, bias,
                                         self.writes)
            if not take:
                return original(x, weight, bias)
            group = self.groups.get(site)
            if group is None:
                y = own_linear(x, weight, bias, self._config(weight, bias))
                self._results[id(y)] = (y, y._version, site, x, x._version, weight, bias, self.writes)
                return y
            if self._named(weight, bias) != (group.weights[0], group.biases[0]):
                self.mismatched.add(site)
                return own_linear(x, weight, bias, self._config(weight, bias))
            fused_w = self._model.get_buffer(group.buffer)
            fused_b = self._model.get_buffer(group.buffer + "_bias") if group.biases[0] else None
            parts = own_linear(x, fused_w, fused_b, self._config(fused_w, fused_b), segments=group.sizes)
            for s, part in zip(group.sites[1:], parts[1:]):
                self._pending[s] = (x, x._version, part, group, self.writes)
            return parts[0]
        return linear

    def _sibling(self, site: int, x: Any, weight: Any, bias: Any, original: Any) -> Any:
        """A group member's call: its share of the group's GEMM, if its input is the first
        call's, unwritten, and its weight the one planned."""
        first_x, version, part, group, writes = self._pending.pop(site)
        i = group.sites.index(site)
        named = self._named(weight, bias)
        if not self._tracing:
            self.sites[site] = _Site(True, x, x._version, *named, weight, bias, self.writes)
        same = x is first_x and x._version == version and writes == self.writes \
            and named == (group.weights[i], group.biases[i])
        if same:
            return part
        self.mismatched.add(site)
        return own_linear(x, weight, bias, self._config(weight, bias)) \
            if self._fits(x, weight, bias) and _rows_fit(x) else original(x, weight, bias)

    def launched(self, launch: Any) -> None:
        """The capture's ``after_launch``: a launch of the user's kernel (it may have written
        any tensor it was given)."""
        fn = getattr(launch.jit, "fn", None)
        if not is_own_kernel(f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}"):
            self.writes += 1

    def _named(self, weight: Any, bias: Any) -> tuple[str | None, str | None]:
        """The model's names of ``weight`` and ``bias`` (None: not a parameter or buffer, or
        no bias)."""
        return self._names.get(id(weight)), None if bias is None else self._names.get(id(bias))

    def _config(self, weight: Any, bias: Any) -> GemmConfig:
        n, k = int(weight.shape[0]), int(weight.shape[1])
        return self.configs.get((n, k, bias is not None)) or table_config(n, k, self.room)

    def _decide(self, key: tuple[str, int], taken: dict[int, bool], fits: bool) -> bool:
        """Whether the call ``key`` (kind, site) is taken: the capture takes what fits and is not
        excluded, and records it in ``taken``; the trace takes what the capture took where it
        fits, and notes a call it decides otherwise (the forward is captured again)."""
        site = key[1]
        if self._tracing:
            was = taken.get(site, False)
            if (was and fits) != was:
                self.mismatched.add(key)
            return was and fits
        taken[site] = key not in self.excluded and fits
        return taken[site]

    def residual(self, y: Any, other: Any) -> Any:
        """``y + other`` as one GEMM when ``y`` is an unfused F.linear call's result (neither it
        nor the call's input written since) and ``other`` a tensor shaped like it, of its dtype
        and device, its rows contiguous: the GEMM again with ``other`` as its residual (the same
        bits as the add; the first GEMM's launch is left without a reader, and lowering drops
        it). None: the add is torch's. The trace takes what the capture took, or the call's
        group of launches differs and the forward is captured again."""
        hit = self._results.pop(id(y), None) if isinstance(y, torch.Tensor) else None
        if hit is None or hit[0] is not y:
            return None
        _, version, site, x, x_version, weight, bias, writes = hit
        fits = y._version == version and x._version == x_version and writes == self.writes \
            and _residual_fits(y, other)
        if not self._decide(("residual", site), self.residual_taken, fits):
            return None
        return own_linear(x, weight, bias, self._config(weight, bias), residual=other)

    # ------------------------------------------------------------------ attention
    def _sdpa(self, original: Any) -> Any:
        def sdpa(query: Any, key: Any, value: Any, attn_mask: Any = None, dropout_p: float = 0.0,
                 is_causal: bool = False, scale: Any = None, enable_gqa: bool = False) -> Any:
            site, self._attention_site = self._attention_site, self._attention_site + 1
            k, v = self._repeats.heads(key), self._repeats.heads(value)
            if k is None or v is None:  # K/V not both repeat_kv'd: as given
                k, v = key, value
            mask = _mask_rows(attn_mask, query, k)
            fits = self.arch >= 80 and _attention_fits(query, k, v, dropout_p, is_causal, scale) \
                and (attn_mask is None or mask is not None)
            if not self._decide(("attention", site), self.attention_taken, fits):
                return original(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
            # the capture's sizes, and in the trace the example's (a constexpr both must agree on)
            splits = split_count(_hint(query.shape[0], 1), int(k.shape[1]), _hint(k.shape[2], 1024))
            out = decode_attention(query[:, :, 0], k, v, None, scale, splits=splits, mask=mask)
            return out.unsqueeze(2)
        return sdpa

    # ------------------------------------------------------------------ between captures
    def plan(self) -> bool:
        """After the first capture: sibling groups and timed configs (see the module
        docstring). True when the next capture must run with them."""
        if self._planned:
            return False
        self._planned = True
        by_input: dict[tuple, list[int]] = {}
        for site, r in sorted(self.sites.items()):
            if r.take and r.weight is not None and (r.bias_tensor is None or r.bias is not None):
                key = (id(r.x), r.version, r.writes, r.bias_tensor is not None)
                by_input.setdefault(key, []).append(site)
        chunks = [sites[i:i + 3] for sites in by_input.values() for i in range(0, len(sites), 3)]
        for sites in chunks:  # at most 3 a GEMM (its output segments)
            if len(sites) < 2:
                continue
            rs = [self.sites[s] for s in sites]
            name = f"_kl_own_linear_{sites[0]}"
            self._fused[name] = torch.cat([r.weight_tensor.detach() for r in rs])
            if rs[0].bias_tensor is not None:
                self._fused[name + "_bias"] = torch.cat([r.bias_tensor.detach() for r in rs])
            self.groups[sites[0]] = _Group(tuple(sites), tuple(int(r.weight_tensor.shape[0]) for r in rs),
                                           tuple(r.weight for r in rs), tuple(r.bias for r in rs), name)
        weights = [(r.weight_tensor, r.bias_tensor, r.x) for s, r in sorted(self.sites.items())
                   if r.take and not any(s in g.sites for g in self.groups.values())]
        weights += [(self._fused[g.buffer], self._fused.get(g.buffer + "_bias"), self.sites[first].x)
                     for first, g in self.groups.items()]
        for w, b, x in weights:
            key = (int(w.shape[0]), int(w.shape[1]), b is not None)
            if key not in self.configs:
                self.configs[key] = tune(int(_rows(x)), w, b, self.room)
        changed = bool(self.groups) or any(c != table_config(n, k, self.room)
                                           for (n, k, _), c in self.configs.items())
        if self.groups:
            log.info("optimize=2: F.linear calls %s run as %d GEMMs on concatenated weights",
                     sorted(s for g in self.groups.values() for s in g.sites), len(self.groups))
        for r in self.sites.values():  # nothing past here needs the tensors
            r.x = r.weight_tensor = r.bias_tensor = None
        return changed

    def retry(self) -> str:
        """After a capture or trace that found calls otherwise than planned: the groups they
        belong to run unfused; when none does, the calls are left to ``F.linear``. Says what
        changed (each retry removes a group or leaves a call to F.linear: retries end)."""
        broken = sorted(first for first, g in self.groups.items() if set(g.sites) & self.mismatched)
        for first in broken:
            group = self.groups.pop(first)
            self._fused.pop(group.buffer)
            self._fused.pop(group.buffer + "_bias", None)
        if broken:
            what = f"the sibling calls grouped at {broken} run unfused"
        else:
            self.excluded |= self.mismatched
            linear = sorted(m for m in self.mismatched if isinstance(m, int))
            attention = sorted(m[1] for m in self.mismatched if not isinstance(m, int) and m[0] == "attention")
            residual = sorted(m[1] for m in self.mismatched if not isinstance(m, int) and m[0] == "residual")
            parts = []
            if linear:
                parts.append(f"F.linear calls {linear} keep ONNX MatMul")
            if attention:
                parts.append(f"SDPA calls {attention} keep ONNX Attention")
            if residual:
                parts.append(f"the adds after F.linear calls {residual} stay ONNX Add")
            what = "; ".join(parts) + " (the trace could not take them as the capture did)"
        self.mismatched = set()
        return what

    def _fits(self, x: Any, weight: Any, bias: Any) -> bool:
        """What does not depend on the rows: dtypes, devices, dims, the arch."""
        if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)) or self.arch < 80:
            return False
        if x.dtype not in _DTYPES or weight.dtype != x.dtype or weight.dim() != 2 or x.dim() < 2:
            return False
        if not all(isinstance(d, int) for d in weight.shape) or x.device != weight.device:
            return False
        if bias is not None and (not isinstance(bias, torch.Tensor) or bias.dtype != x.dtype
                                 or tuple(bias.shape) != (weight.shape[0],)
                                 or bias.device != x.device):  # a broadcast bias is MatMul's
            return False
        return isinstance(x.shape[-1], int) and x.shape[-1] == weight.shape[1]

    @staticmethod
    def _rows_take(x: torch.Tensor, site: int) -> bool:
        """The trace's decision for symbolic rows (see the module docstring)."""
        rows = _rows(x)
        if isinstance(rows, int):
            return 1 <= rows <= MAX_ROWS
        node = rows.node
        hint = node.hint
        if hint is None or not 1 <= hint <= MAX_ROWS:
            return False
        expr = node.expr
        bound = node.shape_env.bound_sympy(expr)
        if bound.lower >= 1 and bound.upper <= MAX_ROWS:
            return True
        dims = [d for d in x.shape[:-1] if not isinstance(d, int)]
        if len({d.node.expr for d in dims}) != 1 or not dims[0].node.expr.is_Symbol:
            log.info("optimize=2: F.linear call %d keeps ONNX MatMul: its rows %s range over "
                     "%s..%s, and are not one size times constants", site, expr, bound.lower,
                     bound.upper)
            return False
        # rows = c * s**p grows with s: the small-rows piece is s <= top (an integer bound for
        # torch: a guard like 3*s <= 16 would make it solve for s <= 16/3)
        size, top = dims[0].node.expr, 0
        while top < MAX_ROWS and int(expr.subs(size, top + 1)) <= MAX_ROWS:
            top += 1
        return bool(dims[0] >= 1) and bool(dims[0] <= top)  # a size branch: the range is split


def _rows(x: torch.Tensor) -> Any:
    rows = 1
    for d in x.shape[:-1]:
        rows = rows * d
    return rows


def _rows_fit(x: torch.Tensor) -> bool:
    return 1 <= _rows(x) <= MAX_ROWS


# ----------------------------------------------------------------------------- attention helpers
_RESHAPES = (torch.Tensor.reshape, torch.reshape, torch.Tensor.view)


class _Repeats(TorchFunctionMode):
    """Watches the forward for ``repeat_kv``: a [B, H, S, D] reshape of a tensor expanded along
    dim 2 ([B, H, G, S, D], stride 0 there), whose K/V heads are that tensor at index 0 of dim 2
    (a view of the cache: no copy)."""

    def __init__(self, owner: "OwnKernels") -> None:
        super().__init__()
        self.owner = owner
        self.seen: dict[int, tuple[Any, Any, int, int]] = {}

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func in _RESHAPES and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor):
            t = args[0]
            if t.dim() == 5 and out.dim() == 4 and isinstance(t.stride(2), int) and t.stride(2) == 0 \
                    and isinstance(t.shape[2], int) and isinstance(t.shape[1], int) \
                    and isinstance(out.shape[1], int) and out.shape[1] == t.shape[1] * t.shape[2] \
                    and all(_same(out.shape[i], t.shape[j]) for i, j in ((0, 0), (2, 3), (3, 4))):
                self.seen[id(out)] = (out, t, t._version, self.owner.writes)
        return out

    def heads(self, tensor: Any) -> Any:
        """The K/V heads ``tensor`` repeats (a view), or None; None also when they were written
        since (``tensor``, a copy, holds what they were)."""
        hit = self.seen.get(id(tensor))
        if hit is None or hit[0] is not tensor or hit[1]._version != hit[2] or hit[3] != self.owner.writes:
            return None
        return hit[1][:, :, 0]


_ADDS = (torch.Tensor.__add__, torch.Tensor.__radd__, torch.Tensor.add, torch.add)


class _Adds(TorchFunctionMode):
    """Watches the forward for ``a + b`` (``torch.add``, ``Tensor.add``; no ``alpha``, no
    ``out``) of two tensors, one an own GEMM's result: :meth:`OwnKernels.residual` may make it
    the GEMM's epilogue."""

    def __init__(self, owner: OwnKernels) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if func in _ADDS and not kwargs and len(args) == 2 \
                and all(isinstance(a, torch.Tensor) for a in args) and args[0] is not args[1]:
            for y, other in (args, args[::-1]):
                fused = self.owner.residual(y, other)
                if fused is not None:
                    return fused
        return func(*args, **(kwargs or {}))


def _residual_fits(y: torch.Tensor, other: Any) -> bool:
    """``other`` is what the GEMM's epilogue can add to ``y``: a tensor of y's shape (no
    broadcast), dtype and device, contiguous (dims of size 1 aside)."""
    if not isinstance(other, torch.Tensor) or other.dtype != y.dtype or other.device != y.device \
            or other.dim() != y.dim() or not all(_same(a, b) for a, b in zip(other.shape, y.shape)):
        return False
    step: Any = 1
    for size, stride in zip(reversed(other.shape), reversed(other.stride())):
        if not (_one(size) or _same(stride, step)):
            return False
        step = step * size
    return True


def _same(a: Any, b: Any) -> bool:
    """Sizes equal without asking torch (which would record a guard on symbolic sizes)."""
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    ea = a.node.expr if isinstance(a, torch.SymInt) else a
    eb = b.node.expr if isinstance(b, torch.SymInt) else b
    return bool(ea == eb)


def _hint(size: Any, default: int) -> int:
    """A size's value: its own, a symbolic one's example value, else ``default``."""
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return default if hint is None else int(hint)


def _one(size: Any) -> bool:
    return isinstance(size, int) and size == 1


def _attention_fits(q: Any, k: Any, v: Any, dropout_p: Any, is_causal: Any, scale: Any) -> bool:
    """One query position, fp16/bf16, K/V of one shape with head counts dividing the query's,
    one head size of at most 512, last dims contiguous, no dropout, not causal, a constant scale."""
    tensors = (q, k, v)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in tensors):
        return False
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype or len({t.device for t in tensors}) != 1:
        return False
    if not (isinstance(dropout_p, (int, float)) and dropout_p == 0) or is_causal is not False \
            or not (scale is None or isinstance(scale, (int, float))):
        return False
    if not _one(q.shape[2]) or not all(_one(t.stride(3)) for t in tensors):
        return False
    heads, kv_heads = q.shape[1], k.shape[1]
    if not all(isinstance(d, int) for d in (heads, kv_heads, v.shape[1], q.shape[3], k.shape[3], v.shape[3])):
        return False
    if q.shape[3] > 512:  # past 512 even a 16-key K/V tile outgrows sm_86/sm_89's shared memory
        return False
    return heads % kv_heads == 0 and v.shape[1] == kv_heads and q.shape[3] == k.shape[3] == v.shape[3] \
        and _same(q.shape[0], k.shape[0]) and _same(k.shape[0], v.shape[0]) and _same(k.shape[2], v.shape[2])


def _mask_rows(mask: Any, q: Any, k: Any) -> Any:
    """A bool mask that is one row of keys per sequence or for all ([..., 1, 1, S] with a batch
    dim of 1 or q's, S k's), as [B or 1, S]; else None."""
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or not 1 <= mask.dim() <= 4 \
            or not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(k, torch.Tensor) or k.dim() != 4:
        return None
    m = mask[(None,) * (4 - mask.dim())]
    if not (_one(m.shape[1]) and _one(m.shape[2]) and _one(m.stride(3)) and _same(m.shape[3], k.shape[2])):
        return None
    if not (_one(m.shape[0]) or _same(m.shape[0], q.shape[0])):
        return None
    return m[:, 0, 0, :]
