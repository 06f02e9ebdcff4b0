"""Ops TorchNeuron is documented or known to run on the CPU (the host) instead of a NeuronCore.

The readiness report's cpu-fallback findings and Trainium's eager semantics
(:mod:`.trainium_semantics`: these ops keep CPU's arithmetic) both read this table.

Every entry names its sources (``SOURCES``: what each is and where to read it; the report lists
them as footnotes). Keep it small and honest: an op goes in only with evidence, and leaves when
TorchNeuron supports it. Names are ``aten::op`` without overload or in-place underscore
(``aten::normal`` covers ``normal_``). :func:`.op_classes.lookup` finds an op's entry.
"""
from __future__ import annotations

from dataclasses import dataclass


# TorchNeuron's own source, v0.1.0, read in a public mirror of it.
_MIRROR = "https://github.com/parmoham-aws/test-repo-parmoham/blob/67d8dc4a52b14ff2d6e5023ba8487b41271e982e/"


@dataclass(frozen=True)
class Source:
    name: str
    url: str


SOURCES = {
    "fallback-registrations": Source(
        "TorchNeuron 0.1.0 source, torch_neuronx/python_ops/cpu_fallback_registrations.py: these linear-algebra "
        "ops are registered to run on the CPU (\"ops not supported on Neuron\")",
        _MIRROR + "torch_neuronx/python_ops/cpu_fallback_registrations.py"),
    "no-kernel": Source(
        "TorchNeuron 0.1.0 source, torch_neuronx/python_ops: no neuron kernel is registered for these ops, so "
        "its boxed CPU fallback runs them (read from the registrations, not checked on hardware)",
        _MIRROR + "torch_neuronx/python_ops"),
    "cpu-random": Source(
        "TorchNeuron 0.1.0 source: no random-number kernels; random tensors come from the CPU generator and "
        "dropout masks are drawn on the CPU, then copied (torch_neuronx/python_ops/torch_mlir/ops/dropout.py)",
        _MIRROR + "torch_neuronx/python_ops/torch_mlir/ops/dropout.py"),
    "supported-operators": Source(
        "AWS Neuron documentation, \"PyTorch Neuron (torch-neuronx) - Supported Operators\": aten::sort is not "
        "among the operators neuronx-cc supports",
        "https://awsdocs-neuron.readthedocs-hosted.com/en/latest/frameworks/torch/torch-neuronx/"
        "pytorch-neuron-supported-operators.html"),
}


@dataclass(frozen=True)
class UnsupportedOp:
    op: str
    reason: str
    fix: str
    sources: tuple[str, ...]  # keys of SOURCES

    @property
    def source(self) -> str:
        """The sources' names, in one line."""
        return "; ".join(SOURCES[key].name for key in self.sources)


def _entries(names: str, reason: str, fix: str, *sources: str) -> list[UnsupportedOp]:
    return [UnsupportedOp(f"aten::{name}", reason, fix, sources) for name in names.split()]


ON_THE_CPU_ONCE = "do it on the CPU once, outside the training or denoising loop, and move the result to neuron"

TABLE: dict[str, UnsupportedOp] = {e.op: e for e in (
    _entries("linalg_qr _linalg_svd _linalg_eigh linalg_cholesky_ex linalg_inv_ex linalg_lu_factor_ex "
             "linalg_ldl_factor_ex _linalg_slogdet _linalg_det cholesky_inverse triangular_solve",
             "linear algebra runs on the CPU", ON_THE_CPU_ONCE, "fallback-registrations")
    + _entries("normal uniform random exponential multinomial randperm", "random numbers are drawn on the CPU",
               "create the tensor on the CPU and move it: torch.randn(...).to(\"neuron\")", "cpu-random")
    + _entries("bernoulli native_dropout", "random masks are drawn on the CPU",
               "nothing to change in the model: in training each call costs a host round trip; in eval() it draws "
               "nothing", "cpu-random")
    + _entries("_fft_r2c _fft_c2r _fft_c2c", "FFTs (complex results) run on the CPU", ON_THE_CPU_ONCE, "no-kernel")
    + _entries("sort", "sorting runs on the CPU",
               "use torch.topk when only the k largest are needed; otherwise sort on the CPU, once",
               "no-kernel", "supported-operators")
    + _entries("cumprod logcumsumexp _unique2 unique_consecutive bincount searchsorted bucketize median kthvalue "
               "mode", "runs on the CPU", ON_THE_CPU_ONCE, "no-kernel")
    + _entries("upsample_nearest2d", "runs on the CPU",
               "for an integer scale factor, x.repeat_interleave(k, dim=-2).repeat_interleave(k, dim=-1) gives the "
               "same result with ops that have NeuronCore kernels", "no-kernel")
    + _entries("max_pool2d_with_indices avg_pool2d _adaptive_avg_pool2d upsample_bilinear2d "
               "grid_sampler_2d _embedding_bag scatter_reduce index_reduce roll linalg_cross _cdist_forward",
               "runs on the CPU",
               "express it with ops that have neuron kernels (matmul, elementwise, gather), or accept a host "
               "round trip per call", "no-kernel")
    + _entries("lgamma digamma atan2 sinh asinh", "runs on the CPU",
               "express it with ops that have neuron kernels (exp, log, tanh, ...), or accept a host round trip "
               "per call", "no-kernel")
)}
