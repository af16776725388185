"""Launches through other doors than ``kernel[grid](...)``: a library's own KernelInterface
launcher that does host work on tensors (bypassed under torch.export after the eager capture
proved the bypass faithful), and ``torch.library`` ops (custom_op, triton_op + wrap_triton),
whose bodies are inlined."""

from __future__ import annotations

import pytest
import torch

import kernel_lens as kl
from kernel_lens.errors import TraceError

from conftest import ROOT, load_module

m = load_module(ROOT / "tests" / "models" / "launchers.py")
N = torch.export.Dim("n", min=2, max=4096)


def _kernels(ir):
    return [ir.kernels[launch.kernel].name for launch in ir.launches]


def test_caching_launcher_touching_data_ptr_is_bypassed_under_export():
    x = torch.randn(100)
    compiled = kl.compile(m.WrapperModel(), (x,), dynamic_shapes=({0: N},), arch=90)
    ir = compiled.ir
    assert _kernels(ir) == ["scale_kernel", "scale_kernel"]
    for launch in ir.launches:  # the grid stays symbolic: the wrapper's code never ran on fakes
        assert launch.grid[0] == "floor(n/64 + 63/64)"
        assert next(a.expr for a in launch.args if a.name == "n") == "n"
    scales = [next(a.constant for a in launch.args if a.name == "s") for launch in ir.launches]
    assert scales == [2.0, 3.0]
    # the second launch went through the handle the launcher cached: captured all the same
    torch.testing.assert_close(compiled.example_outputs, x * 6.0)


def test_launcher_that_changes_an_argument_is_refused_naming_it():
    bad = m.CachingLauncher(m.scale_kernel, alter=lambda args: (args[0], args[1], args[2] // 2,
                                                                args[3]))
    with pytest.raises(TraceError, match=r"launcher CachingLauncher changed argument 'n' of "
                                         r"kernel scale_kernel") as err:
        kl.compile(m.WrapperModel(bad), (torch.randn(100),), dynamic_shapes=({0: N},), arch=90)
    assert "\n" not in str(err.value)


def test_launcher_that_launches_twice_per_call_is_refused():
    bad = m.CachingLauncher(m.scale_kernel, twice=True)
    with pytest.raises(TraceError, match="made 2 kernel launches in one call"):
        kl.compile(m.WrapperModel(bad), (torch.randn(100),), dynamic_shapes=({0: N},), arch=90)


def test_torch_library_triton_op_and_custom_op_are_inlined():
    x, y = torch.randn(100), torch.randn(100)
    compiled = kl.compile(m.TorchLibraryModel(), (x, y), dynamic_shapes=({0: N}, {0: N}), arch=90)
    ir = compiled.ir
    assert _kernels(ir) == ["add_kernel", "add_kernel", "scale_kernel"]
    assert all(launch.grid[0] == "floor(n/64 + 63/64)" for launch in ir.launches)
    inplace = {a.name: a.value for a in ir.launches[2].args if a.value}  # mutates_args=("x",)
    assert inplace["x_ptr"] == inplace["out_ptr"] == ir.ops[-1].args[0].ref
    # no opaque custom-op node is left between the launches
    assert not [op for op in ir.ops if "kl_tests" in op.op]
    # device_types="cuda" ran on the CPU host: its CUDA body was inlined into the capture
    torch.testing.assert_close(compiled.example_outputs, ((x + y) + y) * 2 * 0.5 + 1)


def test_wrap_triton_in_forward_launches_the_kernel():
    x, y = torch.randn(50), torch.randn(50)
    ir = kl.compile(m.WrapTritonModel(), (x, y), dynamic_shapes=({0: N}, {0: N}), arch=90).ir
    assert _kernels(ir) == ["add_kernel"]
    assert ir.launches[0].grid[0] == "floor(n/64 + 63/64)"


def test_opaque_op_names_the_unseen_launch_and_the_op():
    with pytest.raises(TraceError) as err:
        kl.compile(m.OpaqueOpModel(), (torch.randn(100), torch.randn(100)),
                   dynamic_shapes=({0: N}, {0: N}), arch=90)
    text = str(err.value)
    assert "not seen #0 add_kernel" in text
    assert "kl_tests_opaque.add.default" in text and "torch.library.custom_op" in text


def test_tensor_like_arguments_map_to_views_of_their_storage():
    x = torch.randn(200)
    n = torch.export.Dim("n", min=4, max=4096)  # the half-size views must not be size 1
    compiled = kl.compile(m.TensorLikeModel(), (x,), dynamic_shapes=({0: n},), arch=90)
    (launch,) = compiled.ir.launches
    args = {a.name: a for a in launch.args}
    ir = compiled.ir

    def root(value):  # follow the views kernel_lens made back to the tensor they view
        op = next((op for op in ir.ops if value in op.outputs and "as_strided" in op.op), None)
        return value if op is None else root(op.args[0].ref)

    assert root(args["x_ptr"].value) == ir.inputs[0]  # x's own storage, offset by n//2
    assert root(args["out_ptr"].value) == ir.outputs[0]
    assert args["x_ptr"].storage_offset == "floor(n/2)" and args["out_ptr"].storage_offset == "0"
    assert args["x_ptr"].role == "input" and args["out_ptr"].role == "output"
    expected = torch.zeros(200)
    expected[:100] = x[100:] * 2
    torch.testing.assert_close(compiled.example_outputs, expected)


def test_library_host_code_that_needs_cuda_is_one_line_on_a_cpu_host():
    class Model(torch.nn.Module):
        def forward(self, x):
            with torch.cuda.device(x.device):  # FlagGems wraps every launch like this
                return m.WrapperModel()(x)

    with pytest.raises(kl.errors.CaptureError) as err:
        kl.compile(Model(), (torch.randn(100),), arch=90)
    text = str(err.value)
    assert "\n" not in text and text.startswith("the model's forward raised ")
    assert "test_launchers.py" in text and "capture on a GPU" in text


def test_library_autotuner_subclass_runs_as_tritons_autotuner_under_export():
    x = torch.randn(300)
    compiled = kl.compile(m.AutotunerSubclassModel(), (x,), dynamic_shapes=({0: N},), arch=90)
    (launch,) = compiled.ir.launches
    assert launch.grid[0] == "floor(n/32 + 31/32)"  # the first config's BLOCK, symbolic grid
    assert compiled.ir.kernels[launch.kernel].param("BLOCK").constexpr_value == 32
    torch.testing.assert_close(compiled.example_outputs, x * 3.0)


def test_library_launcher_over_a_library_autotuner_keeps_the_config():
    x = torch.randn(300)
    compiled = kl.compile(m.WrappedAutotunerSubclassModel(), (x,), dynamic_shapes=({0: N},),
                          arch=90)
    (launch,) = compiled.ir.launches
    assert compiled.ir.kernels[launch.kernel].param("BLOCK").constexpr_value == 32
    assert launch.grid[0] == "floor(n/32 + 31/32)"
    torch.testing.assert_close(compiled.example_outputs, x * 3.0)


def test_library_autotuner_that_picks_its_own_config_keeps_it_under_export():
    x = torch.randn(300)
    compiled = kl.compile(m.OwnTunerModel(), (x,), dynamic_shapes=({0: N},), arch=90)
    (launch,) = compiled.ir.launches
    kernel = compiled.ir.kernels[launch.kernel]
    assert kernel.param("BLOCK").constexpr_value == 128 and kernel.options.num_warps == 8
    assert launch.grid[0] == "floor(n/128 + 127/128)"
    torch.testing.assert_close(compiled.example_outputs, x * 3.0)
