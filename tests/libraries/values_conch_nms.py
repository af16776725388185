"""conch-triton-kernels: `conch.ops.vision.nms.nms` (non-maximum suppression of boxes, IoU
threshold 0.5). Two Triton kernels compute an IoU mask and then a keep mask; the host code then
returns `sorted_indices[keep_mask]`: boolean indexing by a mask a kernel computed, so the
OUTPUT's length is the number of kept boxes, read from tensor values at run time (the scores
order the boxes through `torch.sort(stable=True)` on the host as well, lowered to ONNX TopK
with a run-time NaN check). Compiles and matches the reference on the CPU (2026-12-05)."""

import torch
from conch.ops.vision.nms import nms

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

IOU = 0.5


class Model(torch.nn.Module):
    def forward(self, boxes, scores):
        return nms(boxes, scores, IOU)


def _make_inputs(boxes=16, seed=0, spread=24.0):
    """Boxes of side 4..12 with corners in [0, spread): a smaller spread overlaps more."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(boxes, 2, generator=g) * spread
    wh = 4 + torch.rand(boxes, 2, generator=g) * 8
    return (torch.cat([xy, xy + wh], 1).contiguous(), torch.rand(boxes, generator=g))


def reference(boxes, scores):
    order = torch.sort(scores, stable=True, descending=True).indices.tolist()
    area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    keep, dropped = [], set()
    for a, i in enumerate(order):
        if i in dropped:
            continue
        keep.append(i)
        for j in order[a + 1:]:
            lt = torch.maximum(boxes[i, :2], boxes[j, :2])
            rb = torch.minimum(boxes[i, 2:], boxes[j, 2:])
            inter = (rb - lt).clamp(min=0).prod()
            if inter / (area[i] + area[j] - inter) > IOU:
                dropped.add(j)
    return torch.tensor(keep, dtype=torch.long)


model = Model()
example_inputs = _make_inputs()
extra_examples = [_make_inputs(seed=1, spread=4.0), _make_inputs(seed=2, spread=200.0)]
_boxes = torch.export.Dim("boxes", min=2, max=1024)
dynamic_shapes = {"boxes": {0: _boxes}, "scores": {0: _boxes}}
tolerance = (0.0, 0.0)
