"""CUDA libdevice evaluated on the CPU, for the capture through Triton's interpreter.

Kernels call CUDA libdevice through ``triton.language.extra.libdevice`` (stubs that Triton's
code generator maps to ``triton.language.extra.cuda.libdevice``), whose wrappers end in
``create_extern_elementwise(symbol, ...)``. Triton 3.6's interpreter implements none of this; the
functions below evaluate each libdevice symbol elementwise with numpy/torch, so capture can run
such kernels on a CPU-only host. Transcendental functions are evaluated in fp64 and rounded once
to the result type (GPU libdevice is within a few ulp of that; the fast_* ones further off); fma
and the add/sub/mul/div/rcp/sqrt/conversion _rn/_rz/_rd/_ru variants round exactly as named.
"""

from __future__ import annotations

import functools
import math
from fractions import Fraction
from typing import Any, Callable

import numpy as np
import torch

#: libdevice functions of Triton's CUDA backend with no CPU evaluation here (no numpy/torch
#: equivalent): capture raises a CaptureError naming them.
LIBDEVICE_NO_CPU = frozenset({"jn", "yn", "rcp64h"})


def libdevice_cpu(name: str, args: list, out: Any) -> Any:
    """libdevice function ``name`` evaluated elementwise on numpy arrays (already broadcast), as
    an array of numpy dtype ``out``. Raises LookupError when there is no CPU evaluation."""
    fn = _libdevice_table().get(name)
    if fn is None:
        raise LookupError(name)
    with np.errstate(all="ignore"):
        return np.asarray(fn(*args)).astype(out)


def _wide(x: Any) -> Any:
    return x.astype(np.float64) if x.dtype == np.float32 else x


def _exact(v: Any) -> Fraction:
    return Fraction(int(v)) if isinstance(v, (int, np.integer)) else Fraction(float(v))


def _step(r: Any, args: tuple, cmp: Callable, mode: str, addends: Callable | None = None) -> Any:
    """Round-to-nearest results ``r`` moved one ulp where the exact value lies elsewhere, giving
    mode 'rz'/'rd'/'ru'. ``cmp(r, *operands)`` is the sign of r minus the exact result (exact
    Fractions); ``addends(*operands)`` the terms of a sum (exact zero sums are -0 in 'rd')."""
    out = np.array(r, copy=True).reshape(-1)
    flat = [np.broadcast_to(a, np.shape(r)).reshape(-1) for a in args]
    inf = out.dtype.type(np.inf)
    for i, v in enumerate(out):
        vals = [a[i] for a in flat]
        if np.isnan(v) or not all(np.isfinite(x) for x in vals):
            continue  # non-finite operands give the same result in every mode
        if np.isinf(v):
            sign = 1 if v > 0 else -1  # overflowed: beyond every finite value
        else:
            try:
                sign = cmp(_exact(v), *map(_exact, vals))
            except ZeroDivisionError:
                continue
        down = mode == "rd" or (mode == "rz" and not np.signbit(v))
        if sign > 0 and down:
            out[i] = np.nextafter(v, -inf)
        elif sign < 0 and not down:
            out[i] = np.nextafter(v, inf)
        elif sign == 0 and v == 0 and mode == "rd" and addends is not None \
                and not all(t == 0 and not np.signbit(t) for t in addends(*vals)):
            out[i] = -out.dtype.type(0)
    return out.reshape(np.shape(r))


def _sign(x: Any) -> int:
    return (x > 0) - (x < 0)


def _rounded(rn: Callable, exact: Callable | None = None, cmp: Callable | None = None,
             addends: Callable | None = None) -> Callable[[str], Callable]:
    """An arithmetic family (add_rn, add_rz, ...): ``rn`` rounds to nearest; the other modes step
    from it by comparing with ``exact`` (operands -> Fraction) or ``cmp``."""
    cmp = cmp or (lambda r, *ops: _sign(r - exact(*ops)))
    return lambda mode: rn if mode == "rn" else \
        (lambda *a: _step(rn(*a), a, cmp, mode, addends))


