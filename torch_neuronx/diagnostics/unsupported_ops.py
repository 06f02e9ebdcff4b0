"""Ops TorchNeuron is documented or known to run on the CPU instead of a NeuronCore.

Every entry names its source. Keep it small and honest: an op goes in only with evidence, and
leaves when TorchNeuron supports it. Names are ``aten::op`` without overload or in-place
underscore (``aten::normal`` covers ``normal_``).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from torch_neuronx.diagnostics.cost_model import base_name

# TorchNeuron's own source (v0.1.0; a public mirror: github.com/parmoham-aws/test-repo-parmoham@98154b8).
EXPLICIT = ("TorchNeuron 0.1.0 source, python_ops/cpu_fallback_registrations.py: registered to run on the CPU "
            "(\"ops not supported on Neuron\")")
NO_KERNEL = ("TorchNeuron 0.1.0 source: no neuron kernel is registered, so its boxed CPU fallback runs it "
             "(inferred from the registrations; not checked on hardware)")
NO_RNG = ("TorchNeuron 0.1.0 source: no random-number kernels; dropout masks are made on the CPU "
          "(python_ops/torch_mlir/ops/dropout.py); the spec notes randn(device='neuron') uses the CPU RNG")
COMPILER_DOC = "also documented for neuronx-cc (torch_neuronx.trace docs: aten::sort is not supported)"


@dataclass(frozen=True)
class UnsupportedOp:
    op: str
    reason: str
    source: str


def _entries(names: str, reason: str, source: str) -> list[UnsupportedOp]:
    return [UnsupportedOp(f"aten::{name}", reason, source) for name in names.split()]


TABLE: dict[str, UnsupportedOp] = {e.op: e for e in (
    _entries("linalg_qr _linalg_svd _linalg_eigh linalg_cholesky_ex linalg_inv_ex linalg_lu_factor_ex "
             "linalg_ldl_factor_ex _linalg_slogdet _linalg_det cholesky_inverse triangular_solve",
             "linear algebra runs on the CPU", EXPLICIT)
    + _entries("normal uniform bernoulli random exponential multinomial randperm native_dropout",
               "random numbers are drawn on the CPU", NO_RNG)
    + _entries("_fft_r2c _fft_c2r _fft_c2c", "FFTs (complex results) run on the CPU", NO_KERNEL)
    + _entries("sort", "sorting runs on the CPU", f"{NO_KERNEL}; {COMPILER_DOC}")
    + _entries("cumprod logcumsumexp _unique2 unique_consecutive bincount searchsorted bucketize median kthvalue "
               "mode", "runs on the CPU", NO_KERNEL)
    + _entries("max_pool2d_with_indices avg_pool2d _adaptive_avg_pool2d upsample_bilinear2d upsample_nearest2d "
               "grid_sampler_2d _embedding_bag scatter_reduce index_reduce roll linalg_cross _cdist_forward",
               "runs on the CPU", NO_KERNEL)
    + _entries("lgamma digamma atan2 sinh asinh", "runs on the CPU", NO_KERNEL)
)}


@functools.lru_cache(maxsize=None)
def lookup(op: str) -> UnsupportedOp | None:
    """The table's entry for an op name ('aten::normal_', 'aten::normal_.default', 'aten::normal'), or None."""
    return TABLE.get(f"{op.partition('::')[0]}::{base_name(op)}")
