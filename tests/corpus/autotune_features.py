"""``@triton.autotune`` with every feature a library uses: ``cache_results=True`` (Triton's disk
cache of timings, which needs an active driver to key it; Triton skips it when a remaining config
has a pre_hook, so the two kept after pruning have none), ``prune_configs_by`` (an early prune, a
perf model and ``top_k``), ``reset_to_zero``, ``post_hook``, a ``do_bench`` override, and, on a
second kernel, a config ``pre_hook`` (traced into the graph: it zeroes a tensor before the
launch). On a CPU-only host nothing is benchmarked: the first config left after pruning is used
(BLOCK_SIZE=64: 16 is pruned early, the perf model ranks 64 first); on a GPU the autotuner
benchmarks as usual. Triton runs ``reset_to_zero`` only after benchmarking, so the counter starts
at zero, as every later call would see it."""

import torch
import triton
import triton.language as tl


def _early_prune(configs, named_args, **kwargs):
    return [c for c in configs if c.kwargs["BLOCK_SIZE"] >= 32]


def _perf_model(**meta):
    return abs(meta["BLOCK_SIZE"] - 64)


def _zero_count(nargs):
    nargs["count_ptr"].zero_()


def _do_bench(kernel_call, quantiles):
    kernel_call()
    return [1.0, 1.0, 1.0]


@triton.autotune(
    configs=[
        triton.Config({"BLOCK_SIZE": 16}, num_warps=1),
        triton.Config({"BLOCK_SIZE": 32}, num_warps=1),
        triton.Config({"BLOCK_SIZE": 64}, num_warps=2),
        triton.Config({"BLOCK_SIZE": 128}, num_warps=4),
    ],
    key=["n"],
    prune_configs_by={"early_config_prune": _early_prune, "perf_model": _perf_model, "top_k": 2},
    reset_to_zero=["count_ptr"],
    post_hook=lambda nargs, exception: None,
    do_bench=_do_bench,
    cache_results=True,
)
@triton.jit
def add_count_kernel(x_ptr, y_ptr, out_ptr, count_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)
    tl.atomic_add(count_ptr, tl.sum(mask.to(tl.int32), axis=0))


@triton.autotune(
    configs=[triton.Config({"BLOCK_SIZE": 128}, num_warps=4, pre_hook=_zero_count),
             triton.Config({"BLOCK_SIZE": 32}, num_warps=1, pre_hook=_zero_count)],
    key=["n"],
)
@triton.jit
def count_kernel(x_ptr, count_ptr, n, BLOCK_SIZE: tl.constexpr):
    offs = tl.program_id(0) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offs < n
    tl.atomic_add(count_ptr, tl.sum((tl.load(x_ptr + offs, mask=mask) > 0).to(tl.int32), axis=0))


class Model(torch.nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        count = torch.zeros((1,), dtype=torch.int32, device=x.device)
        n = x.numel()
        add_count_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, y, out, count, n)
        positive = torch.full((1,), 7, dtype=torch.int32, device=x.device)  # pre_hook zeroes it
        count_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK_SIZE"]),)](x, positive, n)
        return out, count, positive


def _make_inputs(n=500):
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, generator=g), torch.randn(n, generator=g)


def reference(x, y):
    return (x + y, torch.tensor([x.numel()], dtype=torch.int32),
            (x > 0).sum().to(torch.int32).reshape(1))


model = Model()
example_inputs = _make_inputs()
_n = torch.export.Dim("n", min=2, max=8192)
dynamic_shapes = {"x": {0: _n}, "y": {0: _n}}
expected_roles = {"add_count_kernel": {"x_ptr": "input", "y_ptr": "input", "out_ptr": "output",
                                       "count_ptr": "inplace"},
                  "count_kernel": {"x_ptr": "input", "count_ptr": "inplace"}}
tolerance = (0, 0)
