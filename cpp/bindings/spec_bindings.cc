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
#include "runtime/model/memory_plan.h"
#include "runtime/model/state_layout.h"
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

// The executor's memory plan (memory_plan.h) for these pool options, before any weight is loaded:
// benchmarks size a pool to hold a given number of positions with it.
nb::dict memory_plan_dict(const ModelPlan& plan, int64_t kv_memory, int64_t max_num_seqs,
                          int64_t max_num_batched_tokens, int64_t max_model_len, int64_t page_size,
                          bool cache_quant) {
  const model::StateLayout layout(plan, model::CacheFormats::of(plan.config, cache_quant),
                                  page_size);
  const model::MemoryPlan m = model::plan_memory(plan, layout, kv_memory, max_num_seqs,
                                                 max_num_batched_tokens, max_model_len);
  nb::dict d;
  d["num_slots"] = m.num_slots;
  d["slot_bytes"] = m.slot_bytes;
  d["num_pages"] = m.num_pages;
  d["page_bytes"] = m.page_bytes;
  d["page_tokens"] = m.page_tokens;
  d["workspace_bytes_per_page"] = m.workspace_bytes_per_page;
  d["scratch_bytes"] = m.scratch_bytes;
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
  m.def("memory_plan", &memory_plan_dict, nb::arg("plan"), nb::arg("kv_memory"),
        nb::arg("max_num_seqs"), nb::arg("max_num_batched_tokens"), nb::arg("max_model_len"),
        nb::arg("page_size"), nb::arg("cache_quant") = true,
        "How the executor splits a KV memory budget (memory_plan.h): num_slots, slot_bytes, "
        "num_pages, page_bytes, page_tokens, workspace_bytes_per_page, scratch_bytes; raises "
        "naming the shortfall when not one slot and one page fit.");
  m.def("open_checkpoint", &open_checkpoint_py, nb::arg("path"), nb::arg("validate") = true,
        "Open a checkpoint directory once: parse config.json, plan, map the safetensors files "
        "and (validate) check every tensor against the spec. Returns (ModelPlan, Checkpoint); "
        "raises dsv41rt.errors.ConfigError / CheckpointError naming the field, file or tensor.");
}

}  // namespace dsv41rt::bindings
