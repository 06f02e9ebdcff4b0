// TorchNeuron's words for bad input. Its eager kernels check their arguments before any
// computation (its torch-mlir ops' preconditions, the meta functions it traces through), so a
// failure there has another exception type and message than CPU's kernel gives. Here CPU's kernel
// finds the same fault; on the way out, its error is raised again in TorchNeuron's type and words
// (source file named at each rule), followed by how to fix the call. Only the error path pays.
#include "dispatch.h"

#include <sstream>
#include <string>

namespace neuron {
namespace {

bool contains(const c10::Error& e, const char* words) {
  return e.what_without_backtrace() != nullptr && std::string(e.what_without_backtrace()).find(words) != std::string::npos;
}

// Python's repr of a shape tuple: (3,), (3, 4), ().
std::string python_shape(c10::IntArrayRef sizes) {
  std::ostringstream out;
  out << "(";
  for (size_t i = 0; i < sizes.size(); ++i) out << (i ? ", " : "") << sizes[i];
  out << (sizes.size() == 1 ? ",)" : ")");
  return out.str();
}

// Python's name of a dtype: torch.float32, torch.int64.
std::string python_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::kFloat: return "torch.float32";
    case c10::kDouble: return "torch.float64";
    case c10::kHalf: return "torch.float16";
    case c10::kBFloat16: return "torch.bfloat16";
    case c10::kBool: return "torch.bool";
    case c10::kByte: return "torch.uint8";
    case c10::kChar: return "torch.int8";
    case c10::kShort: return "torch.int16";
    case c10::kInt: return "torch.int32";
    case c10::kLong: return "torch.int64";
    case c10::kComplexFloat: return "torch.complex64";
    case c10::kComplexDouble: return "torch.complex128";
    default: return std::string("torch.") + c10::toString(type);
  }
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

// index_copy(self, dim, index, source): the shape source must have.
std::vector<int64_t> index_copy_slice_shape(const c10::IValue* args) {
  const at::Tensor& self = args[0].toTensor();
  std::vector<int64_t> shape(self.sizes().begin(), self.sizes().end());
  if (shape.empty()) return shape;
  const int64_t dim = c10::maybe_wrap_dim(args[1].toInt(), self.dim());
  shape[dim] = args[2].toTensor().numel();
  return shape;
}

}  // namespace

void rethrow_in_torchneuron_words(const c10::FunctionSchema& schema, const c10::IValue* args, size_t num_args,
                                  const c10::Error& e) {
  if (args == nullptr || num_args < schema.arguments().size()) return;
  const std::string& op = schema.name();
  // Its meta check (torch/_prims_common, canonicalize dims), reached through torch-mlir's trace.
  if (op == "aten::flip" && contains(e, "appears multiple times in the list of dims")) {
    TORCH_CHECK(false, "duplicate value in the list of dims. flip takes each dimension once.");
  }
  // python_ops/torch_mlir/ops/foreach_ops.py, _check_tensors_scalars.
  if (starts_with(op, "aten::_foreach_") && contains(e, "must have same number of elements as scalar list")) {
    TORCH_CHECK_VALUE(false, "Tensor list must have same number of elements as scalar list. Pass one scalar "
                             "per tensor.");
  }
  // Its index kernel's bound check raises through its C++ dispatch, as a RuntimeError.
  if (op == "aten::index" && contains(e, "is out of bounds for dimension")) {
    TORCH_CHECK(false, e.what_without_backtrace(), ". Every index must be in [-size, size) of its dimension.");
  }
  // python_ops/torch_mlir/ops/indexing.py, torch_index_copy: source must have self's shape with
  // index.numel() at dim; it says so in jax's words.
  if (starts_with(op, "aten::index_copy") && args[0].isTensor() && args[3].isTensor() &&
      (contains(e, "must have same slice shapes") || contains(e, "dimensionality must match"))) {
    TORCH_CHECK_VALUE(false, "Incompatible shapes for broadcasting: ", python_shape(args[3].toTensor().sizes()),
                      " and requested shape ", python_shape(index_copy_slice_shape(args)),
                      ". index_copy's source must have self's shape with len(index) at dim.");
  }
  // python_ops/torch_mlir/ops/indexing.py, torch_index_select (a TypeError, so that it is not
  // taken for a kernel failure and run on the CPU).
  if (op == "aten::index_select" && contains(e, "Expected dtype int32 or int64 for index")) {
    TORCH_CHECK_TYPE(false, "index_select(): Expected dtype int32 or int64 for index. Pass an integer index "
                            "tensor (index.long()).");
  }
  // python_ops/torch_mlir/ops/indexing.py, index_select_backward's dtype check.
  if (op == "aten::index_select_backward" && args[3].isTensor() && contains(e, "Expected dtype int32/int64")) {
    TORCH_CHECK_TYPE(false, "index_select_backward(): Expected dtype int32/int64 for index but got: ",
                     python_dtype(args[3].toTensor().scalar_type()), ". Pass an integer index tensor (index.long()).");
  }
}

void check_mm_operands(const at::Tensor& a, const at::Tensor& b) {
  // Its mm is traced through torch's meta function (torch/_meta_registrations.py, meta_mm).
  TORCH_CHECK(a.dim() == 2, "a must be 2D. torch.mm multiplies matrices; use torch.matmul or torch.bmm for other ranks.");
  TORCH_CHECK(b.dim() == 2, "b must be 2D. torch.mm multiplies matrices; use torch.matmul or torch.bmm for other ranks.");
  TORCH_CHECK(a.size(1) == b.size(0), "a and b must have same reduction dim, but got [", a.size(0), ", ", a.size(1),
              "] X [", b.size(0), ", ", b.size(1), "]. a's columns must equal b's rows.");
}

}  // namespace neuron
