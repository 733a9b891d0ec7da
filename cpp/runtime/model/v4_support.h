// What a DeepSeek-V4 checkpoint can run with today (issue 25, docs/design/v4.md): the forward on a
// backend with the V4 ops (CPU, CUDA), FP32 caches and GEMMs, pages of a multiple of 128
// positions; context, tensor and expert parallelism as V4.1 (every rank writes the whole state,
// so V4's compressor state needs no copy between ranks; tensor shares must fall on V4's 128-row
// FP8 scale blocks, which the loader checks by tensor). Rollback for speculation and the prefix
// cache are refused by name at load (runtime_load.cc check_v4_runtime).
#pragma once

#include <cstdint>
#include <string>

#include "core/export.h"
#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

/// HCA's ratio: a V4 page must hold whole groups of it.
constexpr int64_t kV4PageMultiple = 128;

/// Throws kUnsupported / kInvalidArgument naming the first option a V4 plan cannot run with
/// (nothing for a V4.1 plan).
DSV41RT_API void check_v4_options(const ModelPlan& plan, const ExecutorOptions& options);
/// Throws kUnsupported naming the device when a V4 plan meets a backend without the V4 ops
/// (Backend::has_v4_ops(); the CPU and CUDA backends both have them). Nothing for a V4.1 plan.
DSV41RT_API void check_v4_backend(const ModelPlan& plan, const std::string& device,
                                  bool has_v4_ops);

}  // namespace dsv41rt::model
