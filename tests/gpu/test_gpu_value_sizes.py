"""GPU host only (issue 40): host code that reads tensor values, compiled natively for the ORT
target and run through the CUDA op (the sizes computed by ONNX Runtime on the device, the branch
checks in the custom-op library's C++ check op), bit for bit against the model run eagerly on
the GPU; an input taking a branch no example took is an ``UntracedBranchError`` naming the
model's line, raised by the C++ op without Python."""

from __future__ import annotations

import copy

import pytest
import torch
from torch.export import Dim

import kernel_lens as kl
from kernel_lens.errors import UntracedBranchError

from conftest import ROOT, load_module

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

M = load_module(ROOT / "tests" / "models" / "value_sizes.py")
SOURCE = (ROOT / "tests" / "models" / "value_sizes.py").read_text().splitlines()


def line_of(marker: str) -> str:
    return f"value_sizes.py:{next(i for i, l in enumerate(SOURCE, 1) if marker in l)}"


def b(*bits):
    return torch.tensor(bits, dtype=torch.bool)


def t(*values):
    return torch.tensor(values)


def _g(seed: int, *shape) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


X16, X100, X64 = _g(1, 8, 16), _g(2, 100), _g(3, 64)
OFF100, ON100 = torch.zeros(100, dtype=torch.bool), torch.zeros(100, dtype=torch.bool)
ON100[7] = True
SOME100 = torch.ones(100, dtype=torch.bool)
SOME100[::3] = False
KEEP = torch.randint(0, 4, (32,), generator=torch.Generator().manual_seed(4))
COUNTS = torch.randint(0, 4, (16,), generator=torch.Generator().manual_seed(5))
ROWS = Dim("r", min=1, max=64)

