"""The repeated-layout fast path of a plain ``run()`` (issue 26 item 4), on the CPU: the checks
are remembered per layout of a call's tensors (:meth:`CallSignature.checked`) and still refuse
every bad call after good ones; the ORT runner keeps a few IOBindings and the one that runs
holds exactly the call's pointers and shapes, binding nothing on a repeated call (alternating
output buffers included) and only what changed otherwise.

The runner is an :class:`OrtModel` over a stand-in ONNX graph whose ORT session is a fake that
records what is bound and run: no GPU, no plugin library."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from kernel_lens.errors import InputError, KernelLensError
from kernel_lens.runtime import ort as ort_runtime
from kernel_lens.runtime.signature import REMEMBERED, CallSignature, layout

from conftest import CORPUS, load_module, model_ir

CPU = torch.device("cpu")


def _signature(stem: str) -> tuple[object, CallSignature]:
    module = load_module(CORPUS / f"{stem}.py")
    return module, CallSignature(model_ir(CORPUS / f"{stem}.py"), device_type="cpu")


def _counting(signature: CallSignature, monkeypatch) -> dict[str, int]:
    """How often each full check of ``signature`` runs."""
    counts = {"symbol_values": 0, "check_out": 0, "check_written_inputs": 0}
    for name in counts:
        real = getattr(signature, name)

        def counted(*args, real=real, name=name, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(signature, name, counted)
    return counts


# --- the layout key ----------------------------------------------------------------------------
def test_the_layout_key_records_each_fact_the_checks_read():
    x = torch.zeros(4, 6)
    key = layout([x])
    assert key == layout([torch.ones(4, 6)])  # the contents and the pointer do not matter...
    assert layout([x], pointers=True) != layout([torch.ones(4, 6)], pointers=True)  # ...unless asked
    others = [torch.zeros(4, 7), torch.zeros(4, 6, dtype=torch.float64), torch.zeros(6, 4).t(),
              torch.zeros(4, 6, device="meta"), torch.nn.Parameter(torch.zeros(4, 6)),
              torch.zeros(4, 6, 1)]
    for other in others:  # shape, dtype, strides (same shape), device, class, rank
        assert layout([other]) != key, other
    assert layout([x, x]) != key  # the number of tensors
    assert layout([torch.nn.Parameter(x)], pointers=True) != layout([x], pointers=True)  # same memory
    for odd in ([x.tolist()], [x.to_sparse()], [x, None]):  # always checked in full
        assert layout(odd) is None


# --- CallSignature.checked ---------------------------------------------------------------------
def test_a_repeated_layout_is_checked_once_and_gives_the_same_results(monkeypatch):
    module, sig = _signature("two_kernels")
    counts = _counting(sig, monkeypatch)
    good = [t.clone() for t in module.example_inputs]
    values = sig.symbol_values(good)
    want = (values, tuple(sig.output_shapes(values)), CPU)
    counts["symbol_values"] = 0
    for _ in range(3):
        call = sig.checked(good)
        assert (call.values, call.shapes, call.device) == want
        call = sig.checked([torch.randn_like(t) for t in good])  # other tensors, same layout
        assert (call.values, call.shapes, call.device) == want
    assert counts["symbol_values"] == 1
    bigger = [torch.randn(good[0].shape[0] + 1, good[0].shape[1]), good[1]]
    assert sig.checked(bigger).values != values and counts["symbol_values"] == 2


def test_every_bad_call_is_refused_after_good_calls():
    module, sig = _signature("two_kernels")
    good = [t.clone() for t in module.example_inputs]
    rows, cols = good[0].shape
    bad = [
        good[:-1],                                                  # too few
        [good[0], good[1].tolist()],                                # not a tensor
        [good[0], good[1].to("meta")],                              # device
        [good[0], good[1].double()],                                # dtype
        [good[0], good[1][None]],                                   # rank
        [torch.empty(cols, rows).t(), good[1]],                     # strides, with the same shape
        [good[0], torch.zeros(cols + 1)],                           # a shared dim
        [torch.zeros(0, cols), good[1]],                            # below a symbol's range
    ]
    for tensors in bad:
        with pytest.raises(InputError) as direct:
            sig.symbol_values(tensors)
        for _ in range(2):  # before and after a good call with the good layout
            with pytest.raises(InputError) as remembered:
                sig.checked(tensors)
            assert str(remembered.value) == str(direct.value)
            sig.checked(good)


def test_out_checks_are_remembered_with_the_pointers_and_refuse_after_good_calls(monkeypatch):
    module, sig = _signature("vector_add")
    counts = _counting(sig, monkeypatch)
    x, y = (t.clone() for t in module.example_inputs)
    out = [torch.empty_like(x)]
    for _ in range(3):
        sig.checked([x, y], out)
    assert counts["check_out"] == 1
    other = [torch.empty_like(x)]  # the same layout at another pointer: checked again
    sig.checked([x, y], other)
    assert counts["check_out"] == 2
    n = x.shape[0]
    wide = torch.empty(2 * n)
    cases = {  # each has the accepted out's class, dtype, shape, strides and device
        r"out\[0\] shares memory with input 'x'": [x],
        r"out\[0\] shares memory with input 'y'": [y],
        r"must be a contiguous torch.float32 tensor": [wide[::2]],
    }
    for message, bad in cases.items():
        for _ in range(2):
            with pytest.raises(InputError, match=message):
                sig.checked([x, y], bad)
            sig.checked([x, y], out)
    view = wide[:n]  # overlapping an input that is a view of the same buffer: refused
    with pytest.raises(InputError, match="shares memory with input 'x'"):
        sig.checked([wide[1:n + 1], y], [view])
    sig.checked([wide[n:], y], [view])  # touching, not sharing: accepted
    with pytest.raises(InputError, match="out= holds 2 tensors"):
        sig.checked([x, y], [out[0], torch.empty_like(x)])
    with pytest.raises(InputError, match="must be a contiguous"):
        sig.checked([x, y], [out[0].double()])


def test_written_inputs_sharing_memory_are_refused_after_good_calls(monkeypatch):
    module, sig = _signature("inplace_input")
    counts = _counting(sig, monkeypatch)
    y, x = (t.clone() for t in module.example_inputs)
    for _ in range(3):
        sig.checked([y, x], written=(0,))
    assert counts["check_written_inputs"] == 1
    n = y.shape[0]
    base = torch.zeros(2 * n)
    for a, b in ((y, y), (base[:n], base[:n]), (base[:n], base[n // 2:n // 2 + n])):
        for _ in range(2):  # the same layout as the good call's, other pointers
            with pytest.raises(InputError, match="'y' is written in place by the model and shares "
                                                 "memory with input 'x'"):
                sig.checked([a, b], written=(0,))
            sig.checked([y, x], written=(0,))
    sig.checked([base[:n], base[n:]], written=(0,))  # adjacent halves: accepted
    assert sig.checked([y, y]).values  # nothing written: the same tensor twice is fine


def test_what_is_remembered_is_bounded():
    module, sig = _signature("vector_add")
    for n in range(10, 10 + 3 * REMEMBERED):
        x = torch.zeros(n)
        assert sig.checked([x, x.clone()], [torch.empty(n)]).shapes == ((n,),)
    assert 0 < len(sig._layouts) <= REMEMBERED and 0 < len(sig._accepted) <= REMEMBERED


# --- the ORT runner's bindings -----------------------------------------------------------------
class _FakeBinding:
    """An IOBinding that records what it holds (ORT replaces a name bound again)."""

    def __init__(self, session: "_FakeSession") -> None:
        self.session, self.held = session, {}

    def bind_input(self, name, device_type, device_id, code, shape, pointer):
        self._bind(name, shape, pointer)

    def bind_output(self, name, device_type, device_id, code, shape, pointer):
        self._bind(name, shape, pointer)

    def _bind(self, name, shape, pointer):
        if self.session.fail_next_bind:
            self.session.fail_next_bind = False
            raise RuntimeError("ORT refused the binding")
        assert isinstance(shape, tuple) and isinstance(pointer, int)
        self.held[name] = (pointer, shape)
        self.session.binds.append(name)


class _FakeSession:
    def __init__(self) -> None:
        self.binds: list[str] = []
        self.runs: list[dict] = []  # what the binding that ran held, per run
        self.made = 0
        self.fail_next_bind = False

    def io_binding(self):
        self.made += 1
        return _FakeBinding(self)

    def run_with_iobinding(self, binding, options=None):
        self.runs.append(dict(binding.held))


def _runner(stem: str, tmp_path, monkeypatch, mutated: tuple[str, ...] = ()):
    """An OrtModel of a corpus model over a stand-in ONNX graph (its outputs, and
    ``mutated_<input>`` for ``mutated``, not in place: an Identity writes none), on CPU tensors,
    with a fake session."""
    import onnxruntime

    ir = model_ir(CORPUS / f"{stem}.py")
    outs = [f"output_{i}" for i in range(len(ir.outputs))] + [f"mutated_{n}" for n in mutated]
    graph = helper.make_graph(
        [helper.make_node("Identity", [ir.inputs[0]], [o]) for o in outs], "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ir.inputs],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    onnx.save(helper.make_model(graph), str(tmp_path / "m.onnx"))
    (tmp_path / "libm.so").write_bytes(b"stand-in, never opened")
    real = onnxruntime.get_available_providers()
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: [*real, "CUDAExecutionProvider"])
    runner = ort_runtime.OrtModel(ir, tmp_path / "m.onnx", tmp_path / "libm.so")
    runner.signature = CallSignature(ir, device_type="cpu")
    monkeypatch.setattr(runner, "_stream", lambda index: (1, None))
    fake = _FakeSession()
    runner._sessions[(None, 1)] = ort_runtime._Session(fake, tuple(n for _, n, _ in runner._slots))
    return load_module(CORPUS / f"{stem}.py"), runner, fake


def _held(runner, *tensors) -> dict:
    """What a binding must hold to run a call with ``tensors`` (in the order of ``_slots``)."""
    return {name: (t.data_ptr(), tuple(t.shape)) for (_, name, _), t in zip(runner._slots, tensors)}


def test_a_repeated_call_binds_nothing_and_runs_its_own_pointers(tmp_path, monkeypatch):
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = module.example_inputs[0].clone()
    name = runner.ir.inputs[0]
    a, b = torch.empty_like(x), torch.empty_like(x)
    for out in (a, b, a, b, a):  # outputs alternating between two buffers: two bindings
        assert runner.run(x, out=[out]) is out
        assert fake.runs[-1] == _held(runner, x, out)
    assert fake.binds == [name, "output_0", name, "output_0"] and fake.made == 2
    assert runner._sessions[(None, 1)].bound == _held(runner, x, a)  # the last run's (GPU tests read it)
    kept = [runner.run(x)]
    for _ in range(4):  # outputs the runner makes, the last held while the next is made
        kept.append(runner.run(x))
        assert fake.runs[-1] == _held(runner, x, kept[-1])
        assert kept[-1] is not kept[-2]
        kept.pop(0)
    assert len(fake.runs) == 10


def test_a_new_input_is_rebound_in_place(tmp_path, monkeypatch):
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = module.example_inputs[0].clone()
    out = torch.empty_like(x)
    runner.run(x, out=[out])
    state = runner._sessions[(None, 1)]
    first = state.binding
    for _ in range(3):
        x = x.clone()  # a new input buffer, the same output: one name bound again, same binding
        runner.run(x, out=[out])
        assert fake.runs[-1] == _held(runner, x, out) and state.binding is first
    assert fake.binds == [runner.ir.inputs[0], "output_0"] + [runner.ir.inputs[0]] * 3
    assert fake.made == 1


def test_new_pointers_rebind_only_what_changed_in_the_least_recent_binding(tmp_path, monkeypatch):
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = module.example_inputs[0].clone()
    outs = [torch.empty_like(x) for _ in range(ort_runtime.KEPT_BINDINGS + 3)]
    for out in outs:
        assert runner.run(x, out=[out]) is out
        assert fake.runs[-1] == _held(runner, x, out)
    state = runner._sessions[(None, 1)]
    assert fake.made == len(state.bindings) == ort_runtime.KEPT_BINDINGS
    assert fake.binds.count(runner.ir.inputs[0]) == ort_runtime.KEPT_BINDINGS  # once per binding
    assert fake.binds.count("output_0") == len(outs)
    fake.binds.clear()
    for out in outs[-ort_runtime.KEPT_BINDINGS:]:  # the ones kept: nothing bound
        runner.run(x, out=[out])
        assert fake.runs[-1] == _held(runner, x, out)
    assert fake.binds == []
    x2 = torch.randn(4, 5, x.shape[-1])  # another shape: every name bound again
    y2 = runner.run(x2)
    assert fake.runs[-1] == _held(runner, x2, y2) and len(fake.binds) == 2
    fake.binds.clear()
    y3 = torch.empty_like(y2)
    runner.run(x2, out=[y3])  # the binding holding x2 is the closest (not the least recent)
    assert fake.runs[-1] == _held(runner, x2, y3) and fake.binds == ["output_0"]


def test_a_binding_that_failed_half_way_is_not_kept(tmp_path, monkeypatch):
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = module.example_inputs[0].clone()
    out = torch.empty_like(x)
    fake.fail_next_bind = True
    with pytest.raises(RuntimeError, match="refused"):
        runner.run(x, out=[out])
    assert fake.runs == [] and not runner._sessions[(None, 1)].bindings
    runner.run(x, out=[out])
    assert fake.runs == [_held(runner, x, out)]


def test_runner_checks_still_fire_after_good_calls(tmp_path, monkeypatch):
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = module.example_inputs[0].clone()
    out = torch.empty_like(x)
    runner.run(x)
    runner.run(x, out=[out])
    for call, message in [(lambda: runner.run(x.double()), "has dtype torch.float64"),
                          (lambda: runner.run(x.transpose(0, 1).contiguous().transpose(0, 1)),
                           "is not contiguous"),
                          (lambda: runner.run(x, out=[x]), r"out\[0\] shares memory with input"),
                          (lambda: runner.run(x, out=[out.double()]), "must be a contiguous")]:
        runs = len(fake.runs)
        with pytest.raises(InputError, match=message):
            call()
        assert len(fake.runs) == runs  # refused before ORT runs
        runner.run(x, out=[out])


def test_a_written_input_is_bound_and_refused_when_shared_after_good_calls(tmp_path, monkeypatch):
    module, runner, fake = _runner("inplace_input", tmp_path, monkeypatch, mutated=("y",))
    assert runner.ir.inputs == ["y", "x"]
    assert runner._mutated and not runner._mutated[0].in_place  # an Identity writes nothing in place
    y, x = (t.clone() for t in module.example_inputs)
    for _ in range(3):
        runner.run(y, x)
        held = fake.runs[-1]
        assert (held["y"], held["x"]) == ((y.data_ptr(), tuple(y.shape)), (x.data_ptr(), tuple(x.shape)))
        assert held["mutated_y"][0] != y.data_ptr()  # a buffer of its own, copied into y after
    assert fake.binds.count("y") == fake.binds.count("x") == fake.made  # once per binding made
    for other in (y, y[:]):
        with pytest.raises(InputError, match="written in place by the model and shares memory"):
            runner.run(y, other)
    runner.run(y, x)
    assert fake.runs[-1]["y"] == (y.data_ptr(), tuple(y.shape))


def test_a_kept_binding_given_the_same_pointer_with_another_shape_is_rebound(tmp_path, monkeypatch):
    """Issue 39 item 8: ``x[:2]`` after ``x`` has x's data pointer; the binding must hold the new
    shape, not the one kept for that pointer (ORT would read and write past the view)."""
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    x = torch.randn(4, 5, module.example_inputs[0].shape[-1])
    runner.run(x)
    head = x[:2]
    assert head.data_ptr() == x.data_ptr()
    out = runner.run(head)
    assert fake.runs[-1] == _held(runner, head, out)
    assert fake.runs[-1][runner.ir.inputs[0]] == (x.data_ptr(), (2, 5, x.shape[-1]))
    again = runner.run(x)  # and back: the whole tensor's shape again
    assert fake.runs[-1] == _held(runner, x, again)


def test_a_session_is_never_opened_inside_a_capture(tmp_path, monkeypatch):
    """Opening an ORT session synchronizes the device, which a stream capture forbids (ORT then
    falls back to its CPU EP and names a missing kernel): refused in one line naming the fix."""
    module, runner, fake = _runner("rmsnorm", tmp_path, monkeypatch)
    opened = []
    monkeypatch.setattr(runner._ort, "InferenceSession", lambda *a, **k: opened.append(a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(KernelLensError, match="inside a CUDA graph capture.*call run\\(\\) once"):
        runner.session(0, 7)
    assert not opened and (0, 7) not in runner._sessions
    runner.run(module.example_inputs[0].clone())  # an open session runs inside a capture
    assert len(fake.runs) == 1
