"""Targets: the plug-in point for back-ends.

A target turns the final GraphIR into deployable artifacts. Targets are discovered the way
Triton discovers its backends: from installed distributions, here through the entry-point
group ``kernel_lens.targets`` (``name = "package.module:TargetClass"``). kernel_lens's own
``ort`` target registers exactly like a third party's; :func:`register_target` adds one
in-process (notebooks, tests).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Callable, ClassVar, Protocol, Sequence

from ..errors import KernelLensError
from .. import progress
from ..fileio import atomic_write, inside, subfolder
from ..ir import GraphIR

GROUP = "kernel_lens.targets"


class Runner(Protocol):
    """What a target's runner does: run the compiled model on framework tensors."""

    def run(self, *tensors: Any, out: Sequence[Any] | None = None) -> Any: ...


class Target(ABC):
    """A back-end: reads only the IR, writes artifacts into a folder, and may run them.

    ``stages`` names the steps :meth:`build` goes through, in order (listed by
    ``kernel_lens targets``); :meth:`build_until` stops after one of them. A target that does not
    split its work has the one stage ``build``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    stages: ClassVar[tuple[str, ...]] = ("build",)
    # other names ``run(backend=...)`` accepts for this target (e.g. "tensorrt" for trt-v3)
    aliases: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def build(self, ir: GraphIR, out_dir: Path) -> dict[str, Path]:
        """Write this target's artifacts for ``ir`` into ``out_dir``; return them by kind."""

    def requirements(self, stop_after: str | None = None) -> list[tuple[str, Callable[[], object]]]:
        """What building up to ``stop_after`` needs from the environment: (what, probe) pairs,
        each probe raising the error that names what is missing and how to get it. The default
        needs nothing. ``kernel_lens doctor`` runs them all; a compile runs :meth:`preflight`."""
        return []

    def preflight(self, stop_after: str | None = None) -> None:
        """Run :meth:`requirements`' probes before any work: the first missing one raises."""
        for _, probe in self.requirements(stop_after):
            probe()

    def build_until(self, ir: GraphIR, out_dir: Path, stop_after: str | None = None) -> dict[str, Path]:
        """:meth:`build`, or only its stages up to ``stop_after`` (their outputs written)."""
        if stop_after is None or stop_after == self.stages[-1]:
            return self.build(ir, out_dir)
        raise self.no_stage(stop_after)

    def no_stage(self, stage: str) -> KernelLensError:
        """The error for a stage this target does not have."""
        return KernelLensError(f"target {self.name!r} has no stage {stage!r}; its stages: "
                               f"{', '.join(self.stages)}")

    def runner_inputs(self, artifacts: dict[str, Path], options: dict[str, Any], takes: str,
                      kinds: tuple[str, ...] = ("onnx", "library")) -> list[Path]:
        """The artifacts a runner opens, by kind; a clear error for options it does not take
        (``takes`` names those it does) or artifacts that are missing."""
        if options:
            raise KernelLensError(f"{self.name} runner: unknown options {sorted(options)}; it takes {takes}")
        missing = sorted(set(kinds) - set(artifacts))
        if missing:
            raise KernelLensError(f"{self.name} runner: artifacts {missing} missing; recompile with "
                                  f"targets=[{self.name!r}]")
        return [artifacts[k] for k in kinds]

    def runner(self, ir: GraphIR, artifacts: dict[str, Path], **options: Any) -> Runner:
        """A runner over the artifacts :meth:`build` returned (by kind). Targets that only
        produce files for other tools keep this default."""
        raise KernelLensError(f"target {self.name!r} builds artifacts but has no runner in "
                              f"kernel_lens; use them with the tool they are for")


@dataclass
class BuildState:
    """What a :class:`StagedTarget`'s stages hand on to the next. A target subclasses it with
    typed fields of its own (its ``state_type``); ``final`` is True for the last stage that runs,
    which then writes what it would otherwise only hand on (``emit``: its C++ sources)."""

    final: bool = False


