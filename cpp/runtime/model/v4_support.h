// What a DeepSeek-V4 checkpoint can run with today (issue 25, docs/design/v4.md): the forward on a
// backend with the V4 ops (the CPU), FP32 caches and GEMMs, pages of a multiple of 128 positions,
// one rank. Features whose state copies do not know V4's slot yet (rollback for speculation,
// the prefix cache, context / tensor / expert parallelism) are refused by name at load.
#pragma once

#include <cstdint>

#include "runtime/model/executor.h"
#include "runtime/model/layer_plan.h"

namespace dsv41rt::model {

class Backend;

/// HCA's ratio: a V4 page must hold whole groups of it.
constexpr int64_t kV4PageMultiple = 128;

/// Throws kUnsupported / kInvalidArgument naming the first option a V4 plan cannot run with
/// (nothing for a V4.1 plan). `backend` may be null (checked later, when the executor has one).
void check_v4_executor(const ModelPlan& plan, const ExecutorOptions& options,
                       const Backend* backend);

}  // namespace dsv41rt::model
