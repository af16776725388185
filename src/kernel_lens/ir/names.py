"""Names in the IR: what may reach a file name, a C++ identifier or string, or an ONNX name.

Every name in an IR document is validated against :data:`IDENTIFIER_PATTERN` (ASCII letters,
digits and underscores, not starting with a digit), so names copied into generated C++,
file names and ONNX graphs can neither inject code nor escape a folder. Free text a user
chose (a model's class name) is kept only as display text and never reaches those places.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field

IDENTIFIER_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_NAME = 128
_IDENTIFIER = re.compile(IDENTIFIER_PATTERN)

Identifier = Annotated[str, Field(pattern=IDENTIFIER_PATTERN, min_length=1, max_length=MAX_NAME)]
"""An ASCII identifier, safe as a C++ identifier, a file-name stem and an ONNX name."""

# C types a kernel ABI parameter may have (they are printed into generated C++ as they are).
C_TYPES = ("void*", "bool", "int8_t", "int16_t", "int32_t", "int64_t", "uint8_t", "uint16_t",
           "uint32_t", "uint64_t", "float", "double", "CUtensorMap")


def is_identifier(text: object) -> bool:
    return isinstance(text, str) and len(text) <= MAX_NAME and _IDENTIFIER.match(text) is not None


def safe_identifier(text: str, default: str = "model") -> str:
    """``text`` turned into an :data:`Identifier` (for the graph name of a user's model)."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", str(text)).strip("_")
    out = re.sub(r"_+", "_", out)
    if not out:
        out = default
    if out[0].isdigit():
        out = f"{default}_{out}"
    return out[:MAX_NAME]
