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
  // V4's MTP layer writes its own ring row of a position from the token after it (the next row's,
  // or the sampled one for the last row): a state cut back to a shorter length would keep the
  // row of its new last position made from the dropped token, which a fresh forward does not.
  DSV41RT_CHECK_CODE(kUnsupported, !mtp_, plan_.config.source,
                     ": rollback (speculative decoding) is not built for DeepSeek-V4's MTP layer "
                     "(loaded by load_drafter): its ring row of the last kept position reads the "
                     "token after it");
  const std::vector<PendingSource> sources = pending_sources(plan_, *layout_);
  int64_t floats = 0;
  for (const BatchItem& b : batch) {
    if (!b.undo) continue;
    for (const PendingSource& ps : sources) floats += ps.capture_floats(b.n);
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
      k.rows[ps.key()] = next;
      next += ps.capture_floats(b.n);
    }
    runner_->capture_compressor.push_back(std::move(k));
  }
  return buffer;
}

void ModelExecutor::finish_undo(std::vector<BatchItem>& batch) {
  const Stream s = runner_->main();
  const std::vector<PendingSource> sources = pending_sources(plan_, *layout_);
  size_t next = 0;
  std::vector<float> captured;
  for (BatchItem& b : batch) {
    if (!b.undo || runner_->capture_compressor.empty()) continue;
    const CompressorCapture& k = runner_->capture_compressor[next++];
    float* out = b.undo->compressor_rows.data();
    for (const PendingSource& ps : sources) {  // the record's order: pending_sources()'s
      captured.resize(size_t(ps.capture_floats(k.n)));
      backend_->to_host(captured.data(), k.rows.at(ps.key()),
                        int64_t(captured.size() * sizeof(float)), s);
      backend_->synchronize(s);
      finish_capture(ps, b.undo->length, k.n, captured.data(), out);
      out += 2 * k.n * ps.width;
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
    if (layer.owns_compressor()) workspaces_.note_source_write(layer.index);
  }
}

}  // namespace dsv41rt::model