# name: (model, example, extra_examples, dynamic_shapes, calls compared with eager,
#        (a call no example admits, words of its refusal) or None)
CASES = {
    "nonzero_rows": ("NonzeroRows", (X16, b(1, 0, 1, 1, 0, 0, 1, 0)), None, None,
                     [(X16, b(1, 0, 1, 1, 0, 0, 1, 0)), (X16, b(*[1] * 8)), (X16, b(0, 0, 0, 0, 0, 0, 0, 1))],
                     ((X16, b(*[0] * 8)), line_of("BRANCH-NONZERO"))),
    "nonzero_rows_zero_example": ("NonzeroRows", (X16, b(1, 0, 1, 0, 0, 0, 0, 0)), [(X16, b(*[0] * 8))], None,
                                  [(X16, b(*[0] * 8)), (X16, b(*[1] * 8)), (X16, b(0, 0, 0, 0, 0, 0, 0, 1))],
                                  None),
    "nonzero_rows_pieces": ("NonzeroRows", (X16, b(1, 0, 1, 0, 0, 0, 0, 1)), None, ({0: ROWS}, {0: ROWS}),
                            [(_g(6, 1, 16), b(1)), (_g(7, 5, 16), b(0, 1, 1, 0, 1)), (X16, b(*[1] * 8)),
                             (_g(8, 64, 16), torch.arange(64) % 3 == 0)],
                            ((_g(9, 5, 16), b(0, 0, 0, 0, 0)), line_of("BRANCH-NONZERO"))),
    "item_size": ("ItemSize", (t(3, 4, 5),), None, None,
                  [(t(3, 4, 5),), (t(100, 1, 5),), (t(0, 0, 0),), (t(1, 0, 0),), (t(4000, 3000, 5),)], None),
    "item_branch": ("ItemBranch", (X100, OFF100), None, None, [(X100, OFF100), (_g(10, 100), OFF100)],
                    ((X100, ON100), line_of("BRANCH-ANY"))),
    "item_branch_extra": ("ItemBranch", (X100, OFF100), [(X100, ON100), (X100 * 2, OFF100)], None,
                          [(X100, OFF100), (X100, ON100), (_g(11, 100), torch.arange(100) >= 50)], None),
    "item_branch_pieces": ("ItemBranch", (X100, OFF100),
                           [(X100, ~OFF100), (_g(12, 1), torch.ones(1, dtype=torch.bool))],
                           ({0: Dim("n", min=1, max=4096)}, {0: Dim("n", min=1, max=4096)}),
                           [(_g(13, s), torch.full((s,), v, dtype=torch.bool))
                            for s in (1, 2, 37, 4096) for v in (False, True)], None),
    "int_size": ("IntSize", (t(3, 4, 5),), None, None,
                 [(t(3, 4, 5),), (t(100, 1, 5),), (t(0, 0, 0),), (t(7, 0, 0),)], None),
    "index_size": ("IndexSize", (t(3, 4, 5),), None, None, [(t(3, 4, 5),), (t(2, 5, 5),)],
                   ((t(1, 1, 5),), line_of("PINNED"))),
    "two_branches": ("TwoBranches", (X100, b(0, 0), b(0, 0)),
                     [(X100, b(0, 1), b(0, 0)), (X100, b(0, 0), b(0, 1))], None,
                     [(X100, b(0, 0), b(0, 0)), (X100, b(0, 1), b(0, 0)), (X100, b(0, 0), b(0, 1))],
                     ((X100, b(0, 1), b(0, 1)), "no traced graph serves them")),
    "writes_input_on_one_branch": ("WritesInputInOneBranch", (X100, b(0)), [(X100, b(1))], None,
                                   [(X100, b(0)), (X100, b(1))], None),
    "writes_input_then_refused": ("WritesInputInOneBranch", (X100, b(1)), None, None, [(X100, b(1))],
                                  ((X100, b(0)), line_of("BRANCH-WRITE"))),
    "tolist": ("ToList", (X64, t(3, 4, 5)), None, None,
               [(X64, t(3, 4, 5)), (X64, t(0, 0, 9)), (X64, t(10, 1, 1)), (X64, t(0, 0, 0))], None),
    "equal": ("Equal", (X64, t(1, 2), t(1, 2)), [(X64, t(1, 2), t(1, 3))], None,
              [(X64, t(1, 2), t(1, 2)), (X64, t(1, 2), t(2, 2)), (X64, t(7, 7), t(7, 7))], None),
    "equal_alone": ("Equal", (X64, t(1, 2), t(1, 2)), None, None, [(X64, t(5, 5), t(5, 5))],
                    ((X64, t(1, 2), t(1, 3)), line_of("BRANCH-EQUAL"))),
    "block_from_value": ("LongestSegmentBlock", (_g(19, 40), t(0, 5, 12, 40)), [(_g(19, 40), t(0, 1, 2, 3))], None,
                         [(_g(19, 40), t(0, 5, 12, 40)), (_g(19, 40), t(0, 17, 40, 40)), (_g(19, 40), t(0, 0, 1, 2))],
                         ((_g(19, 40), t(0, 16, 32, 40)), line_of("BLOCK-FROM-VALUE"))),
    "count_equals_total": ("CountEqualsTotal", (X100, torch.ones(100, dtype=torch.bool)), [(X100, SOME100)],
                           None, [(X100, torch.ones(100, dtype=torch.bool)), (X100, SOME100),
                                  (X100, torch.zeros(100, dtype=torch.bool))], None),
    "count_equals_total_alone": ("CountEqualsTotal", (X100, torch.ones(100, dtype=torch.bool)), None, None,
                                 [(X100, torch.ones(100, dtype=torch.bool))],
                                 ((X100, SOME100), line_of("BRANCH-COUNT"))),
    "checked_count": ("CheckedCount", (X64, torch.ones(64, dtype=torch.bool)), None, None,
                      [(X64, torch.ones(64, dtype=torch.bool))],
                      ((X64, torch.arange(64) < 10), line_of("CHECKED-COUNT"))),
    "item_scalar": ("ItemScalar", (X64, t(3, 4, 5)), None, None,
                    [(X64, t(3, 4, 5)), (X64, t(100, -7, 0)), (X64, t(0, 0, 0))], None),
    "masked_select": ("MaskedSelect", (_g(14, 4, 32), KEEP), None, None,
                      [(_g(14, 4, 32), KEEP), (_g(14, 4, 32), torch.zeros(32, dtype=torch.long)),
                       (_g(14, 4, 32), torch.full((32,), 3))], None),
    "nonzero_as_tuple": ("NonzeroAsTuple", (_g(15, 16), COUNTS), None, None,
                         [(_g(15, 16), COUNTS), (_g(15, 16), torch.zeros(16, dtype=torch.long)),
                          (_g(15, 16), torch.full((16,), 3))], None),
    "repeat_interleave": ("RepeatInterleave", (_g(16, 16), COUNTS), None, None,
                          [(_g(16, 16), COUNTS), (_g(16, 16), torch.zeros(16, dtype=torch.long)),
                           (_g(16, 16), torch.full((16,), 3))], None),
    "negative_item": ("NegativeItem", (X64, t(5, 1)), None, None, [(X64, t(7, 0)), (X64, t(5, 1))],
                      ((X64, t(-10, -20)), "is negative")),
    "int_as_dtype": ("IntAsDtype", (t(3, 4, 5),), None, None, [(t(3, 4, 5),), (t(2, 5, 5),)],
                     ((t(1, 1, 1),), line_of("INT-DTYPE"))),
    "columns_kept": ("ColumnsKept", (_g(17, 4, 32), KEEP), None, None,
                     [(_g(17, 4, 32), KEEP), (_g(17, 4, 32), torch.full((32,), 3)),
                      (_g(17, 4, 32), torch.zeros(32, dtype=torch.long))], None),
    "compiled_helper": ("CompiledHelper", (X100,), None, None, [(X100,), (_g(18, 100),)], None),
    "block_from_value_alone": ("LongestSegmentBlock", (_g(19, 40), t(0, 5, 12, 40)), None, None,
                               [(_g(19, 40), t(0, 5, 12, 40)), (_g(19, 40), t(0, 17, 40, 40))],
                               ((_g(19, 40), t(0, 1, 2, 3)), line_of("BLOCK-FROM-VALUE"))),
    "decode_flag": ("DecodeFlag", (_g(21, 40), t(0, 5, 12, 40)), [(_g(21, 40), t(0, 1, 2, 3))], None,
                    [(_g(21, 40), t(0, 5, 12, 40)), (_g(21, 40), t(0, 1, 2, 3)), (_g(21, 40), t(0, 1, 1, 2))],
                    None),
    "decode_flag_alone": ("DecodeFlag", (_g(21, 40), t(0, 5, 12, 40)), None, None,
                          [(_g(21, 40), t(0, 2, 3, 4))], ((_g(21, 40), t(0, 1, 2, 3)), line_of("FLAG-FROM-VALUE"))),
    "segment_ids_int32": ("SegmentIds", (_g(22, 6), torch.tensor([2, 0, 3, 1, 0, 1], dtype=torch.int32)), None,
                          None, [(_g(22, 6), torch.tensor(c, dtype=torch.int32))
                                 for c in ([2, 0, 3, 1, 0, 1], [0] * 6, [5, 1, 0, 0, 0, 4])], None),
    "padded_buffer": ("PaddedBuffer", (torch.ones(8), t(3, 1)), None, None,
                      [(torch.ones(8), t(3, 1)), (torch.ones(8), t(0, 0)), (torch.ones(8), t(5, 2))], None),
    "tile_table_pieces": ("TileTable", (_g(23, 600),), None, ({0: Dim("n", min=2, max=4096)},),
                          [(_g(24, n),) for n in (2, 512, 513, 4096)], None),
}


