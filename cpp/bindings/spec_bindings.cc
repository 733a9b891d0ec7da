// dsv41rt._core: the tensor spec, the cache-byte accounting and opening a checkpoint with its
// validation (cpp/runtime/model/{tensor_spec,cache_bytes,checkpoint_validation}.h), bound for
// python/dsv41rt/checkpoint (generator, reader) and `dsv41rt inspect`.
#include <nanobind/nanobind.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings/python_errors.h"
#include "runtime/model/cache_bytes.h"
#include "runtime/model/checkpoint_validation.h"
#include "runtime/model/tensor_spec.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
namespace {

nb::tuple shape_tuple(const std::vector<int64_t>& shape) { return nb::tuple(nb::cast(shape)); }

// (quantized, [(name, shape, storage, (block_rows, block_cols))],
//  [(name, dtype, shape, logical index, is_scale, nbytes)]): plain tuples, since the released
// V4.1-Flash spec has 95,819 entries.
nb::tuple spec_tuple(const TensorSpec& spec) {
  nb::list logical, physical;
  for (const LogicalTensor& t : spec.logical) {
    logical.append(nb::make_tuple(t.name, shape_tuple(t.shape), weight_storage_name(t.storage),
                                  nb::make_tuple(t.block_rows, t.block_cols)));
  }
  for (const PhysicalTensor& t : spec.physical) {
    physical.append(nb::make_tuple(t.name, safetensors_name(t.dtype), shape_tuple(t.shape),
                                   t.logical, t.is_scale, t.nbytes()));
  }
  return nb::make_tuple(spec.quantized, logical, physical);
}

nb::dict cache_bytes_dict(const model::CacheBytes& b) {
  nb::dict d;
  d["window_row"] = b.window_row;
  d["window_layers"] = b.window_layers;
  d["window_per_request"] = b.window_per_request;
  d["global_per_token"] = b.global_per_token;
  d["compressor_state_per_request"] = b.compressor_state_per_request;
  d["engram_history_per_request"] = b.engram_history_per_request;
  return d;
}

nb::list string_list(const std::vector<std::string>& xs) {
  nb::list out;
  for (const std::string& x : xs) out.append(x);
  return out;
}

// (plan, tensors) of an opened checkpoint; errors become Python's ConfigError (config.json) or
// CheckpointError (files, tensors). Header errors keep Error::what() ("safetensors.cc:LINE: ...")
// as they always have; a mismatch lists its problems (CheckpointError.problems).
nb::tuple open_checkpoint_py(const std::string& path, bool validate) {
  try {
    OpenedCheckpoint opened =
        config_errors_as_python([&] { return open_checkpoint(path, validate); });
    return nb::make_tuple(std::move(opened.plan), opened.tensors);
  } catch (const CheckpointMismatch& e) {
    raise_dsv41rt_error("CheckpointError", nb::make_tuple(e.message(), string_list(e.problems())));
  } catch (const Error& e) {
    raise_dsv41rt_error("CheckpointError", nb::make_tuple(std::string(e.what())));
  }
}

}  // namespace

void register_spec(nb::module_& m) {
  m.def(
      "tensor_spec", [](const ModelPlan& plan) { return spec_tuple(build_tensor_spec(plan)); },
      nb::arg("plan"),
      "The tensors a checkpoint of this plan holds: (quantized, logical, physical), logical = "
      "[(name, shape, storage, block)], physical = [(name, safetensors dtype, shape, index into "
      "logical, is_scale, nbytes)], both sorted by name.");
  m.def(
      "cache_bytes",
      [](const ModelPlan& plan) { return cache_bytes_dict(model::cache_bytes(plan)); },
      nb::arg("plan"),
      "Cache bytes of this plan in the release's formats: window_row, window_layers, "
      "window_per_request, global_per_token, compressor_state_per_request, "
      "engram_history_per_request.");
  m.def("open_checkpoint", &open_checkpoint_py, nb::arg("path"), nb::arg("validate") = true,
        "Open a checkpoint directory once: parse config.json, plan, map the safetensors files "
        "and (validate) check every tensor against the spec. Returns (ModelPlan, Checkpoint); "
        "raises dsv41rt.errors.ConfigError / CheckpointError naming the field, file or tensor.");
}

}  // namespace dsv41rt::bindings
