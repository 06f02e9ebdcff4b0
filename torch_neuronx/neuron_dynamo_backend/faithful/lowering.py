"""TorchNeuron's front end: an FX graph, as AOTAutograd hands it over, lowered to StableHLO.

The stages are TorchNeuron's: torch-mlir's ``FxImporter`` turns the graph into the torch dialect
(``import``), torch-mlir's pipeline takes it to the torch backend IR (``torch-backend``: shape and
dtype refinement, torch-mlir's own decompositions) and then to StableHLO (``stablehlo``); then
TorchNeuron's semantic pass runs on the StableHLO module (:mod:`.stablehlo_passes`). neuronx-cc
would take the result; here XLA:CPU can run it (``executors/xla_program.py``).

Every op keeps its source location (the user's file and line, from the FX node's stack trace).
A graph that does not lower raises :class:`LoweringError` naming the op, the stage and that line.
torch-mlir is an optional dependency (the ``faithful`` extra); it is imported on first use.
"""
from __future__ import annotations

import collections
import dataclasses
import linecache
import re
import time

import torch

from torch_neuronx.runtime import frames

INSTALL_HINT = ('pip install --no-build-isolation "torch-neuronx-cpu[faithful]" (torch-mlir==20261001 and '
                'jax==0.10.2)')
_TO_BACKEND_PIPELINE = ("builtin.module(func.func(torch-match-quantized-custom-ops), "
                        "torchdynamo-export-to-torch-backend-pipeline{ extra-library=})")
_TO_STABLEHLO_PIPELINE = "builtin.module(torch-backend-to-stablehlo-backend-pipeline{allow-non-finites=true})"
# The first file:line in a location (its innermost frame), plain, fused or in a call site.
_LOCATION = re.compile(r'"(?P<file>[^"]+)":(?P<line>\d+):\d+')
# An op the importer could not name ('torch.operator' with a name: aten or another namespace, such as
# _c10d_functional), then a named operation, then any aten name.
_OPERATOR_NAME = re.compile(r'name = "torch\.(?P<op>[\w.]+)"')
_OP_NAMES = (_OPERATOR_NAME, re.compile(r"operation '(?:torch\.)?(?P<op>[\w.]+)'"),
             re.compile(r"\b(?P<op>aten[.:]+[\w.]+)"))


class FrontEndMissing(ImportError):
    """torch-mlir (or jax, for the xla executor) is not installed."""


class LoweringError(RuntimeError):
    """A graph that does not lower to StableHLO: what a NEFF compile would refuse on Trainium."""

    def __init__(self, op: str, stage: str, site: str, detail: str):
        self.op, self.stage, self.site, self.detail = op, stage, site, detail  # site: file:line
        where = f" at {with_source(site)}" if site else ""
        super().__init__(f"{op}{where} does not lower to StableHLO (stage: {stage}): {detail}")


@dataclasses.dataclass
class LoweredGraph:
    name: str
    torch_mlir: str  # the torch dialect, as imported (TorchNeuron's *.torch_raw.mlir)
    stablehlo: str  # the program for the compiler, with source locations
    op_counts: dict[str, int]  # StableHLO ops by kind
    input_dtypes: list[torch.dtype]  # what the program's parameters hold (float64 narrowed)
    seconds: float


def require_torch_mlir():
    try:
        import torch_mlir.extras.fx_importer  # noqa: F401
        from torch_mlir import ir  # noqa: F401
    except ImportError as error:
        raise FrontEndMissing(f"lowering to StableHLO needs torch-mlir, which is not installed ({error}). "
                              f"Install it with: {INSTALL_HINT}") from error


def site_of(node: torch.fx.Node | None) -> str:
    """The user's file:line that produced ``node`` (the last frame of its stack trace)."""
    return site_from_trace(node.meta.get("stack_trace") if node is not None else None)


def site_from_trace(trace: str | None) -> str:
    """The file:line of a stack trace's innermost frame of the user's code (else its last frame): a
    collective's trace ends inside torch.distributed."""
    if not trace:
        return ""
    return _users_or_first(re.findall(r'File "([^"]+)", line (\d+)', trace)[::-1])


def _users_or_first(places: list[tuple[str, str]]) -> str:
    """'file:line' of the first of (file, line) ``places`` outside the libraries, else of the first."""
    chosen = next((p for p in places if not frames.is_library(p[0], stdlib=True)), places[0] if places else None)
    return f"{chosen[0]}:{chosen[1]}" if chosen else ""


def with_source(site: str) -> str:
    """``file:line`` followed by that line's code, when the file is readable."""
    if not site or ":" not in site:
        return site
    path, _, line = site.rpartition(":")
    code = linecache.getline(path, int(line)).strip() if line.isdigit() else ""
    return f"{site} ({code})" if code else site


