"""Two different kernels that share the name ``scale_kernel``, from two modules.

Covers case 5: ``_ns_a.scale_kernel`` (scalar scale, 1-D grid) and ``_ns_b.scale_kernel``
(per-column scale, 2-D grid) have the same ``__name__`` but different bodies and signatures;
a capture must tell them apart (e.g. by module and qualified name). ``expected_roles`` is keyed
by ``"<module>.<name>"`` here, since the bare name is ambiguous.
"""

import importlib
import importlib.util
import sys
from pathlib import Path

import torch
import triton


def _import_sibling(name):
    """Import ``<name>.py`` from this directory, whether this file was imported as part of a
    package or loaded by path."""
    if __package__:
        return importlib.import_module(f".{name}", __package__)
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


_ns_a = _import_sibling("_ns_a")
_ns_b = _import_sibling("_ns_b")


class Model(torch.nn.Module):
    alpha = 3.0

    def forward(self, x, col_scale):
        n_rows, n_cols = x.shape
        n_elements = x.numel()
        scaled = torch.empty_like(x)
        grid = lambda meta: (triton.cdiv(n_elements, meta["BLOCK_SIZE"]),)
        _ns_a.scale_kernel[grid](x, scaled, self.alpha, n_elements, BLOCK_SIZE=128)

        out = torch.empty_like(scaled)
        grid = lambda meta: (triton.cdiv(n_rows, meta["BLOCK_M"]), triton.cdiv(n_cols, meta["BLOCK_N"]))
        _ns_b.scale_kernel[grid](scaled, col_scale, out, n_rows, n_cols, BLOCK_M=8, BLOCK_N=32)
        return out


def _make_inputs(rows=20, cols=50):
    g = torch.Generator().manual_seed(0)
    return torch.randn(rows, cols, generator=g), torch.randn(cols, generator=g)


def reference(x, col_scale):
    return (x * Model.alpha) * col_scale


model = Model()
example_inputs = _make_inputs()
_rows = torch.export.Dim("rows", min=2, max=4096)
_cols = torch.export.Dim("cols", min=2, max=4096)
dynamic_shapes = {"x": {0: _rows, 1: _cols}, "col_scale": {0: _cols}}
expected_roles = {
    f"{_ns_a.__name__}.scale_kernel": {"x_ptr": "input", "out_ptr": "output"},
    f"{_ns_b.__name__}.scale_kernel": {"x_ptr": "input", "scale_ptr": "input", "out_ptr": "output"},
}
tolerance = (0.0, 0.0)
