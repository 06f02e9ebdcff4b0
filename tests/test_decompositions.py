"""The faithful compiler's decompositions (TorchNeuron's compile table, mirrored, and the stand-ins for
its private pipeline): each written from the operator's mathematics, each checked here against the
op itself on CPU, case by case; the docs' list of TorchNeuron's entries is covered."""
import math
import os
import re

import pytest
import torch

from torch_neuronx.neuron_dynamo_backend.faithful import decompositions as table

aten = torch.ops.aten
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


def conv_case(transposed, spatial, groups=1, stride=2, padding=1, dilation=1, output_padding=0):
    """convolution_backward's arguments for a convolution with these settings, and its output mask."""
    channels, outputs, size = 4, 6, [7, 6, 5][:spatial]
    x = r(2, channels, *size, seed=1)
    w = r(*((channels, outputs // groups) if transposed else (outputs, channels // groups)), *[3] * spatial, seed=2)
    y = aten.convolution(x, w, None, [stride] * spatial, [padding] * spatial, [dilation] * spatial, transposed,
                         [output_padding] * spatial, groups)
    return ((r(*y.shape, seed=3), x, w, [y.shape[1]], [stride] * spatial, [padding] * spatial,
             [dilation] * spatial, transposed, [output_padding] * spatial, groups, [True, True, True]), {})


def sdpa_case(heads=4, kv_heads=4, causal=False, bias=None):
    q, k, v = r(2, heads, 5, 8, seed=1), r(2, kv_heads, 7, 8, seed=2), r(2, kv_heads, 7, 8, seed=3)
    return (q, k, v, bias, 0.0, causal), {"scale": 0.3}


SEGMENT_REDUCTIONS = ("sum", "mean", "max", "min", "prod")
# lengths and the same segments as offsets: empty segments, and (offsets) positions in none
SEGMENT_BOUNDS = ({"lengths": idx(3, 0, 2, 1, 4)}, {"offsets": idx(0, 3, 3, 5, 6, 10)}, {"offsets": idx(1, 3, 3, 8)})


def segment_data(dtype):
    """Ten values with ties, zeros and a NaN (in the third segment)."""
    data = torch.round(r(10, dtype=dtype) * 1.5)
    data[4] = math.nan
    return data


def segment_reduce_forwards():
    """Segment reductions whose backward is captured: lengths and offsets, every reduction, with and
    without ``initial``, float32 and float64; the data rounded (ties, zeros), one case with a NaN."""
    forwards = []
    for dtype in (torch.float32, torch.float64):
        for reduce in SEGMENT_REDUCTIONS:
            for initial in (None, 2.0):
                for bounds in SEGMENT_BOUNDS:
                    forwards.append(lambda x, reduce=reduce, initial=initial, bounds=bounds, dtype=dtype: aten.segment_reduce(
                        torch.round(x.reshape(-1)[:10].to(dtype) * 1.5), reduce, initial=initial, **bounds))
            forwards.append(lambda x, reduce=reduce, dtype=dtype: aten.segment_reduce(
                x.reshape(-1)[:10].to(dtype) * torch.tensor([1.0] * 4 + [math.nan] + [1.0] * 5, dtype=dtype), reduce,
                lengths=idx(3, 0, 2, 1, 4)))
            forwards.append(lambda x, reduce=reduce, dtype=dtype: aten.segment_reduce(
                torch.round(x.reshape(2, -1)[:, :7].to(dtype)), reduce, lengths=idx(3, 4, 0, 7).view(2, 2), axis=1))
            forwards.append(lambda x, reduce=reduce, dtype=dtype: aten.segment_reduce(
                x.reshape(6, 5, -1)[..., :2].to(dtype), reduce, offsets=idx(1, 3, 3, 6)))
    return forwards


BAG_INDICES = idx(1, 2, 4, 5, 4, 3, 2, 9, 0, 0)
BAG_OFFSETS = (idx(0, 2, 2, 5), idx(0, 2, 2, 5, 7, 10))  # an empty bag; the second with its closing offset


def embedding_bag_forwards():
    """embedding_bag calls whose backward (the weight's, and the per-sample weights') is captured."""
    forwards = []
    for dtype in (torch.float32, torch.float64):
        for mode in ("sum", "mean", "max"):
            for padding_idx in (None, 4):
                for last, offsets in enumerate(BAG_OFFSETS):
                    forwards.append(lambda x, mode=mode, padding_idx=padding_idx, last=last, offsets=offsets, dtype=dtype:
                                    torch.nn.functional.embedding_bag(
                                        BAG_INDICES, x.reshape(-1)[:40].view(10, 4).to(dtype), offsets, mode=mode,
                                        padding_idx=padding_idx, include_last_offset=bool(last)))
        # per-sample weights (sum only); scale_grad_by_freq where every row occurs equally often (see
        # test_embedding_bag_scales_by_each_rows_frequency for the others)
        forwards.append(lambda x, dtype=dtype: torch.nn.functional.embedding_bag(
            BAG_INDICES, x.reshape(-1)[:40].view(10, 4).to(dtype), BAG_OFFSETS[0], mode="sum", padding_idx=2,
            per_sample_weights=x.reshape(-1)[40:50].to(dtype)))
        for mode in ("sum", "mean"):
            forwards.append(lambda x, mode=mode, dtype=dtype: torch.nn.functional.embedding_bag(
                idx(0, 1, 1, 3, 2, 3, 0, 2), x.reshape(-1)[:40].view(10, 4).to(dtype), idx(0, 3, 3), mode=mode,
                scale_grad_by_freq=True))
    return forwards


# grid points on pixel centres and edges, half-pixel ties, the corners +-1 and beyond (padding)
GRID_LATTICE = torch.tensor([-1.5, -1.0, -0.75, -0.5, -0.2, 0.0, 0.25, 0.5, 1.0, 1.25])


def grid_cases(spatial, backward):
    """grid_sampler_{2,3}d (or its backward) over every mode it has (bicubic only in 2-D), padding
    zeros/border/reflection, align_corners, float32 and float64; random grid points reaching past the
    border, and points on the lattice above."""
    cases = []
    modes = (0, 1, 2) if spatial == 2 else (0, 1)
    for dtype in (torch.float32, torch.float64):
        x = r(2, 3, *[4, 5, 6][-spatial:], dtype=dtype)
        grids = [(torch.rand(2, *[3, 4, 2][-spatial:], spatial, generator=torch.Generator().manual_seed(1),
                             dtype=dtype) * 2.8 - 1.4),
                 GRID_LATTICE.to(dtype)[torch.randint(0, 10, (2, *[3, 5, 4][-spatial:], spatial),
                                                      generator=torch.Generator().manual_seed(2))]]
        for grid in grids:
            for mode in modes:
                for padding in (0, 1, 2):
                    for align in (False, True):
                        if backward:
                            grad = r(2, 3, *grid.shape[1:-1], seed=3, dtype=dtype)
                            for mask in ([True, True], [False, True], [True, False]):
                                cases.append(((grad, x, grid, mode, padding, align, mask), {}))
                        else:
                            cases.append(((x, grid, mode, padding, align), {}))
    return cases


# Cases per op: (args, kwargs). Each op's result on CPU is the oracle.
CASES = {
    aten.as_strided.default: [((r(4, 5), [3, 2], [1, 5], 2), {}), ((r(12), [2, 2, 3], [6, 1, 2], None), {})],
    aten.as_strided_scatter.default: [((r(4, 5), r(3, 2, seed=1), [3, 2], [1, 5], 2), {})],
    aten.topk.default: [((r(9, 3), 4, 0), {}), ((r(3, 9), 2, 0, False), {}), ((r(6), 6, -1, False, True), {})],
    aten.argsort.default: [((r(3, 9), 1, True), {})],
    aten.argsort.stable: [((torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0]),), {"stable": True, "descending": False})],
    aten.scalar_tensor.default: [((2.5,), {}), ((3,), {"dtype": torch.int32})],
    aten.index_copy.default: [((r(5, 3), 0, idx(4, 0, 2), r(3, 3, seed=1)), {}),
                              ((r(2, 6, 3), 1, idx(5, 1), r(2, 2, 3, seed=1)), {})],
    aten.nonzero_static.default: [((torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]),), {"size": 5}),
                                  ((torch.tensor([[0.0, 1.0, 0.0], [2.0, 0.0, 3.0]]),), {"size": 2, "fill_value": 7}),
                                  ((torch.tensor([0, 4, 0, 5]),), {"size": 3})],
    aten.linalg_vector_norm.default: [((r(3, 4),), {}), ((r(3, 4), 1, [1], True), {}), ((r(3, 4), math.inf, [0]), {}),
                                      ((r(3, 4), -math.inf), {}), ((r(3, 4), 0), {}), ((r(3, 4), 3.5, [1]), {}),
                                      ((r(3, 4), 2, None, False), {"dtype": torch.float64})],
    aten.index_put.default: [((r(5, 3), [idx(4, 0, 2)], r(3, 3, seed=1)), {}),
                             ((r(5, 3), [idx(4, 0, 4)], r(3, 3, seed=1), True), {}),
                             ((r(4, 5, 3), [None, idx(-1, 2), idx(0, 1)], r(4, 2, seed=1)), {}),
                             ((r(4, 5), [idx(1, 3), idx(2, 4)], torch.tensor(9.0)), {})],
    aten.sigmoid_backward.default: [((r(3, 4), torch.sigmoid(r(3, 4, seed=1))), {})],
    aten.silu_backward.default: [((r(3, 4), r(3, 4, seed=1)), {})],
    aten.embedding_dense_backward.default: [((r(2, 3, 4), idx(1, 0, 5, 1, 2, 1).view(2, 3), 6, -1, False), {}),
                                            ((r(2, 3, 4), idx(1, 0, 5, 1, 2, 1).view(2, 3), 6, 1, True), {})],
    aten.linear_backward.default: [((r(2, 3, 4), r(2, 3, 5, seed=1), r(5, 4, seed=2), [True, True, True]), {})],
    aten._foreach_pow.Scalar: [(([r(3).abs(), r(2, 2, seed=1).abs()], 2.5), {})],
    aten.__rshift__.Scalar: [((torch.tensor([16, -5, 7, -64]), 2), {})],
    aten._grouped_mm.default: [((r(6, 8), r(3, 8, 4, seed=1), torch.tensor([2, 2, 6], dtype=torch.int32)), {}),
                               ((r(6, 8), r(8, 4, seed=1), torch.tensor([3, 8], dtype=torch.int32)), {}),
                               ((r(3, 5, 8), r(3, 8, 4, seed=1)), {})],
    aten.convolution_backward.default: [conv_case(False, 1), conv_case(False, 2, groups=2, dilation=2),
                                        conv_case(False, 3, stride=1, padding=0), conv_case(True, 1),
                                        conv_case(True, 2, groups=2, output_padding=1), conv_case(True, 3, stride=1)],
    aten.value_selecting_reduction_backward.default: [
        ((r(3, 5), 1, r(3, 7).max(1).indices[:, None].expand(3, 5) % 7, [3, 7], True), {}),
        ((r(3), 1, idx(0, 4, 2), [3, 5], False), {})],
    aten.histc.default: [((r(100),), {"bins": 7}), ((r(100), 5, -0.5, 0.5), {}),
                         ((torch.full((4,), 2.0), 4), {})],
    aten._scaled_dot_product_fused_attention_overrideable.default: [sdpa_case(), sdpa_case(4, 2, causal=True)],
    aten._scaled_dot_product_fused_attention_overrideable_backward.default: [sdpa_case(), sdpa_case(4, 2, True)],
    # the private pipeline's stand-ins
    aten.avg_pool2d.default: [((r(2, 3, 7, 6), [3, 2]), {}), ((r(2, 3, 7, 6), [3, 3], [2, 2], [1, 1], True, False), {}),
                              ((r(3, 7, 6), [2, 2], [2, 1], [1, 0], False, True, 3), {})],
    aten.avg_pool3d.default: [((r(2, 2, 5, 6, 4), [2, 3, 2], [2, 2, 1], [1, 1, 0], True, True), {})],
    aten.avg_pool2d_backward.default: "pool",
    aten.avg_pool3d_backward.default: "pool",
    aten._adaptive_avg_pool2d.default: [((r(2, 3, 7, 5), [3, 4]), {})],
    aten._adaptive_avg_pool3d.default: [((r(2, 3, 7, 5, 4), [3, 2, 3]), {})],
    aten._adaptive_avg_pool2d_backward.default: "pool",
    aten._adaptive_avg_pool3d_backward.default: "pool",
    aten.max_pool3d_with_indices_backward.default: "pool",
    aten.adaptive_max_pool2d_backward.default: "pool",
    aten.adaptive_max_pool3d_backward.default: "pool",
    aten.replication_pad1d_backward.default: "pool",
    aten.replication_pad2d_backward.default: "pool",
    aten.replication_pad3d_backward.default: "pool",
    aten.adaptive_max_pool2d.default: [((r(2, 3, 7, 5), [3, 2]), {}), ((r(3, 6, 4), [3, 4]), {})],
    aten.adaptive_max_pool3d.default: [((r(2, 3, 7, 5, 4), [3, 2, 3]), {})],
    aten._unsafe_masked_index.default: [((r(4, 5), torch.tensor([True, False, True]).view(3, 1),
                                          [idx(3, 9, -1).view(3, 1), idx(0, 4)], 0.5), {})],
    aten.empty.memory_format: "not compared: its values are undefined",
    aten.new_empty.default: "not compared: its values are undefined",
    aten.empty_strided.default: "not compared: its values are undefined",
    aten._pad_circular.default: [((r(2, 3, 5), [2, 1]), {}), ((r(2, 3, 5, 4), [1, 2, -1, 3]), {}),
                                 ((r(1, 2, 3, 4, 5), [1, 1, 2, 0, 1, 2]), {})],
    aten.empty_permuted.default: "not compared: its values are undefined",
    aten.new_empty_strided.default: "not compared: its values are undefined",
    aten._efficientzerotensor.default: [(([2, 3],), {"dtype": torch.float32})],
    aten.scatter_reduce.two: [((r(4, 5, 3), 1, torch.randint(0, 5, (3, 4, 2), generator=torch.Generator().manual_seed(1)),
                                r(3, 4, 2, seed=2), reduce), {"include_self": include})
                               for reduce in ("sum", "prod", "mean", "amax", "amin") for include in (True, False)]
    + [((torch.tensor([[3, -1], [0, 7]]), 0, idx(1, 1, 0, 1).view(2, 2), torch.tensor([[5, -4], [2, 9]]), "amax"), {}),
       ((torch.tensor(2.0), 0, idx(0), torch.tensor(3.0), "mean"), {})],
    aten.index_reduce.default: [((r(4, 5, 3), 1, idx(4, 0, 4, 2), r(4, 4, 3, seed=1), reduce), {"include_self": include})
                                for reduce in ("prod", "mean", "amax", "amin") for include in (True, False)],
    aten.put.default: [((r(4, 5), idx(0, -1, 7, 7), r(4, seed=1)), {}), ((r(4, 5), idx(3, -1, 3), r(3, seed=1), True), {})],
    aten.masked_scatter_backward.default: "pool",
    aten.searchsorted.Tensor: [((torch.sort(r(3, 6))[0], r(3, 4, seed=1)), {}),
                               ((torch.sort(r(6))[0], r(2, 4, seed=1)), {"right": True, "out_int32": True}),
                               ((r(6), r(5, seed=1)), {"sorter": torch.sort(r(6))[1]}),
                               ((torch.tensor([1.0, 2.0, 2.0, 3.0]), torch.tensor([2.0, 0.5, 3.0])), {"side": "right"})],
    aten.searchsorted.Scalar: [((torch.sort(r(6))[0], 0.1), {})],
    aten.amax.default: [((torch.tensor(2.5), []), {})],
    aten.amin.default: [((torch.tensor(-2.5), [0], True), {})],
    aten.sum.dim_IntList: [((torch.tensor(1.5), [0]), {}), ((torch.tensor(3), None), {"dtype": torch.float32})],
    aten.argmax.default: [((torch.tensor(2.5),), {})],
    aten.argmin.default: [((torch.tensor(2.5), 0, True), {})],
    aten.scatter.src: [((torch.tensor(2.0, dtype=dtype), 0, torch.tensor(0), torch.tensor(5.0, dtype=dtype)), {})
                       for dtype in (torch.float32, torch.float64)]
    + [((torch.tensor(2.0), 0, torch.zeros(0, dtype=torch.int64), torch.tensor([5.0])), {}),
       ((torch.tensor(2.0), -1, idx(0), torch.tensor([5.0, 6.0])), {})],
    aten.kthvalue.default: [((r(5, 7), 3, 1), {}), ((r(5, 7), 5, 0, True), {})],
    aten.median.default: [((r(5, 7),), {}), ((torch.tensor([1.0, float("nan"), 0.5]),), {})],
    aten.median.dim: [((r(5, 7), 1), {}), ((r(6, 4), 0, True), {}),
                      ((torch.tensor([[1.0, float("nan"), 0.5], [2.0, 3.0, 1.0]]), 1), {})],
    aten.nanmedian.default: [((torch.tensor([1.0, float("nan"), 0.5, 4.0]),), {})],
    aten.nanmedian.dim: [((torch.tensor([[1.0, float("nan"), 0.5, 4.0], [2.0, 3.0, 1.0, 0.0]]), 1), {})],
    aten._cdist_forward.default: [((r(2, 3, 4), r(2, 5, 4, seed=1), p, None), {}) for p in (0.0, 1.0, 2.0, 3.0, math.inf)],
    aten._pdist_forward.default: [((r(5, 3), p), {}) for p in (0.0, 1.0, 2.0, 0.5, math.inf)],
    aten._pdist_backward.default: "pool",
    aten._cdist_backward.default: "pool",
    aten.cummax.default: [((r(3, 7), 1), {}), ((torch.tensor([[3, 1, 3, 5, 5, 2]]), 1), {}),
                          ((torch.tensor([[1.0, float("nan"), 2.0], [0.0, 0.0, -1.0]]), 0), {}), ((torch.tensor(2.0), 0), {})],
    aten.cummin.default: [((r(3, 7), 0), {}), ((torch.tensor([[3, 1, 3, 1, 5, 0]]), -1), {}),
                          ((torch.tensor([[1.0, float("nan"), 2.0], [0.0, 0.0, -1.0]]), 1), {})],
    torch.ops.prims.prod.default: [((r(3, 4, 5), [0, 2]), {}), ((r(3, 4), [1]), {}),
                                    ((r(2, 3), [0, 1]), {})],
    aten.trace.default: [((r(4, 4),), {}), ((r(3, 5),), {}), ((torch.arange(12).view(4, 3),), {})],
    aten.angle.default: [((torch.tensor([-1.0, 0.0, 2.0, float("nan"), -float("inf")]),), {}),
                         ((torch.tensor([-3, 0, 4]),), {})],
    aten.hypot.default: [((r(5) * 1e30, r(5, seed=1) * 1e30), {}),
                         ((torch.tensor([0.0, float("inf"), float("nan"), 3.0]), torch.tensor([0.0, 1.0, 1.0, -4.0])), {})],
    aten.diagonal_scatter.default: [((r(3, 4, 5), r(4, 2, seed=1), 1, 2, 0), {}), ((r(4, 4), r(3, seed=1), -1), {})],
    aten.diagonal_backward.default: "pool",
    aten.diagonal.default: [((r(3, 4, 5), offset, d1, d2), {})
                            for offset, d1, d2 in ((0, 0, 1), (1, 0, 1), (-2, 1, 2), (3, 2, 0), (-1, -1, 0), (7, 0, 1))],
    aten._upsample_bilinear2d_aa.default: [((r(2, 3, 10, 20), size, False, *scales), {})
                                           for size, scales in (((3, 3), ()), ((25, 7), ()), ((5, 10), (0.5, 0.5)))],
    aten._upsample_bilinear2d_aa_backward.default: "pool",
    aten.frexp.Tensor: [((torch.cat([r(50) * 1e10, r(50, seed=1) * 1e-30,
                                     torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1.0, 0.5, -4.0,
                                                   3.4e38])]),), {})],
    aten.mode.default: [((torch.round(r(5, 7, dtype=dtype) * 1.5), dim, keepdim), {})
                        for dtype in (torch.float32, torch.float64) for dim, keepdim in ((1, False), (0, True), (-1, True))]
    + [((torch.tensor([[3.0, 1.0, 3.0, 1.0, 2.0], [5.0, 5.0, 4.0, 4.0, 4.0], [2.0, 2.0, 2.0, 2.0, 2.0],
                       [1.0, 1.0, 2.0, math.nan, math.nan], [math.nan] * 5, [0.0, -0.0, 1.0, 7.0, 7.0]], dtype=dtype),),
        {}) for dtype in (torch.float32, torch.float64)]
    + [((torch.tensor([[1, 2, 2, 1, 3, 1, 2], [0, -4, -4, 9, 9, 9, -4]]), 1), {}), ((torch.tensor(3.0),), {}),
       ((torch.round(r(4, 16, 3) * 1.5), 1), {})],
    aten.histogram.bin_ct: [((r(100, dtype=dtype), 7), {}) for dtype in (torch.float32, torch.float64)]
    + [((r(4, 25), 5), {"range": [-0.5, 0.5]}), ((r(60, dtype=torch.float64), 6), {"range": [-1.0, 2.0], "density": True}),
       ((r(30), 4), {"weight": r(30, seed=1).abs(), "density": True}), ((r(30), 4), {"weight": r(30, seed=1)}),
       ((torch.tensor(2.0), 1), {}), ((torch.full((4,), 2.0), 3), {}), ((torch.zeros(0), 3), {}),
       ((torch.tensor([1.0, 2.0, 3.0, 4.0]), 3), {"range": [2.0, 3.0]}), ((torch.tensor([1.0, 2.0]), 2), {"range": [1.0, 1.0]}),
       ((torch.tensor([0.0, 1.0, math.nan, math.inf, -math.inf, 0.5]), 2), {"range": [0.0, 1.0]})],
    aten.histogram.bins_tensor: [((r(50, dtype=dtype), torch.tensor([-1.0, -0.2, 0.0, 0.7, 2.0], dtype=dtype)), {})
                                 for dtype in (torch.float32, torch.float64)]
    + [((torch.tensor([1.0, 2.0, 3.0, 4.0, math.nan, math.inf]), torch.tensor([1.0, 2.5, 4.0])), {}),
       ((r(3, 10), torch.tensor([-1.0, 0.0, 0.5, 3.0])), {"weight": r(3, 10, seed=1), "density": True}),
       ((torch.tensor([1.0, 2.0, 3.0, 4.0]), torch.tensor([1.0, 2.5, 4.0])), {"density": True})],
    aten._histogramdd_bin_edges.default: [((r(20, 3, dtype=dtype), [2, 3, 4]), {}) for dtype in (torch.float32, torch.float64)]
    + [((r(4, 5, 2), [3, 1]), {"range": [-1.0, 1.0, 0.0, 2.0]}), ((torch.tensor([[2.0, 1.0]]), [2, 2]), {}),
       ((torch.zeros(0, 2), [2, 3]), {})],
    aten._histogramdd_from_bin_cts.default: [((r(30, 3, dtype=dtype), [2, 3, 4]), {}) for dtype in (torch.float32, torch.float64)]
    + [((r(4, 5, 2), [3, 2]), {"range": [-1.0, 1.0, 0.0, 2.0], "weight": r(4, 5, seed=1), "density": True}),
       ((r(40, 2), [4, 3]), {"density": True}), ((torch.tensor([[2.0, 1.0], [3.0, 5.0], [math.nan, 1.0]]), [2, 2]),
                                                 {"range": [0.0, 4.0, 0.0, 4.0]}), ((torch.zeros(0, 2), [2, 2]), {})],
    aten._histogramdd_from_bin_tensors.default: [
        ((r(30, 2, dtype=dtype), [torch.tensor([-1.0, 0.0, 0.3, 2.0], dtype=dtype), torch.tensor([-2.0, 0.1, 1.0], dtype=dtype)]),
         {}) for dtype in (torch.float32, torch.float64)]
    + [((r(5, 6, 2), [torch.tensor([-1.0, 0.0, 2.0]), torch.tensor([-2.0, 1.0])]), {"weight": r(5, 6, seed=1), "density": True})],
    aten.segment_reduce.default: [((segment_data(dtype), reduce), {**bounds, "initial": initial})
                                  for dtype in (torch.float32, torch.float64) for reduce in SEGMENT_REDUCTIONS
                                  for initial in (None, 1.5) for bounds in SEGMENT_BOUNDS]
    + [((segment_data(torch.float32).view(2, 5), reduce), {**bounds, "axis": 1, "initial": initial})
       for reduce in SEGMENT_REDUCTIONS for initial in (None, -2.0)
       for bounds in ({"lengths": idx(2, 0, 3, 1, 0, 4).view(2, 3)}, {"offsets": idx(0, 2, 2, 5, 0, 0, 4, 5).view(2, 4)})]
    + [((r(6, 3, 2, dtype=dtype), reduce), {"offsets": idx(1, 3, 3, 6)}) for dtype in (torch.float32, torch.float64)
       for reduce in SEGMENT_REDUCTIONS]
    + [((r(2, 7, 3), reduce), {"lengths": idx(3, 4, 0, 7).view(2, 2), "axis": 1}) for reduce in SEGMENT_REDUCTIONS],
    aten._segment_reduce_backward.default: "pool",
    aten._embedding_bag.default: "test_embedding_bag_equals_the_op_on_cpu",
    aten._embedding_bag_forward_only.default: "test_embedding_bag_equals_the_op_on_cpu",
    aten._embedding_bag_backward.default: "pool",
    aten._embedding_bag_per_sample_weights_backward.default: "pool",
    aten.embedding_renorm.default: [((r(10, 4, dtype=dtype) * 2, BAG_INDICES.view(2, 5), 1.5, p), {})
                                    for dtype in (torch.float32, torch.float64) for p in (2.0, 1.0, 3.0)]
    + [((r(10, 4), idx(3, 3, 7), 100.0, 2.0), {})],
    aten.grid_sampler_2d.default: grid_cases(2, backward=False),
    aten.grid_sampler_2d_backward.default: grid_cases(2, backward=True),
    aten.grid_sampler_3d.default: grid_cases(3, backward=False),
    aten.grid_sampler_3d_backward.default: grid_cases(3, backward=True),
}

