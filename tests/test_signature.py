"""The call signature every runner shares (runtime/signature.py), on the CPU: the symbol values
read from a call's inputs and the output shapes agree with the IR evaluated independently
(sympy) and with the model's own outputs at sizes other than the captured ones; every wrong
input is refused with the culprit named."""

from __future__ import annotations

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import InputError
from kernel_lens.ir.symbolic import evaluate, parse
from kernel_lens.runtime.signature import CallSignature

from conftest import CORPUS, flatten, load_module

MODELS = ["vector_add", "two_kernels", "strided_input", "rmsnorm", "swiglu", "rope"]
_IRS: dict[str, tuple] = {}


def _lifted(stem: str):
    if stem not in _IRS:
        module = load_module(CORPUS / f"{stem}.py")
        ir = kl.lift(module.model, tuple(t.clone() for t in module.example_inputs),
                     dynamic_shapes=module.dynamic_shapes, arch=90,
                     roles=getattr(module, "roles", None))
        _IRS[stem] = (module, ir)
    return _IRS[stem]


def _inputs_at(ir, module, values: dict[str, int]) -> list[torch.Tensor]:
    """Inputs whose shapes are the IR's input shapes at ``values`` (sympy, not the runtime)."""
    g = torch.Generator().manual_seed(sum(values.values()))
    out = []
    for name, example in zip(ir.inputs, module.example_inputs):
        shape = [evaluate(parse(s), values) for s in ir.values[name].shape]
        if example.is_floating_point():
            out.append(torch.randn(shape, generator=g, dtype=example.dtype))
        else:
            out.append(torch.randint(1, 4, shape, generator=g, dtype=example.dtype))
    return out


@pytest.mark.parametrize("stem", MODELS)
def test_symbols_and_output_shapes_follow_the_model_at_other_sizes(stem):
    module, ir = _lifted(stem)
    sig = CallSignature(ir, device_type="cpu")
    example = {s: info.example for s, info in ir.symbols.items()}
    assert sig.symbol_values(module.example_inputs) == list(example.values())
    moved = {s: min(v + 3 + i, ir.symbols[s].max or v + 3 + i) for i, (s, v) in enumerate(example.items())}
    assert ir.symbols and moved != example
    for values in (example, moved):
        inputs = _inputs_at(ir, module, values)
        assert sig.symbol_values(inputs) == list(values.values())
        shapes = sig.output_shapes(list(values.values()))
        assert shapes == [tuple(evaluate(parse(s), values) for s in ir.values[o].shape) for o in ir.outputs]
        assert shapes == [tuple(t.shape) for t in flatten(module.reference(*inputs))]


def test_scaled_and_offset_symbols_are_read_back_and_checked():
    # a dim declared as 2*n + 1: n is read as (size - 1) / 2 and must be a whole number in range
    _, base = _lifted("vector_add")
    ir = base.model_copy(deep=True)
    (sym,) = ir.symbols
    ir.symbols[sym].scale, ir.symbols[sym].offset = 2, 1
    for name in ir.inputs:
        ir.values[name].shape = [f"2*{sym} + 1"]
    sig = CallSignature(ir, device_type="cpu")
    assert sig.symbol_values([torch.zeros(41), torch.zeros(41)]) == [20]
    with pytest.raises(InputError, match=rf"dim 0 = 40: dynamic dim {sym} must be in .* with size 2\*{sym}\+1"):
        sig.symbol_values([torch.zeros(40), torch.zeros(40)])
    with pytest.raises(InputError, match=rf"'y' dim 0 is 43, expected 2\*{sym} \+ 1 = 41"):
        sig.symbol_values([torch.zeros(41), torch.zeros(43)])


def test_range_ends_are_inclusive_and_beyond_them_refused():
    module, ir = _lifted("vector_add")
    sig = CallSignature(ir, device_type="cpu")
    (sym, info), = ir.symbols.items()
    for n in (info.min, info.max):
        assert sig.symbol_values([torch.zeros(n), torch.zeros(n)]) == [n]
    for n in (info.min - 1, info.max + 1):
        with pytest.raises(InputError, match=rf"'x' dim 0 = {n}: dynamic dim {sym} must be in "
                                             rf"\[{info.min}, {info.max}\]$"):
            sig.symbol_values([torch.zeros(n), torch.zeros(n)])


def test_each_wrong_input_is_refused_naming_it():
    module, ir = _lifted("two_kernels")
    sig = CallSignature(ir, device_type="cpu")
    good = [t.clone() for t in module.example_inputs]
    names = ir.inputs
    cases = [
        (good[:-1], rf"takes {len(names)} inputs \({', '.join(names)}\), got {len(names) - 1}"),
        ([good[0], good[1].tolist()], rf"input '{names[1]}' must be a torch.Tensor, got list"),
        ([good[0], good[1].to("meta")], rf"input '{names[1]}' is on meta; move it to a CPU device"),
        ([good[0], good[1].double()], rf"input '{names[1]}' has dtype torch.float64; the model was "
                                      rf"compiled for torch.float32"),
        ([good[0], good[1][None]], rf"input '{names[1]}' has rank 2, expected 1"),
        ([good[0].t().contiguous().t(), good[1]], rf"input '{names[0]}' is not contiguous"),
        ([good[0], torch.zeros(good[1].shape[0] + 1)],
         rf"input '{names[1]}' dim 0 is {good[1].shape[0] + 1}, expected \w+ = {good[1].shape[0]}"),
    ]
    for tensors, message in cases:
        with pytest.raises(InputError, match=message):
            sig.symbol_values(tensors)
    with pytest.raises(InputError, match="move it to a CUDA device"):
        CallSignature(ir).symbol_values(good)  # the default: CUDA tensors


def test_out_tensors_must_match_each_output():
    module, ir = _lifted("vector_add")
    sig = CallSignature(ir, device_type="cpu")
    shapes = sig.output_shapes(sig.symbol_values(module.example_inputs))
    device = torch.device("cpu")
    sig.check_out([torch.empty(shapes[0])], shapes, device)
    bad = [[], [torch.empty(shapes[0]), torch.empty(shapes[0])],  # wrong count
           [torch.empty(shapes[0][0] + 1)], [torch.empty(shapes[0], dtype=torch.float64)],
           [torch.empty(shapes[0], device="meta")], [torch.empty(2 * shapes[0][0])[::2]], ["x"]]
    for out in bad:
        with pytest.raises(InputError, match=r"out= holds \d+ tensors|out\[0\] must be a contiguous "
                                             r"torch.float32 tensor of shape"):
            sig.check_out(out, shapes, device)
