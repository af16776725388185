"""conch-triton-kernels: `conch.ops.vision.bev_pool.bev_pool` (BEVFusion's "quick cumsum": camera
features of points sorted by voxel are summed per interval and written to a [batch, z, x, y, c]
BEV grid; scalar kernel parameters annotated `tl.int32`; META-dependent grid). Batch and grid
size are the model's constants; the point and interval counts vary."""

import torch
from conch.ops.vision.bev_pool import bev_pool

library = "conch-triton-kernels"  # written against conch-triton-kernels 1.3
library_module = "conch"
library_env = {}

B, GZ, GX, GY, C = 2, 1, 16, 16, 32


class Model(torch.nn.Module):
    def forward(self, feats, geom, interval_starts, interval_lengths):
        return bev_pool(feats, geom, interval_starts, interval_lengths, B, GZ, GX, GY)


def _make_inputs(points=64):
    g = torch.Generator().manual_seed(0)
    geom = torch.stack((torch.randint(0, GX, (points,), generator=g),
                        torch.randint(0, GY, (points,), generator=g),
                        torch.randint(0, GZ, (points,), generator=g),
                        torch.randint(0, B, (points,), generator=g)), dim=1)
    rank = ((geom[:, 3] * GZ + geom[:, 2]) * GX + geom[:, 0]) * GY + geom[:, 1]
    order = torch.argsort(rank, stable=True)
    geom, rank = geom[order], rank[order]
    starts = torch.nonzero(torch.cat((torch.tensor([True]), rank[1:] != rank[:-1]))).flatten()
    lengths = torch.diff(torch.cat((starts, torch.tensor([points]))))
    feats = torch.randn(points, C, generator=g)
    return (feats, geom.int().contiguous(), starts.int(), lengths.int())


def reference(feats, geom, interval_starts, interval_lengths):
    out = torch.zeros(B, GZ, GX, GY, C)
    g = geom.long()
    out.index_put_((g[:, 3], g[:, 2], g[:, 0], g[:, 1]), feats, accumulate=True)
    return out


model = Model()
example_inputs = _make_inputs()
_p = torch.export.Dim("points", min=2, max=8192)
_i = torch.export.Dim("intervals", min=2, max=8192)
dynamic_shapes = {"feats": {0: _p}, "geom": {0: _p}, "interval_starts": {0: _i},
                  "interval_lengths": {0: _i}}
tolerance = (1e-5, 1e-5)
