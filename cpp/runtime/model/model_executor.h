// The executor of every device: one ModelRunner (the forward, written once) over the Backend of
// options.device. What differs between devices lives in the backend (weight storage, allocator,
// streams, graph capture); the executor owns the state (weights, KV pool, dequant workspaces,
// the host copy of every request's Engram history) and the capture policy: decode batches
// replay a graph per bucket where the backend has graphs, everything else runs eagerly.
#pragma once

#include <memory>

#include "runtime/model/backend.h"
#include "runtime/model/backend_host_copy.h"
#include "runtime/model/decode_graphs.h"
#include "runtime/model/draft_runner.h"
#include "runtime/model/executor.h"
#include "runtime/model/model_runner.h"

namespace dsv41rt::model {

/// Per layer, the RoPE inverse frequencies Backend::load_weights takes: the backbone layers, then
/// the draft stages (plan.draft_layers).
DSV41RT_API std::vector<std::vector<float>> rope_inv_freqs(const ModelPlan& plan);

class ModelExecutor final : public Executor {
 public:
  ModelExecutor(ModelPlan plan, ModelWeights weights, EngramTables engram, ExecutorOptions options,
                std::unique_ptr<Backend> backend);
  ~ModelExecutor() override;

  void forward(std::vector<BatchItem>& batch) override { forward_impl(batch, nullptr); }
  void forward_cp(std::vector<BatchItem>& batch, comm::Communicator& comm) override {
    forward_impl(batch, &comm);
  }
  void copy_state(const RequestView& src, const RequestView& dst) override;
  void undo(const RequestView& request, const UndoRecord& record, int64_t length) override;
  bool has_drafter() const override { return drafter_ != nullptr; }
  bool has_mtp() const override { return mtp_; }
  void draft_greedy(const DraftInputs& in, DraftOutputs& out) override;
  HostStateCopy* host_state_copy() override { return host_copy_.get(); }

  const ModelPlan& plan() const override { return plan_; }
  const StateLayout& layout() const override { return *layout_; }
  KvPool& pool() override { return *pool_; }
  const MemoryPlan& memory_plan() const override { return memory_; }
  const Decisions& decisions() const override { return runner_->decisions(); }
  DequantWorkspaces& workspaces() override { return workspaces_; }
  std::string device() const override { return backend_->device(); }
  void set_switch(Switch which, bool on) override;
  BackendStats backend_stats() const override;

 private:
  void forward_impl(std::vector<BatchItem>& batch, comm::Communicator* comm);
  void copy_results(const ForwardPlan& f, std::vector<BatchItem>& batch);
  // Rollback records (BatchItem::undo): what the items' positions will overwrite, saved before
  // the run, and the buffer the run copies their raw compressor rows into (null: none asked).
  std::shared_ptr<void> begin_undo(const ForwardPlan& f, std::vector<BatchItem>& batch);
  void finish_undo(std::vector<BatchItem>& batch);
  // The items' rows of the drafter's target features, from the forward's capture.
  // Under context parallelism (`comm`) only this rank's query rows (global row g with
  // g % size == rank, local row g / size); the other rows stay zero for the group to merge.
  void copy_dspark_features(const ForwardPlan& f, std::vector<BatchItem>& batch,
                            const comm::Communicator* comm);
  int32_t* history(const uint8_t* slot);
  // V4's MTP layer after an eager forward (model_executor_mtp.cc): each row's next token from the
  // items' tokens, their sampled tokens or BatchItem::mtp_next.
  void run_mtp(const ForwardPlan& f, const std::vector<BatchItem>& batch);

  ModelPlan plan_;
  EngramTables engram_;
  ExecutorOptions options_;
  std::unique_ptr<Backend> backend_;
  BackendWeights weights_;
  std::unique_ptr<StateLayout> layout_;
  MemoryPlan memory_;
  std::unique_ptr<KvPool> pool_;
  DequantWorkspaces workspaces_;
  std::vector<int32_t> histories_;  // every slot's Engram history (planning input, host side)
  std::unique_ptr<BackendHostCopy> host_copy_;
  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<DraftRunner> drafter_;  // when the weights hold the drafts
  bool mtp_ = false;  // V4: the weights hold the MTP layer (its ring follows every forward)
  DecodeGraphs graphs_;
  bool bf16_gemm_ = false;  // tensor-core GEMM inputs (precision "bf16" or "fp8")
  bool fp8_act_ = false;    // precision "fp8": FP8 inputs of FP8 / FP4 matrices
  // Switch::kProgrammaticLaunch: decode graphs of at most kProgrammaticLaunchMaxItems items chain
  // their kernels by programmatic dependent launch (model_executor.cc says why only those).
  bool programmatic_launch_ = true;
  static constexpr int64_t kProgrammaticLaunchMaxItems = 8;
  int64_t eager_forwards_ = 0, last_forward_us_ = 0;
  CpTiming cp_timing_;
};

}  // namespace dsv41rt::model
