"""The GPU architectures kernel_lens compiles for (light: no torch or triton import)."""

from __future__ import annotations

from .errors import ArchError

# Compute capabilities Triton 3.6 and CUDA 13's ptxas compile for.
SUPPORTED_ARCHS = (75, 80, 86, 87, 89, 90, 100, 103, 110, 120, 121)


def check_arch(arch: object) -> int:
    """``arch`` if kernel_lens can compile for it, else :class:`ArchError` listing the valid ones."""
    if isinstance(arch, bool) or not isinstance(arch, int) or arch not in SUPPORTED_ARCHS:
        valid = ", ".join(f"sm_{a}" for a in SUPPORTED_ARCHS)
        raise ArchError(f"arch {arch!r} is not a GPU architecture kernel_lens can compile for; "
                        f"pass one of {valid} (e.g. --arch sm_90), or leave it out to use the "
                        f"local GPU's")
    return arch


def parse_arch(text: str) -> int:
    """'sm_90', 'sm90a', '90' -> 90; anything else is an :class:`ArchError`."""
    value = str(text).strip().lower().removeprefix("sm_").removeprefix("sm").removesuffix("a")
    if not value.isdigit():
        valid = ", ".join(f"sm_{a}" for a in SUPPORTED_ARCHS)
        raise ArchError(f"--arch {text!r} is not an architecture; pass one of {valid}")
    return check_arch(int(value))
