"""TorchNeuron's passes on the StableHLO module that change what the program computes.

The Neuron compiler has no 64-bit floats, so TorchNeuron rewrites every float64 in the module to
float32 before the compiler sees it: function arguments and results, op results (block arguments of
regions, such as a reduction's body, included) and constants. Its other passes change only the
graph's structure (see the design document), so this is the one mirrored here.
"""
from __future__ import annotations


def run(module, context) -> None:
    """Rewrite ``module`` (torch_mlir.ir.Module, StableHLO) in place: float64 becomes float32."""
    from torch_mlir import ir

    with context, ir.Location.unknown():
        module.operation.walk(_Narrowing(ir).visit)
        _retype_functions(module, ir)


class _Narrowing:
    """The float64-to-float32 rewrite of one operation at a time (a walk's callback)."""

    def __init__(self, ir):
        self.ir, self.f64, self.f32 = ir, ir.F64Type.get(), ir.F32Type.get()

    def narrowed(self, type_):
        """The float32 counterpart of a float64 type (scalar or ranked tensor), else None."""
        type_ = type_.maybe_downcast()
        if isinstance(type_, self.ir.RankedTensorType):
            if type_.element_type == self.f64:
                return self.ir.RankedTensorType.get(type_.shape, self.f32, type_.encoding)
        elif type_ == self.f64:
            return self.f32
        return None

    def narrow_constant(self, op) -> None:
        ir = self.ir
        attribute = op.attributes["value"].maybe_downcast() if "value" in op.attributes else None
        if not isinstance(attribute, ir.DenseFPElementsAttr):
            return
        new_type = self.narrowed(attribute.type)
        if new_type is None:
            return
        if attribute.is_splat:
            element = ir.FloatAttr.get(self.f32, attribute.get_splat_value().maybe_downcast().value)
            op.attributes["value"] = ir.DenseElementsAttr.get_splat(new_type, element)
        else:
            import numpy

            values = numpy.array(attribute, dtype=numpy.float64).astype(numpy.float32)
            op.attributes["value"] = ir.DenseElementsAttr.get(values, type=new_type)

    def visit(self, op):
        operation = op.operation
        for region in operation.regions:
            for block in region.blocks:
                for argument in block.arguments:
                    new_type = self.narrowed(argument.type)
                    if new_type is not None:
                        argument.set_type(new_type)
        if operation.name in ("stablehlo.constant", "arith.constant"):
            self.narrow_constant(operation)
        for result in operation.results:
            new_type = self.narrowed(result.type)
            if new_type is not None:
                result.set_type(new_type)
        return self.ir.WalkResult.ADVANCE


def _retype_functions(module, ir) -> None:
    """Each function's declared type follows its (rewritten) arguments and returned values."""
    for op in module.body.operations:
        if op.operation.name != "func.func":
            continue
        entry = op.operation.regions[0].blocks[0]
        returned = next(o for o in entry.operations if o.operation.name == "func.return")
        function_type = ir.FunctionType.get([a.type for a in entry.arguments],
                                            [v.type for v in returned.operation.operands])
        op.operation.attributes["function_type"] = ir.TypeAttr.get(function_type)