# Backward ops checked against autograd of their forward op (what produces them in a graph).
FORWARDS = {
    aten.avg_pool2d_backward.default: [lambda x: torch.nn.functional.avg_pool2d(x[..., 0], 3, 2, 1, True, False),
                                       lambda x: torch.nn.functional.avg_pool2d(x[..., 0], [2, 3], [1, 2], [1, 0],
                                                                                False, True, 5),
                                       lambda x: torch.nn.functional.avg_pool1d(x[..., 0, 0], 3, 2, 1, True)],
    aten.avg_pool3d_backward.default: [lambda x: torch.nn.functional.avg_pool3d(x, 2, 2, 1, True, True)],
    aten._adaptive_avg_pool2d_backward.default: [lambda x: torch.nn.functional.adaptive_avg_pool2d(x[..., 0], (3, 4))],
    aten._adaptive_avg_pool3d_backward.default: [lambda x: torch.nn.functional.adaptive_avg_pool3d(x, (2, 3, 2))],
    aten.max_pool3d_with_indices_backward.default: [lambda x: torch.nn.functional.max_pool3d(x, 2, 2, 1)],
    aten.adaptive_max_pool2d_backward.default: [lambda x: torch.nn.functional.adaptive_max_pool2d(x[..., 0], (3, 2))],
    aten.adaptive_max_pool3d_backward.default: [lambda x: torch.nn.functional.adaptive_max_pool3d(x, (3, 2, 2))],
    aten.replication_pad1d_backward.default: [lambda x: torch.nn.functional.pad(x[..., 0, 0], [2, 3], "replicate")],
    aten.replication_pad2d_backward.default: [lambda x: torch.nn.functional.pad(x[..., 0], [2, 3, 1, 0], "replicate")],
    aten.replication_pad3d_backward.default: [lambda x: torch.nn.functional.pad(x, [1, 1, 2, 0, 0, 3], "replicate")],
    aten.masked_scatter_backward.default: [lambda x: torch.zeros(3, 4).masked_scatter(r(3, 4) > 0, x.reshape(-1)[:20])],
    aten._cdist_backward.default: [lambda x: torch.cdist(x.reshape(2, 7, -1), r(2, 4, 90, seed=5), 2.0),
                                   lambda x: torch.cdist(x.reshape(2, 7, -1), r(2, 4, 90, seed=5), 1.5)],
    aten._pdist_backward.default: [lambda x: torch.nn.functional.pdist(x.reshape(6, -1), 2),
                                   lambda x: torch.nn.functional.pdist(x.reshape(10, -1), 1.5)],
    aten.diagonal_backward.default: [lambda x: x.diagonal(1, 0, 2) * 1],
    aten._upsample_bilinear2d_aa_backward.default: [
        lambda x: torch.nn.functional.interpolate(x[..., 0], size=(3, 4), mode="bilinear", antialias=True)],
    aten._segment_reduce_backward.default: segment_reduce_forwards(),
    aten._embedding_bag_backward.default: embedding_bag_forwards(),
    aten._embedding_bag_per_sample_weights_backward.default: embedding_bag_forwards()[12::15],
}