def _op_name(message: str) -> str:
    for pattern in _OP_NAMES:
        match = pattern.search(message)
        if match:
            return match.group("op")
    return "an op"


def _first_error(diagnostics: list[tuple[str, str]], fallback: str) -> tuple[str, str]:
    """(location, message) of the first error MLIR reported, else ("", fallback)."""
    for location, message in diagnostics:
        if message:
            return location, message
    return "", fallback


def _first_unlowered(module, default: tuple[str, str]) -> tuple[str, str]:
    """(op, location) of the first aten op the failed pipeline left in ``module``."""
    from torch_mlir import ir

    found = []

    def visit(op):
        operation = op.operation
        name = operation.name
        if name == "torch.operator" and "name" in operation.attributes:
            name = str(operation.attributes["name"]).strip('"')
        if name.startswith("torch.aten."):
            found.append((name.removeprefix("torch."), str(operation.location)))
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return found[0] if found else default


def _site_of_location(location: str) -> str:
    return _users_or_first([(m.group("file"), m.group("line")) for m in _LOCATION.finditer(location)])


def _count_ops(module) -> dict[str, int]:
    from torch_mlir import ir

    counts: collections.Counter = collections.Counter()

    def visit(op):
        name = op.operation.name
        if name not in ("builtin.module", "func.func", "func.return"):
            counts[name] += 1
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return dict(sorted(counts.items()))


def _float_comparison_scalars(gm: torch.fx.GraphModule) -> None:
    """An integer compared with a floating tensor, as the float it is compared as (what PyTorch does):
    torch-mlir (20261001) folds such a comparison of a constant tensor to a random truth value from
    one process to the next (``full(2.0) < 1`` true), and with a float it folds right."""
    aten = torch.ops.aten
    comparisons = {aten.lt.Scalar, aten.le.Scalar, aten.gt.Scalar, aten.ge.Scalar, aten.eq.Scalar, aten.ne.Scalar}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in comparisons or len(node.args) < 2:
            continue
        tensor, scalar = node.args[0], node.args[1]
        value = tensor.meta.get("val") if isinstance(tensor, torch.fx.Node) else None
        if (isinstance(scalar, int) and not isinstance(scalar, bool) and isinstance(value, torch.Tensor)
                and value.dtype.is_floating_point):
            node.args = (tensor, float(scalar), *node.args[2:])


def lower(gm: torch.fx.GraphModule, name: str = "main") -> LoweredGraph:
    """Lower ``gm`` (an FX graph of aten ops on fake or real tensors, with ``val`` metadata) to
    StableHLO, TorchNeuron's way. Raises LoweringError for an op that does not lower."""
    require_torch_mlir()
    from torch_mlir import ir
    from torch_mlir.dialects import torch as torch_dialect

    from torch_neuronx.neuron_dynamo_backend.faithful import stablehlo_passes

    start = time.perf_counter()
    context = ir.Context()
    torch_dialect.register_dialect(context)
    diagnostics: list[tuple[str, str]] = []

    def collect(diagnostic) -> bool:  # handled: MLIR prints nothing to stderr
        if diagnostic.severity == ir.DiagnosticSeverity.ERROR:
            diagnostics.append((str(diagnostic.location), diagnostic.message))
        return True

    handler = context.attach_diagnostic_handler(collect)
    _float_comparison_scalars(gm)
    try:
        module = _import(gm, name, context)
        with context, ir.Location.unknown():
            raw = module.operation.get_asm(enable_debug_info=True)
        for stage, pipeline in (("torch-backend", _TO_BACKEND_PIPELINE), ("stablehlo", _TO_STABLEHLO_PIPELINE)):
            _run_stage(module, stage, pipeline, diagnostics)
        stablehlo_passes.run(module, context)
        text = module.operation.get_asm(enable_debug_info=True)
        counts = _count_ops(module)
        inputs = _parameter_dtypes(module)
    finally:
        handler.detach()
    return LoweredGraph(name, raw, text, counts, inputs, time.perf_counter() - start)


def _import(gm: torch.fx.GraphModule, name: str, context):
    """The stage ``import``: the FX graph as a torch-dialect module, constants dense, locations kept."""
    from torch_mlir.extras.fx_importer import FxImporter

    importer = FxImporter(context=context, hooks=_dense_literals())
    importer._cc = _module_path_locations(context, importer._py_attr_tracker)
    try:
        importer.import_stateless_graph(gm.graph, func_name=name)
    except Exception as error:  # an op or a type the importer does not know
        node = _failing_node(gm, error)
        raise LoweringError(node_op(node) if node is not None else _op_name(str(error)), "import",
                            site_of(node), f"{type(error).__name__}: {error}") from error
    return importer.module


