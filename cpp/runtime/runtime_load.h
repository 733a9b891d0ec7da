// Building what a Runtime runs from its options (runtime_load.cc).
#pragma once

#include <memory>

#include "dsv41rt/runtime.hpp"
#include "runtime/engine/engine.h"
#include "runtime/model/executor.h"

namespace dsv41rt {

struct LoadedModel {
  std::shared_ptr<model::Executor> executor;
  engine::EngineConfig engine;
};

/// Checks the options, loads and validates the checkpoint once, builds the executor; throws Error
/// naming the option, file or tensor.
LoadedModel load_model(const RuntimeOptions& options);

}  // namespace dsv41rt
