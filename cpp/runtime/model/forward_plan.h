// Host-side planning of one batched forward for executors that run from device metadata (the
// CUDA executor). Everything the kernels need to address the paged state and to lay out the
// batch is computed here, from the items' lengths, page tables and token ids alone, so the run
// phase is a fixed launch sequence (plan/run split, docs/design/cuda-executor.md):
//   rows   (one per token of the batch): token, item, position, whether it enters the window ring
//   items  (one per request): slot address, length, window rows to unpack, page table
//   ratios (one per compression ratio in the model): entries per item and their workspace
//          offsets, visible entries per row, the compressor's complete groups and pending writes
//   Engram: the hashed table rows of every Engram layer (token ids only, so hashed here)
//   head:  the rows whose logits are wanted or sampled from
//   sample: per sampled row, its logits row, sampling parameters, step and penalty inputs
// Padded plans (graph capture) fill the metadata up to fixed capacities with item = -1 entries,
// which every kernel skips.
#pragma once

#include <cstdint>
#include <tuple>
#include <vector>

#include "core/export.h"
#include "kernels/sampling.h"
#include "runtime/model/executor.h"

namespace dsv41rt::model {

struct RatioPlan {
  int ratio = 0;
  bool compressor = false;  ///< a layer of this ratio owns a compressor (V4.1 Full, V4 CSA/HCA)
  int64_t max_count = 0;    ///< launch size: max entries of one item (capacity when padded)
  int64_t comp_rows = 0;    ///< workspace rows (sum of counts, or items * capacity)
  /// HCA's selection width (every visible entry, -1 after them): context_bucket(longest) / ratio,
  /// the padded decode plan's max_count, so that an eager forward and a decode graph hand the
  /// attention kernel the same key count (its split of the keys over blocks follows the count).
  int64_t visible_width = 0;
  std::vector<int64_t> count, comp_offset;     // [items] entries (P + n) / ratio; first row
  std::vector<int64_t> n_visible, key_offset;  // [rows] (t + 1) / ratio; comp_offset of the item
  // Complete compression groups of this forward: item, pending rows used, first new row, entry.
  std::vector<int32_t> group_item;
  std::vector<int64_t> group_pending, group_first, group_entry, group_position;
  // [items] the item's first group in the lists above: where the V4 compressor op
  // (Backend::v4_compress) writes the item's new entries.
  std::vector<int64_t> group0;
  // New rows that stay pending (ratio >= 2): item, batch row, pending row.
  std::vector<int32_t> left_item;
  std::vector<int64_t> left_src, left_dst;
};

/// The tokens a forward draws on the device (one per sampling item, from its last row).
struct SamplePlan {
  std::vector<int64_t> logit_row;               // [rows] index into the head rows
  std::vector<kernels::SamplingParams> params;  // [rows]
  std::vector<uint64_t> steps;                  // [rows]
  std::vector<int64_t> prompt_off, output_off;  // [rows + 1] into history (absolute)
  std::vector<int32_t> history;                 // penalty inputs: prompts, then outputs
  std::vector<int32_t> item;                    // [rows] the batch item (-1: padding)
  std::vector<int64_t> mask_logit_row;          // [masked] head rows whose tokens are masked
  std::vector<uint32_t> mask_words;             // [masked, token_mask_words(V)] their masks
  int32_t max_top = 0;  ///< top alternatives computed per row (kMaxTopLogprobs when padded)
  int64_t rows() const { return int64_t(logit_row.size()); }
};

/// The most top alternatives a request may ask for (kernels/sampling.h), computed for every
/// sampled row of a captured decode graph.
constexpr int32_t kMaxTopLogprobs = 20;

struct ForwardPlan {
  int64_t items = 0, rows = 0;
  int64_t old_rows = 0;  ///< window rows unpacked from the rings (launch size / capacity)
  int64_t max_old = 0;   ///< the most of one item
  int64_t max_pages = 0;
  std::vector<int32_t> tokens, row_item;  // [rows]
  std::vector<int64_t> positions;         // [rows]
  std::vector<uint8_t> store_window;      // [rows] position enters the ring
  std::vector<uint64_t> slots;            // [items] slot addresses (device memory)
  std::vector<int64_t> length, window_first, old_count, old_offset, row0;  // [items]
  std::vector<int64_t> new_rows;    ///< [items] rows of this forward (n; 0 for padding)
  std::vector<int32_t> page_table;  // [items, max_pages]
  std::vector<RatioPlan> ratios;
  std::vector<std::vector<int64_t>> engram_rows;  // per Engram layer [rows, (max_ngram-1)·heads]
  std::vector<int64_t> head_rows;                 // rows through the head, item order
  std::vector<int64_t> head_first;                // [items] first head row of each (-1: none)
  SamplePlan sample;

