"""Why a case of the xla sweep fails, and whether TorchNeuron's own compile would fail it too: keyed
by OpInfo op name or ModuleInfo module name (the first part of a dotted op name also matches).
Read with TorchNeuron's `torch_neuronx/neuron_dynamo_backend/decompositions.py` (its compile table),
stock torch-mlir's lowerings, and docs/compiled-coverage.md's rule for the private pipeline in hand."""

_NOTHING_LOWERS = ("fails on Trainium too: neither TorchNeuron's decompositions.py nor stock torch-mlir "
                   "lowers it, and it is not a composition of ops that lower (so no stand-in)")
_RANDOM_POOL = ("fails on Trainium too: fractional max pooling draws its windows at random; "
                "TorchNeuron's decompositions.py has no entry and torch-mlir no lowering")
_SPARSE = "not the compiler's: sparse tensors are refused on neuron, eager too (as by TorchNeuron)"
_LINALG = ("fails on Trainium too: TorchNeuron runs the linear-algebra factorizations on the host even in "
           "eager mode (python_ops/cpu_fallback_registrations.py); nothing lowers them")
_COMPLEX = ("fails on Trainium too: it needs complex dtypes, which neither torch-mlir's StableHLO lowering "
            "nor the device has")
_INDEX_0D = ("fails on Trainium too: torch-mlir cannot lower indexing by a 0-d index tensor "
             "(this sample's), the lowering TorchNeuron uses")
_EMPTY = ("fails on Trainium too: torch-mlir cannot lower this sample's zero-element tensors, the lowering "
          "TorchNeuron uses")

REASONS = {
    "nn.FractionalMaxPool2d": _RANDOM_POOL,
    "nn.FractionalMaxPool3d": _RANDOM_POOL,
    "fft": _COMPLEX, "stft": _COMPLEX, "istft": _COMPLEX, "view_as_complex": _COMPLEX, "polar": _COMPLEX,
    "cfloat": _COMPLEX, "cdouble": _COMPLEX, "chalf": _COMPLEX, "complex": _COMPLEX,
    "linalg": _LINALG, "cholesky": _LINALG, "cholesky_inverse": _LINALG, "cholesky_solve": _LINALG,
    "geqrf": _LINALG, "ormqr": _LINALG, "svd": _LINALG, "pinverse": _LINALG, "lu": _LINALG, "lu_solve": _LINALG,
    "lu_unpack": _LINALG, "qr": _LINALG, "matrix_exp": _LINALG, "logdet": _LINALG, "det": _LINALG,
    "inverse": _LINALG, "triangular_solve": _LINALG, "norm": _LINALG + " (the nuclear norm is an SVD)",
    "nn.functional.embedding": _INDEX_0D, "index_add": _INDEX_0D, "index_copy": _INDEX_0D,
    "nonzero_static": _EMPTY, "nn.functional.unfold": _EMPTY, "nn.functional.pad.circular": _EMPTY,
    "_batch_norm_with_update": _EMPTY + " (the empty reserve tensor it returns)",
    "as_strided_copy": ("fails on Trainium too: AOTAutograd cannot trace as_strided's backward, which reads a "
                        "value from the data (DataDependentOutputException), before any lowering"),
    "as_strided_scatter": ("fails on Trainium too: AOTAutograd cannot trace as_strided_scatter's backward, which "
                           "reads a value from the data (DataDependentOutputException), before any lowering"),
    "logcumsumexp": ("fails on Trainium too, by computing something else: torch-mlir lowers it as "
                     "log(cumsum(exp(x))), which overflows to inf for this sample's values (1e4), where CPU's "
                     "kernel does not"),
    "hash_tensor": "fails on Trainium too: its uint64 result has no StableHLO import in torch-mlir",
    "nn.functional.linear_cross_entropy": ("fails on Trainium too: the chunked form is a custom op "
                                           "(torch_nn::_linear_cross_entropy_batch_chunked) that AOTAutograd "
                                           "keeps whole, and nothing lowers it"),
    "special": (_NOTHING_LOWERS + ": the Hermite, Laguerre and Legendre polynomials need a recurrence as long "
                "as the degree, which is data"),
    "sparse": _SPARSE,
}
DEFAULT = {"lowering": _NOTHING_LOWERS, "crash": "torch-mlir crashes on it: " + _NOTHING_LOWERS,
           "mismatch": "ours to fix: it lowers but computes something else here",
           "error": "ours to fix", "no-graph": "ours to fix: Dynamo compiles it on CPU"}
