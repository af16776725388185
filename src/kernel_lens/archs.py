"""The GPU architectures kernel_lens compiles for (light: no torch or triton import).

One compile may build for several architectures (``arch=[80, 90]``, ``--arch sm_80,sm_90``):
every kernel then has binaries for each, and the launch code picks the device's at run time by
:func:`pick_arch`'s rule (the same rule the C++ runtime's ``kl::pick_arch`` implements)."""

from __future__ import annotations

from collections.abc import Iterable

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


def check_archs(arch: object) -> tuple[int, ...]:
    """One arch (``90``) or several (``[80, 90]``) as a tuple without repeats, in the order
    given (the first is the one the capture runs for); anything else is an :class:`ArchError`."""
    if isinstance(arch, (str, bytes)) or not isinstance(arch, Iterable):
        return (check_arch(arch),)
    archs = tuple(dict.fromkeys(check_arch(a) for a in arch))
    if not archs:
        raise ArchError("arch=[] names no architecture; pass one or more (e.g. arch=[80, 90])")
    return archs


def parse_arch(text: str) -> int:
    """'sm_90', 'sm90a', '90' -> 90; anything else is an :class:`ArchError`."""
    value = str(text).strip().lower().removeprefix("sm_").removeprefix("sm").removesuffix("a")
    if not value.isdigit():
        valid = ", ".join(f"sm_{a}" for a in SUPPORTED_ARCHS)
        raise ArchError(f"--arch {text!r} is not an architecture; pass one of {valid}")
    return check_arch(int(value))


def parse_archs(text: str) -> tuple[int, ...]:
    """'sm_80,sm_90' -> (80, 90): one or more architectures, comma-separated."""
    parts = [p for p in str(text).split(",") if p.strip()]
    if not parts:
        raise ArchError(f"--arch {text!r} names no architecture; pass e.g. --arch sm_90 or "
                        f"--arch sm_80,sm_90")
    return check_archs(parse_arch(p) for p in parts)


def names(archs: Iterable[int]) -> str:
    """(80, 90) -> 'sm_80, sm_90'."""
    return ", ".join(f"sm_{a}" for a in archs)


def pick_arch(built: Iterable[tuple[int, bool]], cc: int) -> int | None:
    """Which of the built archs a device of compute capability ``cc`` runs: the exact one (its
    cubin), else the newest whose PTX the driver can compile for it (an arch below ``cc``
    whose PTX does not target an ``a`` variant); None when there is none. ``built`` holds
    (arch, arch_specific) pairs."""
    best = None
    for arch, specific in built:
        if arch == cc:
            return cc
        if arch < cc and not specific and (best is None or arch > best):
            best = arch
    return best


def check_device(built: Iterable[tuple[int, bool]], cc: int, what: str) -> int:
    """:func:`pick_arch`, or :class:`ArchError` in one line naming the archs and the fix."""
    built = list(built)
    picked = pick_arch(built, cc)
    if picked is None:
        have = sorted({a for a, _ in built})
        raise ArchError(f"{what} was built for {names(have)}; this GPU is sm_{cc}, which none of "
                        f"them runs on: compile again with --arch sm_{cc} (or add it, e.g. "
                        f"--arch {','.join(f'sm_{a}' for a in have)},sm_{cc})")
    return picked