def _fma_rn(a: Any, b: Any, c: Any) -> Any:
    """fma rounded once: fp32 through fp64 round-to-odd (a*b is exact in fp64), fp64 exactly."""
    if a.dtype == np.float64:
        def one(x: float, y: float, z: float) -> float:
            if not all(map(np.isfinite, (x, y, z))):
                return x * y + z
            exact = _exact(x) * _exact(y) + _exact(z)
            try:
                return float(exact)  # correctly rounded
            except OverflowError:
                return float(np.copysign(np.inf, exact))
        return np.vectorize(one, otypes=[np.float64])(a, b, c)
    p, z = a.astype(np.float64) * b.astype(np.float64), c.astype(np.float64)
    s = p + z
    bb = s - p
    err = (p - (s - bb)) + (z - bb)  # s + err == p + z exactly (TwoSum)
    odd = s.view(np.uint64) & 1
    toward = np.where(err > 0, np.inf, -np.inf)
    # round to odd: of the two fp64 neighbours of an inexact p + z, the one with an odd last bit;
    # rounding that to fp32 (24 <= 53 - 2 bits) is then the exact round-to-nearest
    s = np.where((err != 0) & (odd == 0) & np.isfinite(s), np.nextafter(s, toward), s)
    return s.astype(np.float32)


def _round_half_away(x: Any) -> Any:
    t = np.trunc(x)
    return np.where(np.abs(x - t) >= 0.5, t + np.sign(x), t)


def _to_int(mode: str, bits: int, signed: bool) -> Callable:
    """float -> int with rounding ``mode``, saturating like PTX cvt (NaN -> 0)."""
    dt = np.dtype(f"{'int' if signed else 'uint'}{bits}")
    info = np.iinfo(dt)
    lo, hi = float(info.min), 2.0 ** (bits - 1 if signed else bits)
    rounding = {"rn": np.rint, "rz": np.trunc, "rd": np.floor, "ru": np.ceil,
                "away": _round_half_away}[mode]

    def run(x: Any) -> Any:
        v = rounding(_wide(x))
        inside = np.where((v >= lo) & (v < hi), v, 0).astype(dt)
        return np.where(v >= hi, dt.type(info.max), np.where(v < lo, dt.type(info.min), inside))
    return run


def _bit_length(u: Any) -> Any:
    u = u.astype(np.uint64)
    n = np.zeros(u.shape, np.int64)
    for shift in (32, 16, 8, 4, 2, 1):
        big = u >= np.uint64(1 << shift)
        n += big * shift
        u = np.where(big, u >> np.uint64(shift), u)
    return n + (u > 0)


def _unsigned(x: Any) -> Any:
    return x.view(np.dtype(f"uint{x.dtype.itemsize * 8}"))


def _popc(x: Any) -> Any:
    u = np.ascontiguousarray(_unsigned(x)).astype(_unsigned(x).dtype.newbyteorder("<"))
    return np.unpackbits(u.view(np.uint8).reshape(*u.shape, -1), axis=-1).sum(-1)


def _brev(x: Any) -> Any:
    table = np.array([int(f"{i:08b}"[::-1], 2) for i in range(256)], np.uint8)
    u = np.ascontiguousarray(_unsigned(x)).astype(_unsigned(x).dtype.newbyteorder("<"))
    b = table[u.view(np.uint8).reshape(*u.shape, -1)[..., ::-1]]
    return np.ascontiguousarray(b).view(u.dtype).reshape(u.shape)


def _byte_perm(x: Any, y: Any, s: Any) -> Any:
    v = (_unsigned(y).astype(np.uint64) << np.uint64(32)) | _unsigned(x).astype(np.uint64)
    s = _unsigned(s).astype(np.uint64)
    out = np.zeros(v.shape, np.uint64)
    for n in range(4):
        sel = (s >> np.uint64(4 * n)) & np.uint64(7)
        out |= ((v >> (sel * np.uint64(8))) & np.uint64(0xFF)) << np.uint64(8 * n)
    return out.astype(np.uint32)


def _mulhi(a: Any, b: Any) -> Any:
    if a.dtype.itemsize == 4:
        wide = np.int64 if a.dtype.kind == "i" else np.uint64
        return (a.astype(wide) * b.astype(wide)) >> wide(32)
    hi = np.frompyfunc(lambda x, y: (int(x) * int(y)) >> 64, 2, 1)(a, b)
    return hi.astype(a.dtype)


def _mul24(a: Any, b: Any) -> Any:
    def low24(x: Any) -> Any:
        x = x.astype(np.int64) & 0xFFFFFF
        return np.where(x >= 1 << 23, x - (1 << 24), x) if a.dtype.kind == "i" else x
    return (low24(a) * low24(b)) & 0xFFFFFFFF