def _cuda(inputs):
    return tuple(x.cuda() for x in inputs)


def _same(got, want) -> bool:
    if isinstance(want, torch.Tensor):
        return isinstance(got, torch.Tensor) and got.shape == want.shape and got.dtype == want.dtype \
            and torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))
    return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want))


def _max_diff(got, want) -> float:
    if isinstance(want, torch.Tensor):
        return 0.0 if not want.numel() else (got.double() - want.double()).abs().max().item()
    return max((_max_diff(g, w) for g, w in zip(got, want)), default=0.0)


@pytest.mark.parametrize("case", sorted(CASES))
def test_value_sizes_equal_eager_on_the_gpu_and_an_untraced_branch_is_refused(case):
    name, example, extra, dims, calls, refused = CASES[case]
    model = getattr(M, name)().cuda()
    with torch.compiler.set_stance("force_eager"):
        compiled = kl.compile(copy.deepcopy(model), _cuda(example), dynamic_shapes=dims,
                              extra_examples=[_cuda(e) for e in extra] if extra else None,
                              targets=["ort"])
        assert "ort.library" in compiled.artifacts, "not built natively for the ORT target"
        for call in calls:
            mine, theirs = _cuda(call), _cuda(call)  # inputs the model writes: each side its own
            want = model(*theirs)
            got = compiled.run(*mine)
            torch.cuda.synchronize()
            assert _same(got, want), (case, _max_diff(got, want))
            assert all(_same(a, b) for a, b in zip(mine, theirs)), (case, "inputs written differently")
    if refused is not None:
        call, words = refused
        given = _cuda(call)
        before = [x.clone() for x in given]
        with pytest.raises(UntracedBranchError, match=words):
            compiled.run(*given)
            torch.cuda.synchronize()
        assert all(_same(a, b) for a, b in zip(given, before)), (case, "a refused call wrote an input")
        again = compiled.run(*_cuda(calls[0]))  # the session still serves after a refusal
        assert _same(again, model(*_cuda(calls[0])))
    print(f"value_sizes {case}: bit-exact (max_abs_diff=0.0) over {len(calls)} calls "
          f"({len(compiled.ir.branches) or 1} branches, {len(compiled.ir.pieces) or 1} pieces)"
          + (", untraced branch refused by the C++ check" if refused else ""))


import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _copy_kernel(x_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    keep = i < n
    tl.store(o_ptr + i, tl.load(x_ptr + i, mask=keep), mask=keep)


def _tied_sorts(x, ids):
    o = torch.empty_like(x)
    _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, o, x.numel(), BLOCK=1024)
    return (*torch.sort(o, stable=True, descending=True), *torch.sort(o, stable=True),
            *torch.sort(ids, stable=True), *torch.sort(ids, stable=True, descending=True))


@pytest.mark.parametrize("n", [100, 5000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_stable_sort_through_ort_orders_ties_by_index_as_torch_does(n, dtype):
    """torch.sort(stable=True) is ONNX TopK, whose spec orders ties by index; this checks ORT's
    CUDA TopK keeps to it (values drawn from 10, ids from 7: ties everywhere) both ways."""
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(0, 10, (n,), generator=gen).to(dtype).cuda()
    ids = torch.randint(0, 7, (2 * n,), generator=gen, dtype=torch.int32).cuda()
    c = kl.compile(_tied_sorts, (x, ids), targets=["ort"])
    got, want = c.run(x, ids), _tied_sorts(x, ids)
    torch.cuda.synchronize()
    same = [torch.equal(a, b) for a, b in zip(got, want)]
    print(f"stable sort ort n={n} {dtype}: equal={same}")
    assert all(same)