def _linear_backward_by_autograd(x, grad, weight, mask):
    """linear_backward has no CPU kernel: autograd of F.linear is its oracle."""
    x, weight = x.clone().requires_grad_(), weight.clone().requires_grad_()
    bias = torch.zeros(weight.shape[0], requires_grad=True)
    return torch.autograd.grad(torch.nn.functional.linear(x, weight, bias), (x, weight, bias), grad)


ORACLES = {aten.linear_backward.default: _linear_backward_by_autograd,
           aten._efficientzerotensor.default: lambda size, dtype: torch.zeros(size, dtype=dtype)}
OWN = {**table.TORCHNEURON_DECOMPOSITIONS, **table.PRIVATE_PIPELINE_OWN}


def _close(got, expected):
    if isinstance(expected, (list, tuple)):
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            _close(g, e)
    elif isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape and got.dtype == expected.dtype, (got.shape, expected.shape)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5, equal_nan=True)
    elif expected is not None or got is not None:
        assert got == expected


def test_every_own_decomposition_has_cases():
    assert set(OWN) == set(CASES)


@pytest.mark.parametrize("op", [op for op, cases in CASES.items() if isinstance(cases, list)], ids=str)
def test_own_decomposition_equals_the_op_on_cpu(op):
    for args, kwargs in CASES[op]:
        if op is aten._scaled_dot_product_fused_attention_overrideable.default:
            expected = _math_attention(*args, **kwargs)  # CPU has no kernel for PrivateUse1's fused op
            got = OWN[op](*args, **kwargs)
            _close(got[0], expected[0])
            _close(got[1], expected[1])
            continue
        if op is aten._scaled_dot_product_fused_attention_overrideable_backward.default:
            _check_attention_backward(*args, **kwargs)
            continue
        got = OWN[op](*args, **kwargs)
        assert got is not NotImplemented, (op, args)
        _close(got, ORACLES.get(op, op)(*args, **kwargs))