def _py(f: Callable, on_error: Callable[..., float]) -> Callable:
    """An elementwise Python ``math`` function; ``on_error(*args)`` where it raises."""
    def one(*v: float) -> float:
        try:
            return f(*v)
        except (ValueError, OverflowError):
            return on_error(*v)
    return lambda *a: np.vectorize(one, otypes=[np.float64])(*map(_wide, a))


def _torch(f: Callable) -> Callable:
    return lambda *a: f(*(torch.tensor(np.asarray(_wide(x))) for x in a)).numpy()


def _gamma_error(x: float) -> float:
    if x == 0:
        return math.copysign(math.inf, x)
    return math.inf if x > 0 else math.nan


@functools.lru_cache(maxsize=None)
def _libdevice_table() -> dict[str, Callable]:
    def wide(f: Callable) -> Callable:  # evaluated in fp64, rounded once to the result type
        return lambda *a: f(*map(_wide, a))

    def sinpi(x: Any) -> Any:
        r = x - 2 * np.rint(x / 2)  # exact reduction to [-1, 1]
        return np.where((r == 0) | (np.abs(r) == 1), np.copysign(0.0, x), np.sin(np.pi * r))

    def cospi(x: Any) -> Any:
        r = np.abs(x - 2 * np.rint(x / 2))
        return np.where(r == 0.5, 0.0, np.cos(np.pi * r))

    def logb(x: Any) -> Any:
        e = np.frexp(x)[1].astype(np.float64) - 1
        return np.where(x == 0, -np.inf, np.where(np.isfinite(x), e, np.abs(x)))

    def ilogb(x: Any) -> Any:
        e = np.frexp(x)[1].astype(np.int64) - 1
        return np.where(np.isinf(x), 2**31 - 1,
                        np.where((x == 0) | np.isnan(x), -2**31, e))

    def hiloint(hi: Any, lo: Any) -> Any:
        bits = (_unsigned(hi).astype(np.uint64) << np.uint64(32)) | _unsigned(lo).astype(np.uint64)
        return bits.view(np.float64)

    ndtri = _torch(torch.special.ndtri)
    t: dict[str, Callable] = {
        # transcendental and other real functions
        **{name: wide(f) for name, f in {
            "acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "asinh": np.arcsinh,
            "atan": np.arctan, "atanh": np.arctanh, "cbrt": np.cbrt, "cos": np.cos, "cosh": np.cosh,
            "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "expm1": np.expm1,
            "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "sin": np.sin,
            "sinh": np.sinh, "tan": np.tan, "tanh": np.tanh, "rsqrt": lambda x: 1 / np.sqrt(x),
            "rsqrt_rn": lambda x: 1 / np.sqrt(x), "rcbrt": lambda x: 1 / np.cbrt(x),
            "sinpi": sinpi, "cospi": cospi, "atan2": np.arctan2, "hypot": np.hypot,
            "rhypot": lambda x, y: 1 / np.hypot(x, y), "pow": np.power,
            "norm3d": lambda a, b, c: np.hypot(np.hypot(a, b), c),
            "rnorm3d": lambda a, b, c: 1 / np.hypot(np.hypot(a, b), c),
            "norm4d": lambda a, b, c, d: np.hypot(np.hypot(a, b), np.hypot(c, d)),
            "rnorm4d": lambda a, b, c, d: 1 / np.hypot(np.hypot(a, b), np.hypot(c, d)),
            "fdim": lambda x, y: np.where(np.isnan(x) | np.isnan(y), np.nan,
                                          np.where(x > y, x - y, 0.0)),
            "logb": logb,
        }.items()},
        "erf": _torch(torch.special.erf), "erfc": _torch(torch.special.erfc),
        "erfcx": _torch(torch.special.erfcx), "erfinv": _torch(torch.special.erfinv),
        "erfcinv": lambda y: -ndtri(y / 2) / math.sqrt(2), "normcdf": _torch(torch.special.ndtr),
        "normcdfinv": ndtri, "lgamma": _torch(torch.lgamma),
        "tgamma": _py(math.gamma, _gamma_error),
        "j0": _torch(torch.special.bessel_j0), "j1": _torch(torch.special.bessel_j1),
        "y0": _torch(torch.special.bessel_y0), "y1": _torch(torch.special.bessel_y1),
        "cyl_bessel_i0": _torch(torch.special.i0), "cyl_bessel_i1": _torch(torch.special.i1),
        "remainder": _py(math.remainder, lambda x, y: math.nan),
        "fmod": np.fmod, "copysign": np.copysign, "nextafter": np.nextafter,
        "ldexp": np.ldexp, "scalbn": np.ldexp, "ilogb": ilogb,
        # rounding, classification, magnitude
        "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint,
        "nearbyint": np.rint, "round": _round_half_away,
        "llrint": _to_int("rn", 64, True), "llround": _to_int("away", 64, True),
        "isnan": np.isnan, "isinf": np.isinf, "finitef": np.isfinite, "isfinited": np.isfinite,
        "signbit": np.signbit, "abs": np.abs,
        "saturatef": lambda x: np.where(np.isnan(x), 0.0, np.clip(x, 0.0, 1.0)),
        "sqrt": np.sqrt, "fma": _fma_rn,
        # integer intrinsics
        "clz": lambda x: x.dtype.itemsize * 8 - _bit_length(_unsigned(x)),
        "popc": _popc, "brev": _brev, "byte_perm": _byte_perm, "mulhi": _mulhi, "mul24": _mul24,
        "ffs": lambda x: _bit_length(_unsigned(x) & (~_unsigned(x) + _unsigned(x).dtype.type(1))),
        "sad": lambda x, y, z: np.abs(x.astype(np.int64) - y.astype(np.int64)) + z.astype(np.int64),
        "hadd": lambda x, y: (x.astype(np.int64) + y.astype(np.int64)) >> 1,
        "rhadd": lambda x, y: (x.astype(np.int64) + y.astype(np.int64) + 1) >> 1,
        # bit reinterpretation
        "float_as_int": lambda x: x.view(np.int32), "float_as_uint": lambda x: x.view(np.uint32),
        "int_as_float": lambda x: x.view(np.float32), "uint_as_float": lambda x: x.view(np.float32),
        "double_as_longlong": lambda x: x.view(np.int64),
        "longlong_as_double": lambda x: x.view(np.float64),
        "double2hiint": lambda x: (x.view(np.int64) >> 32).astype(np.int32),
        "double2loint": lambda x: (x.view(np.uint64) & np.uint64(0xFFFFFFFF)).astype(np.uint32),
        "hiloint2double": hiloint,
        # fast approximations (the GPU's are a few ulp off these)
        "fast_sinf": wide(np.sin), "fast_cosf": wide(np.cos), "fast_tanf": wide(np.tan),
        "fast_expf": wide(np.exp), "fast_exp10f": wide(lambda x: np.power(10.0, x)),
        "fast_logf": wide(np.log), "fast_log2f": wide(np.log2), "fast_log10f": wide(np.log10),
        "fast_powf": wide(np.power), "fast_dividef": wide(np.divide),
    }
    additive = {"add": lambda x, y: (x, y), "sub": lambda x, y: (x, -y),
                "fma": lambda x, y, z: (x * y, z)}
    families = {
        "add": _rounded(np.add, exact=lambda x, y: x + y, addends=additive["add"]),
        "sub": _rounded(np.subtract, exact=lambda x, y: x - y, addends=additive["sub"]),
        "mul": _rounded(np.multiply, exact=lambda x, y: x * y),
        "div": _rounded(np.divide, exact=lambda x, y: x / y),
        "rcp": _rounded(lambda x: 1 / x, exact=lambda x: 1 / x),
        "sqrt": _rounded(np.sqrt, cmp=lambda r, x: _sign(r * r - x)),
        "fma": _rounded(_fma_rn, exact=lambda x, y, z: x * y + z, addends=additive["fma"]),
    }
    converts = {"float": np.float32, "double": np.float64}
    for mode in ("rn", "rz", "rd", "ru"):
        for name, family in families.items():
            t[f"{name}_{mode}"] = family(mode)
        for src in ("int", "uint", "ll", "ull", "double"):
            for dst, dt in converts.items():
                if src != dst:
                    t[f"{src}2{dst}_{mode}"] = _rounded(
                        lambda x, dt=dt: x.astype(dt), exact=lambda x: x)(mode)
        for src in ("float", "double"):
            for dst, (bits, signed) in {"int": (32, True), "uint": (32, False), "ll": (64, True),
                                        "ull": (64, False)}.items():
                t[f"{src}2{dst}_{mode}"] = _to_int(mode, bits, signed)
    return t
