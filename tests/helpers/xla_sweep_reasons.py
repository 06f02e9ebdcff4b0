"""Why a case of the xla sweep fails, and whether TorchNeuron's own compile would fail it too: keyed
by OpInfo op name or ModuleInfo module name (the first part of a dotted op name also matches).
Read with TorchNeuron's `torch_neuronx/neuron_dynamo_backend/decompositions.py` (its compile table)
and stock torch-mlir's lowerings in hand."""

_NOTHING_LOWERS = ("fails on Trainium too: neither TorchNeuron's decompositions.py nor stock torch-mlir "
                   "lowers it (unless its private pipeline does)")
_RANDOM_POOL = ("fails on Trainium too: fractional max pooling draws its windows at random; "
                "TorchNeuron's decompositions.py has no entry and torch-mlir no lowering")
_SPARSE = "not the compiler's: sparse tensors are refused on neuron, eager too (as by TorchNeuron)"

REASONS = {
    "nn.FractionalMaxPool2d": _RANDOM_POOL,
    "nn.FractionalMaxPool3d": _RANDOM_POOL,
    "fft": _NOTHING_LOWERS + "; XLA has FFT, StableHLO's fft op is not produced by torch-mlir",
    "stft": _NOTHING_LOWERS, "istft": _NOTHING_LOWERS,
    "linalg": _NOTHING_LOWERS + " (factorizations: TorchNeuron runs eleven linalg ops on the host in eager mode)",
    "cholesky": _NOTHING_LOWERS, "cholesky_inverse": _NOTHING_LOWERS, "cholesky_solve": _NOTHING_LOWERS,
    "geqrf": _NOTHING_LOWERS, "svd": _NOTHING_LOWERS, "pinverse": _NOTHING_LOWERS, "lu": _NOTHING_LOWERS,
    "cummax": _NOTHING_LOWERS, "cummin": _NOTHING_LOWERS, "cdist": _NOTHING_LOWERS,
    "view_as_complex": _NOTHING_LOWERS, "polygamma": _NOTHING_LOWERS, "special": _NOTHING_LOWERS,
    "sparse": _SPARSE,
}
DEFAULT = {"lowering": _NOTHING_LOWERS, "crash": "torch-mlir crashes on it: " + _NOTHING_LOWERS,
           "mismatch": "ours to fix: it lowers but computes something else here",
           "error": "ours to fix", "no-graph": "ours to fix: Dynamo compiles it on CPU"}