def _math_attention(q, k, v, bias, dropout, causal, scale):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.MATH]):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, bias, dropout, causal, scale=scale,
                                                               enable_gqa=True)
    kf = k.repeat_interleave(q.shape[1] // k.shape[1], 1)
    scores = q @ kf.transpose(-2, -1) * scale
    if causal:
        scores = scores.masked_fill(~torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril(), float("-inf"))
    return out, torch.logsumexp(scores, -1)


def _check_attention_backward(q, k, v, bias, dropout, causal, scale):
    q, k, v = (t.clone().requires_grad_() for t in (q, k, v))
    out, lse = _math_attention(q, k, v, bias, dropout, causal, scale)
    grad = r(*out.shape, seed=9)
    expected = torch.autograd.grad(out, (q, k, v), grad)
    forward = OWN[aten._scaled_dot_product_fused_attention_overrideable.default]
    saved = forward(q.detach(), k.detach(), v.detach(), bias, dropout, causal, scale=scale)
    got = OWN[aten._scaled_dot_product_fused_attention_overrideable_backward.default](
        grad, q.detach(), k.detach(), v.detach(), bias, [True, True, True, False], saved[0], saved[1], saved[2],
        saved[3], saved[4], saved[5], dropout, causal, saved[6], saved[7], scale=scale)
    _close(got[:3], expected)
    assert got[3] is None


@pytest.mark.parametrize("op", list(FORWARDS), ids=str)
def test_own_backward_equals_autograd_of_its_forward(op):
    """The backward op is captured as autograd calls it, then replayed through the decomposition."""
    for forward in FORWARDS[op]:
        x = r(2, 3, 7, 6, 5).requires_grad_()
        calls = []

        class Capture(torch.utils._python_dispatch.TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func is op:
                    calls.append((args, kwargs or {}))
                return func(*args, **(kwargs or {}))

        out = forward(x)
        out = out[0] if isinstance(out, tuple) else out
        with Capture():
            torch.autograd.grad(out, x, r(*out.shape, seed=4))  # records the call of the backward op
        assert len(calls) == 1, f"{op} was not called by the backward"
        args, kwargs = calls[0]
        got = OWN[op](*args, **kwargs)
        _close(got, op(*args, **kwargs))


def test_topk_leaves_the_form_torch_mlir_lowers_to_the_op():
    assert table.TORCHNEURON_DECOMPOSITIONS[aten.topk.default](r(3, 9), 4) is NotImplemented


def test_stock_names_resolve_to_torchs_decompositions():
    from torch._decomp import decomposition_table

    # TorchNeuron also names two ops torch's table does not hold: linear_backward (its own entry
    # serves) and index_select_backward (a composite op: it decomposes by itself when traced).
    assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::index_select_backward", "CompositeImplicitAutograd")
    names = [n for n in (*table.STOCK_DECOMPOSITIONS, *table.PRIVATE_PIPELINE_STAND_INS)
             if n not in ("linear_backward", "index_select_backward")]
    for op in table._overloads(names):
        overloads = [getattr(op, o) for o in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) else [op]
        assert any(o in decomposition_table for o in overloads), f"torch has no decomposition for {op}"


def test_the_docs_list_torchneurons_table_and_each_entry_is_covered():
    """docs/compiled-coverage.md lists TorchNeuron's table at the commit it was read from; each entry
    is in ours (its stock names by name, its own entries by op)."""
    text = open(os.path.join(ROOT, "docs", "compiled-coverage.md"), encoding="utf-8").read()
    assert table.TORCHNEURON_COMMIT in text
    section = text.split("## TorchNeuron's compile decomposition table", 1)[1].split("\n## ", 1)[0]
    stock = re.findall(r"^\| stock \| `aten\.([\w.]+)` \|", section, re.M)
    own = re.findall(r"^\| own \| `aten\.([\w.]+)` \|", section, re.M)
    assert stock == list(table.STOCK_DECOMPOSITIONS)
    ours = {f"{op._schema.name.split('::')[1]}.{op._overloadname}" for op in table.TORCHNEURON_DECOMPOSITIONS}
    assert own and {name if "." in name else f"{name}.default" for name in own} == ours
    decomposed = table.decomposition_table()
    for op in table._overloads([n for n in table.STOCK_DECOMPOSITIONS if n != "index_select_backward"]):
        overloads = [getattr(op, o) for o in op.overloads()] if isinstance(op, torch._ops.OpOverloadPacket) else [op]
        assert any(o in decomposed for o in overloads), op
    assert all(decomposed[op] is fn for op, fn in table.TORCHNEURON_DECOMPOSITIONS.items())


def test_mode_of_a_long_slice_gives_the_value_and_a_position_of_it():
    """Past 16 elements CPU's sort is not stable, so which position of the mode it gives is not
    defined: the value must equal CPU's, and the position must hold it."""
    for dtype in (torch.float32, torch.float64):
        x = torch.randint(0, 4, (50, 40), generator=torch.Generator().manual_seed(0)).to(dtype)
        values, indices = table.PRIVATE_PIPELINE_OWN[aten.mode.default](x, 1)
        expected = torch.mode(x, 1)
        assert torch.equal(values, expected.values)
        assert torch.equal(x.gather(1, indices[:, None])[:, 0], values)


def test_embedding_bag_equals_the_op_on_cpu():
    """The bags (output 0), and what the backward reads: each bag's size for mean and max, the rows
    chosen for max. (Each position's bag, output 1, CPU leaves empty for some sums; ours fills it.)"""
    nan = math.nan
    weights = [r(10, 4, dtype=dtype) for dtype in (torch.float32, torch.float64)]
    weights.append(torch.tensor([[1.0, 5.0], [nan, 2.0], [3.0, 3.0], [3.0, nan], [0.0, 7.0]] * 2))  # ties, NaN
    for op in (aten._embedding_bag.default, aten._embedding_bag_forward_only.default):
        for weight in weights:
            for mode in (0, 1, 2):
                for padding_idx in (-1, 4, 0):
                    for last, offsets in enumerate(BAG_OFFSETS):
                        for per_sample in ((None, r(10, seed=3, dtype=weight.dtype)) if mode == 0 else (None,)):
                            args = (weight, BAG_INDICES, offsets, False, mode, False, per_sample, bool(last), padding_idx)
                            got, expected = OWN[op](*args), op(*args)
                            _close(got[0], expected[0])
                            if mode:
                                _close(got[2], expected[2])
                            if mode == 2:
                                _close(got[3], expected[3])


def test_embedding_bag_scales_by_each_rows_frequency():
    """scale_grad_by_freq: each row's gradient divided by how often it occurs, as embedding's own
    backward on CPU does. (CPU's embedding_bag kernel divides by the count of the row at the position
    of this row's rank among the distinct rows in the sorted indices, which agrees only where every
    row occurs equally often: here rows 2, 5, 7 occur 3, 2 and 1 times.)"""
    weight = r(8, 3).requires_grad_()
    indices, offsets = idx(5, 2, 5, 7, 2, 2), idx(0, 4)
    grad = r(2, 3, seed=1)
    bag = torch.tensor([0, 0, 0, 0, 1, 1])
    rows = torch.nn.functional.embedding(indices, weight, scale_grad_by_freq=True)
    expected = torch.autograd.grad(torch.zeros(2, 3).index_add(0, bag, rows), weight, grad)[0]
    got = OWN[aten._embedding_bag_backward.default](grad, indices, offsets, bag, torch.zeros(2, dtype=torch.int64),
                                                    torch.zeros(2, dtype=torch.int64), 8, True, 0, False, None, -1)
    _close(got, expected)
