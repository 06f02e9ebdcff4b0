"""The ``xla`` executor: a graph run as the StableHLO program TorchNeuron would hand to neuronx-cc,
compiled by XLA:CPU (through jax's CPU client) instead.

Inputs reach XLA without a copy when their layout is compact (DLPack); results come back through
DLPack and are adopted by neuron as they are. The program computes float64 as float32
(``faithful/stablehlo_passes.py``): float64 inputs are narrowed before the call and float64 results come
back as float64 tensors holding float32 values, as on Trainium.

XLA's algebraic simplifier is turned off: it rewrites floating-point expressions by the rules of
real numbers (``(a + c) - c`` becomes ``a``), so the program would no longer compute what it says.
"""
from __future__ import annotations

import dataclasses
import json
import re
import struct
from typing import Callable, Sequence

import torch

from torch_neuronx.neuron_dynamo_backend.faithful.lowering import INSTALL_HINT, FrontEndMissing

# XLA passes left out: each would make the results differ from the program's own arithmetic.
DISABLED_XLA_PASSES = ("algsimp",)


def require_jax():
    try:
        import jax  # noqa: F401
        from jax.extend import backend  # noqa: F401
    except ImportError as error:
        raise FrontEndMissing(f"the xla executor needs jax (XLA:CPU), which is not installed ({error}). Install "
                              f"it with: {INSTALL_HINT}") from error


def _client():
    from jax.extend import backend

    return backend.get_backend("cpu")


def _compile_options():
    from jax._src.lib import xla_client

    options = xla_client.CompileOptions()
    options.executable_build_options.debug_options.xla_disable_hlo_passes = ",".join(DISABLED_XLA_PASSES)
    return options


@dataclasses.dataclass
class XlaProgram:
    """A compiled program and what it takes to call it with torch tensors."""
    executable: object
    input_dtypes: list[torch.dtype]  # what the program's parameters hold (float64 narrowed)
    output_dtypes: list[torch.dtype]  # what the caller gets back (the graph's own dtypes)

    def __post_init__(self):
        self._import = _importer()

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        import jax

        to_xla = self._import
        with jax.enable_x64(True):  # keep int64/float64 buffers as they are (jax would narrow them)
            arrays = [to_xla(_compact(t, dtype)) for t, dtype in zip(inputs, self.input_dtypes)]
            results = self.executable.execute(arrays)
        outputs = []
        for result, dtype in zip(results, self.output_dtypes):
            tensor = torch.from_dlpack(result)
            outputs.append(tensor if tensor.dtype == dtype else tensor.to(dtype))
        return outputs


_DL_CPU = 1  # DLPack's kDLCPU


def _importer() -> Callable[[torch.Tensor], object]:
    """A function taking a compact tensor to an XLA buffer over the same bytes (a copy only when
    they are not aligned as XLA wants). jaxlib's own import, called directly: ``jax.dlpack.from_dlpack``
    wraps it in a ``jnp.asarray`` and device look-ups that cost ~5x the import itself, on each of a
    graph's inputs (parameters included) at every call."""
    import jax
    from jax._src.lib import _jax, jaxlib_extension_version

    device = _client().devices()[0]
    if jaxlib_extension_version < 467:  # another signature: jax's public path
        return jax.dlpack.from_dlpack
    import_buffer = _jax.dlpack_managed_tensor_to_buffer
    return lambda tensor: import_buffer(tensor.__dlpack__(), device, None, None, _DL_CPU)


def _compact(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``tensor`` as XLA takes it: contiguous (DLPack import refuses other strides), in the
    program's dtype; a view of the same bytes when it already is."""
    tensor = tensor.detach()
    if tensor.dtype != dtype:
        tensor = tensor.to(dtype)
    return tensor if tensor.is_contiguous() else tensor.contiguous()


# torch-mlir marks every integer comparison SIGNED, unsigned and boolean operands included; XLA's
# verifier refuses that, and a signed reading would order 200 (ui8) below 100.
_SIGNED_COMPARE_OF_UNSIGNED = re.compile(r"(?<!UN)SIGNED(\s*:\s*\(tensor<(?:\d+x)*(?:ui\d+|i1)>)")


def unsigned_comparisons(stablehlo: str) -> str:
    """``stablehlo`` with comparisons of unsigned and boolean tensors marked UNSIGNED, as they mean."""
    return _SIGNED_COMPARE_OF_UNSIGNED.sub(r"UNSIGNED\1", stablehlo)


def compile_program(stablehlo: str, input_dtypes: list[torch.dtype], output_dtypes: list[torch.dtype]) -> XlaProgram:
    require_jax()
    client = _client()
    executable = client.compile_and_load(unsigned_comparisons(stablehlo), client.devices()[:1], _compile_options())
    return XlaProgram(executable, input_dtypes, output_dtypes)


# A cache entry: a little-endian u32 header length, the JSON header, then the serialized executable.
def serialize(program: XlaProgram, stablehlo: str, op_counts: dict[str, int]) -> bytes:
    executable = _client().serialize_executable(program.executable)
    header = json.dumps({"inputs": [str(d) for d in program.input_dtypes],
                         "outputs": [str(d) for d in program.output_dtypes], "stablehlo": stablehlo,
                         "op_counts": op_counts}).encode()
    return struct.pack("<I", len(header)) + header + bytes(executable)


def deserialize(payload: bytes) -> tuple[XlaProgram, str, dict[str, int]]:
    """(the program, its StableHLO, its StableHLO ops by kind) of a cache entry."""
    require_jax()
    (length,) = struct.unpack_from("<I", payload)
    header = json.loads(payload[4:4 + length])
    client = _client()
    executable = client.deserialize_executable(payload[4 + length:], client.devices()[:1], _compile_options())
    program = XlaProgram(executable, _dtypes(header["inputs"]), _dtypes(header["outputs"]))
    return program, header["stablehlo"], header["op_counts"]


def _dtypes(names: list[str]) -> list[torch.dtype]:
    return [getattr(torch, name.removeprefix("torch.")) for name in names]
