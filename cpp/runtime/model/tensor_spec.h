// The tensors a checkpoint must hold, derived from the layer plan (architecture spec §5.1, §6).
//
// The one tensor spec: the weight loader (weights.cc), checkpoint validation
// (checkpoint_validation.h) and, through the bindings, Python's generator and `inspect` read it.
// `logical` lists every weight (name, shape, storage class); `physical` is what the safetensors
// files hold. With a quantization_config an FP8 matrix is `<name>` F8_E4M3 + `<stem>.scale`
// F8_E8M0 over the arch's block grid, an FP4 expert matrix is `<name>` I8 [out, in/2] (two E2M1
// codes per byte, even column in the low nibble) + `<stem>.scale` F8_E8M0 [out, in/32]; without
// one both are stored BF16 at their logical shape (the dequantised values of the same grid).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"
#include "core/export.h"
#include "core/safetensors.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt {

enum class WeightStorage {
  kBF16,
  kF32,
  kI64,
  kFP8,  // F8_E4M3 + UE8M0 block scales (when quantised)
  kFP4,  // packed E2M1 + UE8M0 1x32 scales (when quantised)
};

// "BF16", "F32", "I64", "fp8", "fp4" (Python's Storage values).
DSV41RT_API const char* weight_storage_name(WeightStorage storage) noexcept;

struct DSV41RT_API LogicalTensor {
  std::string name;
  std::vector<int64_t> shape;
  WeightStorage storage = WeightStorage::kBF16;
  int block_rows = 0, block_cols = 0;  // FP8 scale block; 0 otherwise
};

struct DSV41RT_API PhysicalTensor {
  std::string name;
  DType dtype = DType::kBF16;
  std::vector<int64_t> shape;
  size_t logical = 0;     // index into TensorSpec::logical of the weight this tensor stores
  bool is_scale = false;  // the UE8M0 scales of a quantised weight
  int64_t nbytes() const;
};

struct DSV41RT_API TensorSpec {
  bool quantized = false;
  std::vector<LogicalTensor> logical;    // sorted by name
  std::vector<PhysicalTensor> physical;  // sorted by name
  const LogicalTensor* find_logical(std::string_view name) const;
  const PhysicalTensor* find_physical(std::string_view name) const;
};

DSV41RT_API TensorSpec build_tensor_spec(const ModelPlan& plan);

// "<stem>.scale" for "<stem>.weight" (other names get ".scale" appended).
DSV41RT_API std::string scale_name(std::string_view weight_name);

// Appends one line per way `found` differs from `expected` (dtype, shape), naming the tensor.
// Quantised formats must match exactly; unquantised floats may be any float dtype (the release's
// exact per-tensor dtypes are not all known and the loader upcasts); integer tables I64 or I32.
DSV41RT_API void append_tensor_problems(const PhysicalTensor& expected, const TensorInfo& found,
                                        std::vector<std::string>& problems);

// "[a, b]".
DSV41RT_API std::string shape_text(const std::vector<int64_t>& shape);

}  // namespace dsv41rt