#: A stage's work: (target, ir, out_dir, state) -> the artifacts it wrote, by kind.
StageFn = Callable[[Any, GraphIR, Path, Any], dict[str, Path]]


@dataclass(frozen=True)
class Stage:
    """One row of a target's stage table: its name and the function that runs it."""

    name: str
    run: StageFn


class StagedTarget(Target):
    """A target built in named stages, run in the order of its ``stage_table`` on one typed
    ``state`` (an instance of ``state_type``) that carries what earlier stages produced; each
    returns the artifacts it wrote, by kind. With ``stop_after``, the stages after it do not
    run and the stopping stage sees ``state.final``.

    ``stage_table`` is the visible, ordered list of :class:`Stage` rows; ``stages`` (their
    names) follows from it. A subclass that names ``stages`` and defines ``stage_<name>``
    methods instead gets the table made from those, checked when the class is defined."""

    stages: ClassVar[tuple[str, ...]] = ("lower", "emit", "build")
    stage_table: ClassVar[tuple[Stage, ...]] = ()
    state_type: ClassVar[type[BuildState]] = BuildState

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "stage_table" not in vars(cls):  # stages named, their methods by the naming rule
            rows = []
            for name in cls.stages:
                fn = getattr(cls, f"stage_{name}", None)
                if not callable(fn):
                    raise TypeError(f"{cls.__name__} names stage {name!r} but defines no "
                                    f"stage_{name}(self, ir, out_dir, state) method")
                rows.append(Stage(name, fn))
            cls.stage_table = tuple(rows)
        cls.stages = tuple(stage.name for stage in cls.stage_table)

    def build(self, ir: GraphIR, out_dir: Path) -> dict[str, Path]:
        return self.build_until(ir, out_dir, None)

    def build_until(self, ir: GraphIR, out_dir: Path, stop_after: str | None = None) -> dict[str, Path]:
        stop = stop_after or self.stages[-1]
        if stop not in self.stages:
            raise self.no_stage(stop)
        artifacts: dict[str, Path] = {}
        state = self.state_type()
        for stage in self.stage_table:
            state.final = stage.name == stop
            with progress.stage(f"{self.name}: {stage.name}"):
                artifacts.update(stage.run(self, ir, out_dir, state))
            if stage.name == stop:
                break
        return artifacts

    @staticmethod
    def write_sources(out_dir: Path, folder: str, sources: dict[str, str]) -> dict[str, Path]:
        """Write generated sources into ``out_dir/folder`` (an ``emit`` stage that is the last
        one run); the artifacts ``source.<file>``."""
        src = subfolder(out_dir, folder)  # a real folder: a link planted there is refused
        return {f"source.{name}": atomic_write(inside(src, name), text) for name, text in sources.items()}


_registered: dict[str, type[Target]] = {}


def register_target(cls: type[Target]) -> type[Target]:
    """Register a Target subclass in this process (usable as a class decorator)."""
    if not (isinstance(cls, type) and issubclass(cls, Target) and cls.name):
        raise KernelLensError(f"{cls!r} is not a Target subclass with a name")
    _registered[cls.name] = cls
    return cls


def _entry_points() -> dict[str, object]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def available_targets() -> dict[str, str]:
    """Installed targets: name -> where it comes from."""
    found = {name: ep.value for name, ep in _entry_points().items()}
    found.update({name: f"{cls.__module__}:{cls.__qualname__} (registered)"
                  for name, cls in _registered.items()})
    return dict(sorted(found.items()))


def get_target(name: str) -> Target:
    if name in _registered:
        return _registered[name]()
    eps = _entry_points()
    if name not in eps:
        raise KernelLensError(
            f"unknown target {name!r}; installed targets: {', '.join(available_targets()) or 'none'}. "
            f"A third-party target registers under the entry-point group {GROUP!r}")
    cls = eps[name].load()
    if not (isinstance(cls, type) and issubclass(cls, Target)):
        raise KernelLensError(f"entry point {name} = {eps[name].value} is not a kernel_lens Target")
    return cls()
