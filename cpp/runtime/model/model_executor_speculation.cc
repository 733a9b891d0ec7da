// ModelExecutor's part of speculative decoding (docs/design/dspark.md): undo records of the
// forwards that may be taken back (model/state_undo.h), the drafter's target features of a
// forward's rows, and the DSpark drafter over the executor's own backend and weights.
#include <algorithm>

#include "core/status.h"
#include "runtime/model/model_executor.h"
#include "runtime/model/state_undo.h"

namespace dsv41rt::model {

std::shared_ptr<void> ModelExecutor::begin_undo(const ForwardPlan& f,
                                                std::vector<BatchItem>& batch) {
  // V4's slots hold its compressors' state, which the undo records do not copy yet.
  DSV41RT_CHECK_CODE(kUnsupported, plan_.config.is_v41(), plan_.config.source,
                     ": rollback (speculative decoding) is not built for DeepSeek-V4");
  const std::vector<PendingSource> sources = pending_sources(plan_, *layout_);
  const int64_t D = plan_.config.head_dim;
  int64_t floats = 0;
  for (const BatchItem& b : batch) {
    if (b.undo) floats += int64_t(sources.size()) * 2 * b.n * D;
  }
  std::shared_ptr<void> buffer =
      floats > 0 ? backend_->alloc(floats * int64_t(sizeof(float))) : nullptr;
  auto* next = static_cast<float*>(buffer.get());
  runner_->capture_compressor.clear();
  for (size_t i = 0; i < batch.size(); ++i) {
    BatchItem& b = batch[i];
    if (!b.undo) continue;
    save_undo(*backend_, plan_, *layout_, b.request.slot, history(b.request.slot), b.request.length,
              b.tokens, b.n, *b.undo);
    if (sources.empty()) continue;
    CompressorCapture k;
    k.row0 = f.row0[i];
    k.n = b.n;
    for (const PendingSource& ps : sources) {
      k.rows[ps.layer] = next;
      next += 2 * b.n * D;
    }
    runner_->capture_compressor.push_back(std::move(k));
  }
  return buffer;
}

void ModelExecutor::finish_undo(std::vector<BatchItem>& batch) {
  const Stream s = runner_->main();
  size_t next = 0;
  for (BatchItem& b : batch) {
    if (!b.undo || runner_->capture_compressor.empty()) continue;
    const CompressorCapture& k = runner_->capture_compressor[next++];
    float* out = b.undo->compressor_rows.data();
    const int64_t D = plan_.config.head_dim;
    for (const auto& [layer, rows] : k.rows) {  // layer order: pending_sources()'s order
      backend_->to_host(out, rows, 2 * k.n * D * int64_t(sizeof(float)), s);
      out += 2 * k.n * D;
    }
  }
  backend_->synchronize(s);
  runner_->capture_compressor.clear();
}

void ModelExecutor::copy_dspark_features(const ForwardPlan& f, std::vector<BatchItem>& batch,
                                         const comm::Communicator* comm) {
  const ModelConfig& c = plan_.config;
  const std::vector<int>& layers = c.dspark->target_layer_ids;
  const int64_t H = c.hidden_size, T = int64_t(layers.size());
  const int64_t P = comm ? comm->size() : 1, rank = comm ? comm->rank() : 0;
  const Decisions& d = runner_->decisions();
  for (size_t i = 0; i < batch.size(); ++i) {
    BatchItem& b = batch[i];
    if (!b.dspark_features) continue;
    std::vector<float>& out = *b.dspark_features;
    out.assign(size_t(b.n * T * H), 0.0f);
    for (int64_t t = 0; t < T; ++t) {
      auto found = d.dspark_features.find(layers[size_t(t)]);
      if (found == d.dspark_features.end()) continue;  // a CP rank without query rows
      const std::vector<float>& rows = found->second;
      for (int64_t r = 0; r < b.n; ++r) {
        const int64_t g = f.row0[i] + r;  // the batch's global row
        if (g % P != rank) continue;      // another rank's query row
        const float* src = rows.data() + (g / P) * H;
        std::copy(src, src + H, out.begin() + (r * T + t) * H);
      }
    }
  }
}

void ModelExecutor::draft_greedy(const DraftInputs& in, DraftOutputs& out) {
  DSV41RT_CHECK_CODE(kUnsupported, drafter_ != nullptr,
                     "this executor has no DSpark drafter (load the runtime with load_drafter)");
  backend_->activate();
  out = drafter_->run_greedy(in);
}

void ModelExecutor::undo(const RequestView& request, const UndoRecord& record, int64_t length) {
  DSV41RT_CHECK(request.slot != nullptr, "undo: the request has no state slot");
  backend_->activate();
  restore_undo(*backend_, plan_, *layout_, request.slot, history(request.slot), record,
               request.length, length);
  // No workspace row outlives a forward; still, the sources' entries past `length` are gone.
  for (const LayerPlan& layer : plan_.layers) {
    if (layer.role == LayerRole::kFull) workspaces_.note_source_write(layer.index);
  }
}

}  // namespace dsv41rt::model
