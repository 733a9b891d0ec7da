// A standalone DSpark drafter over a checkpoint directory: the checkpoint validated, its weights
// loaded with their drafts on the CPU or a CUDA backend, and a DraftRunner over them. What the
// oracle test and the bindings drive until the drafter runs inside the executor
// (docs/design/dspark.md).
#pragma once

#include <memory>
#include <string>

#include "core/export.h"
#include "runtime/model/backend.h"
#include "runtime/model/draft_runner.h"

namespace dsv41rt::model {

class DSV41RT_API Drafter {
 public:
  /// `cache_quant`: the window cache's FP8 format for the ring and block keys (off: FP32, no
  /// rounding). `device`: "cpu", "cuda" or "cuda:N" (weights in their released formats there).
  /// Throws Error naming the problem (no DSpark stages, a tensor mismatch, an unknown device).
  Drafter(const std::string& checkpoint_dir, bool cache_quant, const std::string& device = "cpu");
  ~Drafter();
  Drafter(const Drafter&) = delete;
  Drafter& operator=(const Drafter&) = delete;

  DraftOutputs draft(const DraftInputs& in) { return runner_->run(in); }
  DraftOutputs draft_greedy(const DraftInputs& in) { return runner_->run_greedy(in); }
  /// Record the keys entering their window-format QDQ (DraftOutputs::window_kv).
  void record_window_kv(bool on) { runner_->record_window_kv = on; }
  const ModelPlan& plan() const { return plan_; }

 private:
  ModelPlan plan_;
  std::unique_ptr<Backend> backend_;
  BackendWeights weights_;
  std::unique_ptr<DraftRunner> runner_;
};

}  // namespace dsv41rt::model
