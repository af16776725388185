"""The compile driver: front-ends, then the pass pipeline, then the targets (the output
folder's safety is :mod:`kernel_lens.artifact_folder`'s)."""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import reprlib
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from . import progress
from .archs import names as arch_names
from .errors import ArtifactError, CacheError, InputError, IRError, KernelLensError, OutputPathError
from .artifact_folder import move_in, read_folder, shown, staging_folder, write_manifest
from .fileio import atomic_copy, atomic_write, check_folder, ensure_folder, inside, umask
from .frontends.aot import compile_binary
from .frontends.lift import lift_with_outputs
from .ir import GraphIR
from .onnx.graph_passes import FRONT_END, resolve as resolve_graph_passes
from .onnx.lower import supported
from .passes import PassContext, PassManager, PassTiming, default_pipeline
from .runtime.interpreted import InterpretedModel
from .runtime.signature import check_device
from .summary import summarize
from .targets.base import StagedTarget, available_targets, get_target
from .targets.ort.target import onnx_graph as ort_onnx_graph
from .toolchain import cache
from .version import __version__

log = logging.getLogger(__name__)




@dataclass
class CompiledModel:
    """The result of :func:`compile` (or :func:`load`): the final IR and its artifacts.

    Artifact paths are absolute (a bare name would reach the dynamic loader's search path when
    a runner opens a library). ``folder``, set by :func:`load` and :meth:`save`, is the real
    folder they must still lie in when a runner is made (checked again then)."""

    ir: GraphIR
    example_outputs: Any = None  # what the eager forward returned during capture
    timings: list[PassTiming] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)
    cuda_graph: bool = False  # the default of run(cuda_graph=...)
    folder: Path | None = None
    _runners: dict[tuple[str, bool], Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.artifacts = {kind: Path(path).absolute() for kind, path in self.artifacts.items()}

    def summary(self) -> str:
        return summarize(self.ir, self.timings)

    def __repr__(self) -> str:  # one line (the dataclass's would print the whole IR: PTX, weights)
        ir = self.ir
        launches = sum(len(g.launches) for g in ir.graphs())
        pieces = (f", {len(ir.pieces)} size pieces" if ir.pieces else
                  f", {len(ir.branches)} value branches" if ir.branches else "")
        where = f", folder={str(self.folder)!r}" if self.folder else ""
        return (f"CompiledModel({ir.name}: {len(ir.inputs)} inputs, {len(ir.outputs)} outputs, "
                f"{launches} launches of {len(ir.all_kernels())} kernels{pieces}, {arch_names(a for a, _ in ir.built_archs())}, "
                f"targets={self.backends()}{where}; .summary() shows all)")

    def write(self, directory: str | Path, targets: Iterable[str] = (),
              stop_after: str | None = None) -> dict[str, Path]:
        """Write the IR, the summary and each target's artifacts into ``directory`` (each
        target's stages up to ``stop_after`` when given, e.g. ``"emit"``: the C++ sources).

        Everything is built in a staging folder beside ``directory`` (inside it when its parent
        cannot be written) and moved in only when complete, so an interrupted or failed build
        leaves the folder as it was. The move holds the folder's lock (a second build finishing
        into it waits), removes the manifest first and writes it last, recording each file's sha256;
        files an earlier build listed that this one does not make are removed (no orphans).
        File names come from the IR's name, a validated identifier; every path is checked to lie
        inside ``directory`` (links at those names are replaced)."""
        directory = ensure_folder(directory)
        staging = staging_folder(directory)
        try:
            made = self._write_into(staging, targets, stop_after)
            with progress.stage("write"):
                move_in(staging, directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        here = directory.absolute()
        self.artifacts.update({k: here / rel for k, rel in made.items()})
        return dict(self.artifacts)

    def _write_into(self, directory: Path, targets: Iterable[str],
                    stop_after: str | None) -> dict[str, Path]:
        """Every artifact written into the (empty) ``directory``: kind -> path relative to it."""
        stem = self.ir.name
        made = {"ir": self.ir.save(inside(directory, f"{stem}.ir.json")),
                "summary": atomic_write(inside(directory, f"{stem}.summary.txt"), self.summary())}
        here = directory.absolute()
        for name in targets:
            target = get_target(name)
            if isinstance(target, StagedTarget):  # it reports each of its stages itself
                built = target.build_until(self.ir, directory, stop_after)
            else:
                with progress.stage(f"{name}: build"):  # a third party's target: one stage
                    built = target.build_until(self.ir, directory, stop_after)
            for kind, path in built.items():
                path = Path(path)
                if not path.is_absolute() and not path.is_relative_to(directory):
                    path = directory / path  # a bare name: relative to the output folder
                path = path.absolute()
                if not path.is_relative_to(here):
                    raise OutputPathError(f"target {name!r} returned artifact {kind!r} at {path}, "
                                          f"outside the output folder")
                made[f"{name}.{kind}"] = inside(directory, path.relative_to(here))
        made = {k: Path(v).absolute().relative_to(here) for k, v in made.items()}
        write_manifest(directory, stem, made)
        return made

    def backends(self) -> list[str]:
        """Targets whose artifacts this model has (each may have a runner)."""
        return sorted({kind.split(".", 1)[0] for kind in self.artifacts if "." in kind})

    def runner(self, backend: str | None = None, *, cuda_graph: bool | str | None = None) -> Any:
        """The target's runner over this model's artifacts (made once, then reused; the
        artifacts it opens are checked again, just before, to be regular files in the folder)."""
        _check_backend_name(backend)
        graph = self.cuda_graph if cuda_graph is None else cuda_graph
        if not isinstance(graph, (bool, str)):  # a mode's name is the runner's to check
            raise InputError(f"cuda_graph={reprlib.repr(graph)}: pass True, False or the name of "
                             f"a graph mode of the runner (the runner names its modes)")
        asked = (backend, graph)
        if asked not in self._runners:  # resolve the name once: run() calls this on every call
            backend = self._backend(backend)
            key = (backend, graph)
            if key not in self._runners:
                prefix = f"{backend}."
                artifacts = {k[len(prefix):]: self._recheck(k, v) for k, v in self.artifacts.items()
                             if k.startswith(prefix)}
                options = {"cuda_graph": graph} if graph else {}
                self._runners[key] = get_target(backend).runner(self.ir, artifacts, **options)
            self._runners[asked] = self._runners[key]
        return self._runners[asked]

    def _recheck(self, kind: str, path: Path) -> Path:
        """``path`` (absolute) if it is still a regular file inside :attr:`folder` (when set):
        the folder may have changed since :func:`load` checked it."""
        path = Path(path).absolute()
        real = Path(os.path.realpath(path))
        if self.folder is not None and not real.is_relative_to(self.folder):
            raise ArtifactError(f"artifact {kind!r} ({shown(path)}) now resolves outside "
                                f"{shown(self.folder)} (through a link); refusing to open it")
        if not real.is_file():
            raise ArtifactError(f"artifact {kind!r} ({shown(path)}) is missing or not a regular "
                                f"file; recompile or load the folder again")
        return path

    def _backend(self, backend: str | None) -> str:
        """The built target ``backend`` names (a target, an alias such as "tensorrt", or None:
        the only target built)."""
        built = self.backends()
        if backend is None:
            if len(built) != 1:
                raise KernelLensError(
                    f"{self.ir.name}: " + (f"built for {built}; pick one with backend=" if built else
                                           "no target was built; compile with targets=['ort']"))
            return built[0]
        if backend in built:
            return backend
        named = [b for b in built if backend in get_target(b).aliases]
        if len(named) > 1:
            raise InputError(f"{self.ir.name}: backend {backend!r} could be any of {named}; "
                             f"pick one with backend=")
        if not named:
            target = backend if backend in available_targets() else next(
                (t for t in available_targets() if backend in get_target(t).aliases), backend)
            raise InputError(f"{self.ir.name} was not built for backend {backend!r} (built: "
                             f"{built or 'none'}); compile with targets=[{target!r}]")
        return named[0]

    def run(self, *tensors: Any, out: Any = None, backend: str | None = None,
            cuda_graph: bool | str | None = None) -> Any:
        """Run the compiled model on torch CUDA tensors with a target's runner (``backend``: a
        target built, or an alias: "onnxruntime", "tensorrt"; default, the only target built;
        ``cuda_graph``: replay a CUDA graph per input shape, True or "torch" (a torch graph of
        ORT's Run) or "ort" (ORT's own graph mode); see :mod:`kernel_lens.runtime.ort`).

        With CPU tensors, the artifact is *evaluated* instead (:meth:`interpreted`): its ONNX
        graph by ONNX's reference evaluator, each launch by Triton's interpreter. A slow
        checking path, never taken for CUDA tensors."""
        if tensors and all(isinstance(t, torch.Tensor) and t.device.type == "cpu" for t in tensors) \
                and self._evaluates_on_cpu(backend):
            if cuda_graph:
                raise InputError(f"cuda_graph={cuda_graph!r} with CPU tensors: CUDA graphs need "
                                 f"CUDA tensors (CPU tensors evaluate the model on the CPU)")
            return self.interpreted(backend).run(*tensors, out=out)
        return self.runner(backend, cuda_graph=cuda_graph).run(*tensors, out=out)

    def _evaluates_on_cpu(self, backend: str | None) -> bool:
        """CPU tensors are evaluated (:meth:`interpreted`) for a model built for no target or
        for a target that wrote an ONNX graph; a target without one (a third party's) gets them."""
        _check_backend_name(backend)
        if not self.backends() and backend is None:
            return True
        return f"{self._backend(backend)}.onnx" in self.artifacts

    def interpreted(self, backend: str | None = None) -> InterpretedModel:
        """The CPU evaluation of this model (:mod:`kernel_lens.runtime.interpreted`): the ONNX
        graph of ``backend``'s artifacts (default: the only target built); a model built for no
        target evaluates the graph the ORT target would write."""
        _check_backend_name(backend)
        key = (f"cpu:{backend}", False)
        if key not in self._runners:
            if self.backends() or backend is not None:
                name = self._backend(backend)
                if f"{name}.onnx" not in self.artifacts:
                    raise KernelLensError(f"{self.ir.name}: target {name!r} wrote no ONNX graph, so "
                                          f"there is nothing to evaluate on the CPU; run it on CUDA "
                                          f"tensors, or compile for the 'ort' target too")
                graph: Any = self._recheck(f"{name}.onnx", self.artifacts[f"{name}.onnx"])
            else:
                graph = ort_onnx_graph(self.ir)
            self._runners[key] = InterpretedModel(self.ir, graph)
        return self._runners[key]

    def save(self, directory: str | Path) -> "CompiledModel":
        """Copy the artifacts (and a manifest recording their sha256) into ``directory``;
        returns the saved model. Staged and moved in as :meth:`write` does, under the folder's
        lock, so a save racing a build into one folder never leaves a mix of the two."""
        directory = ensure_folder(directory)
        staging = staging_folder(directory)
        names: dict[str, Path] = {}
        try:
            for kind, path in self.artifacts.items():
                atomic_copy(path, inside(staging, path.name), mode=0o644 if path.suffix != ".so" else 0o755)
                names[kind] = Path(path.name)
            write_manifest(staging, self.ir.name, names)
            move_in(staging, directory)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        here = directory.absolute()
        saved = {kind: here / name for kind, name in names.items()}
        return CompiledModel(self.ir, self.example_outputs, list(self.timings), saved, self.cuda_graph,
                             folder=directory.resolve())


def _check_backend_name(backend: object) -> None:
    if backend is not None and not isinstance(backend, str):
        raise InputError(f"backend must be a target name such as 'ort' (a str), got "
                         f"{type(backend).__name__} {reprlib.repr(backend)}")


def load(directory: str | Path, *, cuda_graph: bool = False) -> CompiledModel:
    """Reopen a compiled artifact folder without recompiling anything.

    The manifest and IR are data: they are validated, never executed, and read once, through
    descriptors checked to be regular files inside the folder. The folder is resolved once
    (``"."`` and ``""`` are the current folder) and every artifact path is stored absolute, so
    no runner ever hands a bare library name to the dynamic loader. Only the artifacts the
    manifest names inside ``directory`` are used, each only if its sha256 is the one the
    manifest records (all from the one build that wrote the manifest, unedited); a plugin
    library is opened later, by ``run`` (which checks the paths again first).
    """
    root, artifacts, text = read_folder(directory)  # each file checked against the manifest's sha256
    try:
        ir = GraphIR.from_json(text.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ArtifactError(f"{shown(artifacts['ir'])} is not UTF-8 text ({exc.reason})") from None
    except IRError as exc:
        raise ArtifactError(f"{shown(artifacts['ir'])}: {exc}") from None
    except (ValueError, RecursionError) as exc:  # anything the validators let through untyped
        raise ArtifactError(f"{shown(artifacts['ir'])} is not a valid IR document "
                            f"({type(exc).__name__}); recompile into the folder") from None
    if torch.cuda.is_available():  # built for archs this GPU cannot run: said now, in one line
        check_device(ir, torch.cuda.current_device())
    return CompiledModel(ir, artifacts=artifacts, cuda_graph=cuda_graph, folder=root)


def artifact_cache_dir() -> Path:
    """Where compile() without output_dir keeps artifacts: <build cache>/artifacts (the location
    lives in :mod:`kernel_lens.toolchain.cache`, with every cache's)."""
    return cache.artifacts_dir()


def _compile_into_cache(compiled: CompiledModel, targets: list[str]) -> CompiledModel:
    """Write the artifacts into a content-addressed folder of the cache (reused when present).

    The entry is trusted by the cache's rules (:mod:`kernel_lens.toolchain.cache`): the cache
    folders must be real, the user's own and writable by no one else (else CacheError); the
    entry's folders and files must be too, and its files exactly those recorded with their
    sha256 when it was written, else it is removed and written again (a warning says why)."""
    key = hashlib.sha256(json.dumps({"ir": compiled.ir.fingerprint(), "targets": sorted(targets),
                                     "kernel_lens": __version__}, sort_keys=True).encode()).hexdigest()
    root = cache.cache_folder(cache.ARTIFACTS)
    final = root / key[:24]
    if os.path.lexists(final):
        cache.trusted_folder(final, "artifact cache entry", removable=True)
        problem = cache.tree_problem(final)
        if problem is not None:
            log.warning("artifact cache entry not reused, it is rebuilt: %s", problem)
            cache.discard(final)
    if not os.path.lexists(final):
        work = Path(tempfile.mkdtemp(prefix=f".{key[:12]}.", dir=root))
        try:
            os.chmod(work, 0o755 & ~umask())  # mkdtemp made it 0700
            compiled.write(work, targets)
            cache.seal_tree(work)  # no group/other write bit; each file's sha256 recorded
            try:
                os.replace(work, final)  # atomic; another process may have won the race
            except OSError:
                if not final.is_dir():
                    raise
                cache.trusted_folder(final, "artifact cache entry", removable=True)
                problem = cache.tree_problem(final)
                if problem is not None:
                    raise CacheError(f"artifact cache entry {final} was written meanwhile but "
                                     f"cannot be trusted ({problem}); remove it (it is rebuilt)")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    else:
        progress.log.info("%s: reused from cache (%s)", ", ".join(targets) or "IR", final)
    reused = load(final)
    reused.example_outputs, reused.timings = compiled.example_outputs, compiled.timings
    return reused


def lift(model: Callable, example_inputs: Iterable[Any], **kwargs: Any) -> GraphIR:
    """The front half (capture, trace, AOT compile) ending in GraphIR, with the ATen ops the
    ONNX lowering cannot translate decomposed as ``torch.onnx.export`` does (keyword arguments
    as :func:`kernel_lens.frontends.lift.lift_with_outputs`)."""
    ir = lift_with_outputs(model, tuple(example_inputs), translatable=supported, **kwargs)[0]
    check_autotune(kwargs.get("autotune"), ir)
    return ir


def check_autotune(autotune: dict | None, ir: GraphIR) -> None:
    """Every kernel an ``autotune`` override names is launched and autotuned, else an InputError
    listing the kernels (an override that matched nothing would be ignored without a word)."""
    if not autotune:
        return
    kernels = ir.all_kernels().values()
    launched = sorted({k.name for k in kernels})
    tuned = sorted({k.name for k in kernels if k.options.autotune_config is not None})
    for name in autotune:
        matches = [k for k in kernels if name == k.name]
        by_id = [k for k in kernels if name == k.id]
        if by_id and not matches:  # capture picks configs by the kernel's Python name
            raise InputError(f"autotune names kernel {reprlib.repr(name)} by its IR id; name it by "
                             f"its Python name {by_id[0].name!r} (the config applies to every "
                             f"launch of that kernel)")
        if not matches:
            raise InputError(f"autotune names kernel {reprlib.repr(name)}, which the model does not "
                             f"launch; its kernels: {', '.join(launched) or 'none'}; autotuned: "
                             f"{', '.join(tuned) or 'none'}")
        if all(k.options.autotune_config is None for k in matches):
            raise InputError(f"autotune names kernel {name!r}, which is not autotuned "
                             f"(@triton.autotune), so no config can be picked; autotuned kernels: "
                             f"{', '.join(tuned) or 'none'}")


def pass_context(options: dict | None = None, *, import_kernels: bool = False) -> PassContext:
    """The context the built-in passes run with: ``options``, and a kernel compiler that finds a
    kernel's @triton.jit functions where this process captured or imported them. An IR read from
    JSON names modules; they are imported only with ``import_kernels=True``."""
    return PassContext(options=dict(options or {}),
                       compile_binary=functools.partial(compile_binary, import_modules=import_kernels))


def compile(model: Callable, example_inputs: Iterable[Any], *, dynamic_shapes: Any = None,
            arch: int | Iterable[int] | None = None,
            roles: dict[str, dict[str, str]] | None = None,
            autotune: dict[str, dict] | None = None, pass_manager: PassManager | None = None,
            options: dict | None = None, output_dir: str | Path | None = None,
            targets: Iterable[str] = (), dynamic: bool = False,
            optimize: int | Sequence[str] | None = None,
            extra_examples: Sequence[Any] | None = None,
            stop_after: str | None = None, dump_after: Iterable[str] = (),
            dump: Callable[[str, GraphIR], None] | None = None) -> CompiledModel:
    """Lift ``model`` into GraphIR and run the pass pipeline over it.

    ``arch`` is the GPU's compute capability (default: the local GPU's, else 90), or several
    (``[80, 90]``: a binary per arch in one artifact set; the device's is picked at run time).
    ``dynamic_shapes`` follows torch.export; ``dynamic=True`` instead makes every input dim
    that can vary dynamic (``Dim.AUTO``; the ranges torch settled on are ``ir.symbols``, shown
    by ``summary()``); ``roles`` overrides role inference per kernel
    (``{"kernel": {"param": "input"}}``); ``autotune`` picks a config per autotuned kernel
    (``{"kernel": {"BLOCK": 128}}``); ``options`` configure passes (e.g. ``ptx_version``);
    ``targets`` (e.g. ``["ort"]``) are built into ``output_dir``. ``optimize`` chooses the
    optimizations of the lowered ONNX graph (:mod:`kernel_lens.onnx.graph_passes`): a level
    (``0``: none; ``1``, the default: fused sibling GEMMs, grouped-query attention without
    expanded K/V; ``2``: also kernel_lens's own skinny GEMM for ``F.linear`` with <= 16 rows)
    or a list of graph pass names; the user's Triton launches are never changed.
    ``extra_examples`` (a list of input tuples like ``example_inputs``) trace the branches a
    forward takes on tensor VALUES for other inputs: the compiled model serves every branch an
    example took (ONNX ``If`` on the run-time condition) and refuses, naming the line, a call
    taking a branch none took (:mod:`kernel_lens.frontends.value_branches`).
    ``stop_after`` names a pass
    (the pipeline stops there) or a stage of the targets (``kernel_lens targets`` lists them:
    ``"emit"`` writes the C++ sources and builds nothing).
    """
    targets = list(targets)
    if output_dir is not None:
        check_folder(output_dir)  # a file there is refused before any work starts
    pm = pass_manager or default_pipeline()
    stage = _target_stage(stop_after, targets, pm)
    if stage is not None:
        if output_dir is None:
            raise KernelLensError(f"stop_after={stage!r} stops a target's build: give output_dir, "
                                  f"where its outputs are written")
        stop_after = None  # every pass runs
    dump_after = list(dump_after)
    pm.check_names([*dump_after, *([stop_after] if stop_after else [])])  # a typo costs no capture
    pm.check_options(dict(options or {}))
    graph_passes = resolve_graph_passes(optimize)  # a bad level or name costs no capture
    for name in targets:  # missing headers or compilers: said now, not after the capture
        get_target(name).preflight(stage)
    ir, outputs = lift_with_outputs(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                                    arch=arch, roles=roles, autotune=autotune, dynamic=dynamic,
                                    translatable=supported, extra_examples=extra_examples,
                                    own_kernels=frozenset(graph_passes) & set(FRONT_END))
    check_autotune(autotune, ir)
    ir.graph_passes = graph_passes
    ir = pm.run(ir, pass_context(options), stop_after=stop_after, dump_after=dump_after, dump=dump)
    compiled = CompiledModel(ir, outputs, list(pm.timings))
    if targets and output_dir is None:  # like torch.compile: artifacts live in the cache
        return _compile_into_cache(compiled, targets)
    if output_dir is not None:
        compiled.write(output_dir, targets, stop_after=stage)
    return compiled


def _target_stage(stop_after: str | None, targets: list[str], pm: PassManager) -> str | None:
    """``stop_after`` when it names a stage of a requested target (not a pass), else None."""
    if stop_after is None or not targets:
        return None
    chosen = [get_target(name) for name in targets]  # an unknown name: its one error, here
    passes = {p.name for p in pm.order()}
    lacking = [t for t in chosen if stop_after not in t.stages]
    if lacking and stop_after not in passes:  # the one check of a stage name (CLI and API)
        raise lacking[0].no_stage(stop_after)
    if lacking:
        return None
    if stop_after in passes:
        raise KernelLensError(f"stop_after={stop_after!r} names both a pass and a target stage; "
                              f"rename the pass")
    return stop_after
