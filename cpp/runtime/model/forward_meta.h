// A forward's plan in backend memory: the host plan (forward_plan.h) packed into one buffer and
// uploaded with one copy, and the device address of every array the ops read. Arrays of fixed
// size for a decode bucket come first and the sampling history (variable length) last, so a
// captured graph's addresses hold for every plan of its bucket while the buffer does not move.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "kernels/sampling.h"
#include "runtime/model/backend.h"
#include "runtime/model/forward_plan.h"

namespace dsv41rt::model {

struct ForwardMeta {
  const int32_t *tokens = nullptr, *row_item = nullptr, *page_table = nullptr;
  const int64_t *positions = nullptr, *length = nullptr, *window_first = nullptr;
  const int64_t *old_count = nullptr, *old_offset = nullptr, *row0 = nullptr;
  const int64_t* new_rows = nullptr;
  const int64_t* head_rows = nullptr;
  const float* pre0 = nullptr;  ///< [rows, hc] one-hot(0): block 0 reads stream 0 (the embedding)
  const uint8_t* store_window = nullptr;
  uint8_t* const* slots = nullptr;
  struct Ratio {
    const int64_t *count, *comp_offset, *n_visible, *key_offset;
    const int32_t *group_item, *left_item;
    const int64_t *group_pending, *group_first, *group_entry, *group_position, *left_src, *left_dst;
    const int64_t* group0;
  };
  std::map<int, Ratio> ratio;
  std::vector<const int64_t*> engram_rows;
  // Query rows: this rank's under context parallelism (QueryRows), every row otherwise (then
  // these alias the arrays above).
  int64_t nq = 0;
  const int32_t *q_tokens = nullptr, *q_row_item = nullptr;
  const int64_t* q_positions = nullptr;
  struct QRatio {
    const int64_t *n_visible, *key_offset;
  };
  std::map<int, QRatio> q_ratio;
  std::vector<const int64_t*> q_engram_rows;
  const int64_t* cp_src_row = nullptr;  ///< [rows] all-gather slot of each plan row
  // Sampling.
  const int64_t *sample_logit_row = nullptr, *prompt_off = nullptr, *output_off = nullptr;
  const kernels::SamplingParams* sample_params = nullptr;
  const uint64_t* sample_steps = nullptr;
  const int32_t* history = nullptr;
  const int64_t* mask_logit_row = nullptr;  ///< SamplePlan's token masks (eager forwards only)
  const uint32_t* mask_words = nullptr;
};

/// Packs plans into host staging and uploads them into a growable backend buffer.
class MetaUploader {
 public:
  /// Uploads `f` (and `q`, this rank's query rows of a group of `cp_size`, when not null) on
  /// `s`; the staging buffer is reused by the next upload, so the caller synchronises `s` first.
  ForwardMeta upload(Backend& be, const ForwardPlan& f, int64_t hc, const QueryRows* q,
                     int64_t cp_size, Stream s, uint64_t& generation);
  const uint8_t* base() const { return device_.get(); }

 private:
  template <typename T>
  size_t add(const std::vector<T>& v);
  template <typename T>
  const T* at(size_t offset) const {
    return reinterpret_cast<const T*>(device_.get() + offset);
  }

  std::vector<uint8_t> bytes_;
  std::shared_ptr<void> staging_;
  int64_t staging_capacity_ = 0;
  DeviceArray<uint8_t> device_;
};

}  // namespace dsv41rt::model
