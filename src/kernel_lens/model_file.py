"""Loading a user's model file: a Python file defining ``model`` and ``example_inputs``."""

from __future__ import annotations

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


def load_model_file(path: str | Path) -> ModelFile:
    """Import ``path`` as a module (its folder on sys.path) and read its contract."""
    path = Path(path).resolve()
    if not path.is_file():
        raise ModelFileError(f"model file {path} does not exist")
    name = path.stem
    folder = str(path.parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
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
    inputs = module.example_inputs
    if callable(inputs):
        try:
            inputs = inputs()
        except KernelLensError:
            raise
        except Exception as exc:
            raise ModelFileError(f"{path}: example_inputs() raised {type(exc).__name__}: {exc}; "
                                 f"fix the model file") from exc
    if not isinstance(inputs, (tuple, list)):
        inputs = (inputs,)
    return ModelFile(path, module.model, tuple(inputs), getattr(module, "dynamic_shapes", None),
                     getattr(module, "roles", None), getattr(module, "autotune", None))