def _run_stage(module, stage: str, pipeline: str, diagnostics: list[tuple[str, str]]) -> None:
    """One torch-mlir pipeline on ``module``; a failure names the first op it left unlowered."""
    from torch_mlir.compiler_utils import run_pipeline_with_repro_report

    diagnostics.clear()
    try:
        run_pipeline_with_repro_report(module, pipeline, f"Lowering to {stage}")
    except Exception as error:
        location, message = _first_error(diagnostics, str(error).strip().splitlines()[0])
        op = _op_name(message)
        if not op.startswith("aten.") and not _OPERATOR_NAME.search(message):  # e.g. a constant left behind
            op, location = _first_unlowered(module, (op, location))
        raise LoweringError(op, stage, _site_of_location(location), message.splitlines()[0]) from None


_ELEMENT_DTYPES = {"f32": torch.float32, "f64": torch.float64, "f16": torch.float16, "bf16": torch.bfloat16,
                   "i64": torch.int64, "i32": torch.int32, "i16": torch.int16, "i8": torch.int8, "ui8": torch.uint8,
                   "i1": torch.bool}


def _parameter_dtypes(module) -> list[torch.dtype]:
    main = next(op for op in module.body.operations if op.operation.name == "func.func")
    dtypes = []
    for argument in main.operation.regions[0].blocks[0].arguments:
        type_ = argument.type.maybe_downcast()
        element = str(getattr(type_, "element_type", type_))
        if element not in _ELEMENT_DTYPES:
            raise LoweringError("an input", "stablehlo", "", f"the program takes {type_} values, which the xla "
                                "executor does not pass")
        dtypes.append(_ELEMENT_DTYPES[element])
    return dtypes


def _dense_literals():
    """Importer hooks that inline tensor constants as dense elements, as TorchNeuron's importer does:
    the stock importer's ``dense_resource`` blobs are refused by XLA ("Only dense elements attr are
    supported"), as by neuronx-cc."""
    import numpy
    from torch_mlir import ir
    from torch_mlir.extras.fx_importer import TORCH_DTYPE_TO_NPY_TYPE, FxImporterHooks, create_mlir_tensor_type

    class DenseLiterals(FxImporterHooks):
        def resolve_literal(self, gni, literal, info):
            if not isinstance(literal, torch.Tensor) or literal.dtype not in TORCH_DTYPE_TO_NPY_TYPE:
                return None
            values = numpy.array(literal.tolist()).astype(TORCH_DTYPE_TO_NPY_TYPE[literal.dtype])
            elements = ir.DenseElementsAttr.get(values.reshape(tuple(literal.shape)),
                                                type=create_mlir_tensor_type(literal))
            return ir.Operation.create(name="torch.vtensor.literal", results=[gni._cc.tensor_to_vtensor_type(literal)],
                                       attributes={"value": elements}).result

    return DenseLiterals()


def _module_path_locations(context, attribute_tracker):
    """The importer's location of each op, with the path of the module it ran in fused in front,
    as TorchNeuron's importer does: ops from torch.nn's own modules have no user line, but a path."""
    from torch_mlir import ir
    from torch_mlir.extras.fx_importer import ContextCache

    class ModulePathLocations(ContextCache):
        __slots__ = ()

        def get_node_location(self, node):
            source = super().get_node_location(node)
            stack = node.meta.get("nn_module_stack") or {}
            path = ">".join(_module_entry(where, kind) for where, kind in stack.values())
            if not path:
                return source
            name = ir.Location.name(path, context=self._c)
            if source is None or str(source) == "loc(unknown)":
                return name
            return ir.Location.fused([name, source], context=self._c)

    return ModulePathLocations(context, py_attr_tracker=attribute_tracker)


def _module_entry(where, kind) -> str:
    """``layers.0|Linear`` (the root module: its class alone), without Dynamo's ``L['self'].``."""
    path = re.sub(r"^L\['[^']*'\]\.?", "", str(where))
    name = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1])
    return f"{path}|{name}" if path else name


def node_op(node: torch.fx.Node) -> str:
    target = node.target
    return str(getattr(target, "_name", None) or getattr(target, "__name__", target)).replace("::", ".")


def _failing_node(gm: torch.fx.GraphModule, error: Exception) -> torch.fx.Node | None:
    """The node whose op the importer named in ``error``, if any."""
    text = str(error)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node_op(node).split(".")[-2:][0] in text:
            return node
    return None