  DSV41RT_API const RatioPlan& ratio(int r) const;
};

/// The query rows one context-parallel rank computes: rows g % size == rank of a plan, with the
/// per-row "read" metadata sliced from it (tokens, items, positions, visible entries, Engram
/// rows). The state writes (window ring, compressor, pages) keep the plan's global rows and
/// locations: every rank writes the whole batch's state.
struct QueryRows {
  int64_t rows = 0;
  int64_t max_local = 0;        ///< ceil(plan rows / size): every rank's all-gather count
  std::vector<int64_t> global;  ///< [rows] the plan row of each
  std::vector<int32_t> tokens, row_item;
  std::vector<int64_t> positions;
  std::vector<std::vector<int64_t>> n_visible, key_offset;  ///< per plan ratio, [rows]
  std::vector<std::vector<int64_t>> engram_rows;            ///< per Engram layer [rows, cols]
};

QueryRows query_rows(const ForwardPlan& f, int rank, int size);

/// Plans `batch` (validated: tokens in the vocabulary, slots and pages present). `histories[i]`
/// holds item i's last history_len() token ids, oldest first (only the last min(length, hist)
/// are read). Throws Error naming the item on bad input, before anything runs.
DSV41RT_API ForwardPlan plan_forward(const ModelPlan& plan, const StateLayout& layout,
                                     const std::vector<BatchItem>& batch,
                                     const EngramTables& engram,
                                     const std::vector<const int32_t*>& histories);

/// Fixed launch shape of a captured decode graph: `items` requests of one token each, every
/// request shorter than `context` positions; whether logits are computed (head) and tokens drawn.
struct DecodeBucket {
  int64_t items = 0, context = 0;
  bool head = false, sample = false;
  auto key() const { return std::tuple(items, context, head, sample); }
  bool operator<(const DecodeBucket& o) const { return key() < o.key(); }
};

/// The context capacity of a request `longest` positions long: a power of two up to 8192 (at least
/// 256 and 2 x sliding_window), a multiple of 8192 beyond (padding costs indexer and top-k work
/// over the capacity's entries: at most 2x below 8192, at most 25% above 32k).
DSV41RT_API int64_t context_bucket(const ModelConfig& c, int64_t longest);

/// The bucket of a decode batch (every item n == 1): items rounded up to a power of two, context
/// the context_bucket of its longest item; {0, 0} when not a decode batch.
DSV41RT_API DecodeBucket decode_bucket(const ModelConfig& c, const std::vector<BatchItem>& batch);

/// `f` (a decode plan) padded to the bucket's capacities, so that every launch size and metadata
/// offset depends on the bucket alone: rows and items up to bucket.items (padding: item -1, token
/// 0), window rows at (sliding_window - 1) per item, compressed entries at context / ratio per
/// item, page tables at ceil(context / page_tokens) columns, compressor groups and pending writes
/// at one per item, logits for every row (when any were wanted), a token drawn for every row
/// (when any item samples; padding rows draw greedily and are ignored).
DSV41RT_API ForwardPlan pad_decode_plan(const ForwardPlan& f, const ModelConfig& c,
                                        const StateLayout& layout, DecodeBucket bucket);

}  // namespace dsv41rt::model
