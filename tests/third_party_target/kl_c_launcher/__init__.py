"""A third-party kernel_lens target, written against the IR and kernel_lens's public pieces only.

It emits a shared library with a plain C entry point per launch: the caller passes device
pointers and shapes of the node inputs, pre-allocated outputs and a CUDA stream.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kernel_lens.ir import GraphIR
from kernel_lens.targets.base import Target
from kernel_lens.targets.common.emit import common_headers, render_launches, templates
from kernel_lens.toolchain.build import build_shared_library

HERE = Path(__file__).parent


class CLauncherTarget(Target):
    name = "c-launcher"
    description = "plain C launcher library (third-party example)"

    def build(self, ir: GraphIR, out_dir: Path) -> dict[str, Path]:
        sources = {
            **common_headers(),
            "kl_launches.cpp": render_launches(ir),
            "kl_c.cpp": templates(HERE).get_template("kl_c.cpp.j2").render(ir=ir),
        }
        library = build_shared_library(f"kl_{ir.name}_c", sources, include_dirs=[])
        out_dir.mkdir(parents=True, exist_ok=True)
        dest = out_dir / f"libkl_{ir.name}_c.so"
        shutil.copyfile(library, dest)
        return {"library": dest}
