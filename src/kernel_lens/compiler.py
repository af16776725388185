"""The compile driver: front-ends, then the pass pipeline, then (later) targets."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from .frontends.aot import compile_binary
from .frontends.lift import lift_with_outputs
from .ir import GraphIR
from .passes import PassContext, PassManager, PassTiming, default_pipeline
from .summary import summarize

log = logging.getLogger(__name__)


@dataclass
class CompiledModel:
    """The result of :func:`compile`: the final IR and where artifacts were written."""

    ir: GraphIR
    example_outputs: Any = None  # what the eager forward returned during capture
    timings: list[PassTiming] = field(default_factory=list)
    artifacts: dict[str, Path] = field(default_factory=dict)

    def summary(self) -> str:
        return summarize(self.ir, self.timings)

    def write(self, directory: str | Path) -> dict[str, Path]:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stem = self.ir.name
        ir_path = self.ir.save(directory / f"{stem}.ir.json")
        summary_path = directory / f"{stem}.summary.txt"
        summary_path.write_text(self.summary())
        self.artifacts.update({"ir": ir_path, "summary": summary_path})
        return dict(self.artifacts)


def pass_context(options: dict | None = None) -> PassContext:
    return PassContext(options=dict(options or {}), compile_binary=compile_binary)


def compile(model: Callable, example_inputs: Iterable[Any], *, dynamic_shapes: Any = None,
            arch: int | None = None, roles: dict[str, dict[str, str]] | None = None,
            autotune: dict[str, dict] | None = None, pass_manager: PassManager | None = None,
            options: dict | None = None, output_dir: str | Path | None = None,
            stop_after: str | None = None, dump_after: Iterable[str] = (),
            dump: Callable[[str, GraphIR], None] | None = None) -> CompiledModel:
    """Lift ``model`` into GraphIR and run the pass pipeline over it.

    ``dynamic_shapes`` follows torch.export; ``roles`` overrides role inference per kernel
    (``{"kernel": {"param": "input"}}``); ``autotune`` picks a config per autotuned kernel
    (``{"kernel": {"BLOCK": 128}}``); ``options`` configure passes (e.g. ``ptx_version``).
    """
    ir, outputs = lift_with_outputs(model, tuple(example_inputs), dynamic_shapes=dynamic_shapes,
                                    arch=arch, roles=roles, autotune=autotune)
    pm = pass_manager or default_pipeline()
    ir = pm.run(ir, pass_context(options), stop_after=stop_after, dump_after=dump_after, dump=dump)
    compiled = CompiledModel(ir, outputs, list(pm.timings))
    if output_dir is not None:
        compiled.write(output_dir)
    return compiled
