"""Loading a user's model file: a Python file defining ``model`` and ``example_inputs``."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import KernelLensError, ModelFileError


@dataclass
class ModelFile:
    path: Path
    model: Any
    example_inputs: tuple
    dynamic_shapes: Any = None
    roles: dict | None = None
    autotune: dict | None = None
    extra_examples: list | None = None


def _module_name(path: Path) -> str:
    """The name to import ``path`` under: its stem, unless that names another module.

    A model file called like a standard-library or installed module (``json.py``, ``numpy.py``),
    or like one already imported, would replace that module in ``sys.modules`` for the whole
    process (torch and kernel_lens itself import ``json``); such a file is imported under a
    private name instead, so it neither shadows nor clashes.
    """
    stem = path.stem
    loaded = sys.modules.get(stem)
    if loaded is not None:
        clash = getattr(loaded, "__file__", None) != str(path)  # not this same file again
    elif stem in sys.stdlib_module_names:
        clash = True
    elif stem.isidentifier():
        try:
            found = importlib.util.find_spec(stem)  # a top-level name: imports nothing
        except (ImportError, ValueError):
            found = None
        clash = found is not None and found.origin != str(path)
    else:
        clash = False  # no `import` statement can name it
    if not clash:
        return stem
    safe = "".join(c if c.isalnum() or c == "_" else "_" for c in stem)
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:12]
    return f"_kernel_lens_model_{safe}_{digest}"


def _value(module: Any, name: str, path: Path) -> Any:
    """The module's ``name`` (None if absent), called when it is a function; an exception it
    raises is a ModelFileError naming it."""
    value = getattr(module, name, None)
    if not callable(value):
        return value
    try:
        return value()
    except KernelLensError:
        raise
    except Exception as exc:
        raise ModelFileError(f"{path}: {name}() raised {type(exc).__name__}: {exc}; "
                             f"fix the model file") from exc


def load_model_file(path: str | Path) -> ModelFile:
    """Import ``path`` as a module and read its contract.

    Its folder goes at the end of ``sys.path`` (sibling imports work; a sibling file cannot
    shadow a standard-library or installed module), and a file named like another module is
    imported under a private name (see :func:`_module_name`).
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist")
    name = _module_name(path)
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.append(folder)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelFileError(f"{path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except KernelLensError:
        raise
    except Exception as exc:
        raise ModelFileError(f"importing {path} failed: {type(exc).__name__}: {exc}") from exc
    missing = [a for a in ("model", "example_inputs") if not hasattr(module, a)]
    if missing:
        raise ModelFileError(f"{path} must define {' and '.join(missing)} (a module or callable "
                              f"and a tuple of example tensors); see examples/")
    inputs = _value(module, "example_inputs", path)
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    extra = _value(module, "extra_examples", path)
    return ModelFile(path, module.model, tuple(inputs), getattr(module, "dynamic_shapes", None),
                     getattr(module, "roles", None), getattr(module, "autotune", None), extra)
