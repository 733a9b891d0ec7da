#include "runtime/model/forward_plan.h"

#include <algorithm>

#include "core/status.h"
#include "kernels/engram.h"

namespace dsv41rt::model {

const RatioPlan& ForwardPlan::ratio(int r) const {
  for (const RatioPlan& p : ratios) {
    if (p.ratio == r) return p;
  }
  DSV41RT_THROW_CODE(kInternal, "forward plan has no compression ratio ", r);
}

namespace {

// The compressor's groups and pending writes of one item (spec §2.4):
// the item's rows follow the P mod m pending rows; every complete group of m is pooled into
// entry P / m + g, the rest stays pending.
void plan_groups(RatioPlan& rp, int32_t item, int64_t P, int64_t n, int64_t row0) {
  const int64_t m = rp.ratio;
  const int64_t pending = m > 1 ? P % m : 0, total = pending + n, groups = total / m;
  for (int64_t g = 0; g < groups; ++g) {
    rp.group_item.push_back(item);
    rp.group_pending.push_back(g == 0 ? pending : 0);
    rp.group_first.push_back(g == 0 ? row0 : row0 + g * m - pending);
    rp.group_entry.push_back(P / m + g);
    rp.group_position.push_back((P / m + g) * m);  // the group's first position
  }
  if (m == 1) return;
  for (int64_t c = std::max(groups * m, pending); c < total; ++c) {
    rp.left_item.push_back(item);
    rp.left_src.push_back(row0 + c - pending);
    rp.left_dst.push_back(c - groups * m);
  }
}

// Row `logit_row` of the head draws item `item`'s next token. Penalty inputs go into the history
// only when a penalty reads them; the offsets are completed by finish_samples().
void add_sample(SamplePlan& sp, const SampleSpec& s, int64_t logit_row, int32_t item, int64_t V) {
  sp.logit_row.push_back(logit_row);
  if (s.mask) {
    sp.mask_logit_row.push_back(logit_row);
    sp.mask_words.insert(sp.mask_words.end(), s.mask, s.mask + kernels::token_mask_words(V));
  }
  sp.params.push_back(s.params);
  sp.steps.push_back(s.step);
  sp.item.push_back(item);
  sp.max_top = std::max(sp.max_top, s.params.top_logprobs);
  const bool penalised = s.params.repetition_penalty != 1.0f ||
                         s.params.frequency_penalty != 0.0f || s.params.presence_penalty != 0.0f;
  sp.prompt_off.push_back(penalised ? s.n_prompt : 0);  // lengths for now
  sp.output_off.push_back(penalised ? s.n_output : 0);
}

// Lengths -> absolute offsets into one history array (all prompts, then all outputs), filled
// from the items' SampleSpecs.
void finish_samples(SamplePlan& sp, const std::vector<BatchItem>& batch) {
  const size_t rows = sp.logit_row.size();
  std::vector<int64_t> np = sp.prompt_off, no = sp.output_off;
  sp.prompt_off.assign(rows + 1, 0);
  sp.output_off.assign(rows + 1, 0);
  for (size_t r = 0; r < rows; ++r) sp.prompt_off[r + 1] = sp.prompt_off[r] + np[r];
  sp.output_off[0] = sp.prompt_off[rows];
  for (size_t r = 0; r < rows; ++r) sp.output_off[r + 1] = sp.output_off[r] + no[r];
  sp.history.resize(size_t(sp.output_off[rows]));
  for (size_t r = 0; r < rows; ++r) {
    const SampleSpec& s = *batch[size_t(sp.item[r])].sample;
    std::copy(s.prompt, s.prompt + np[r], sp.history.begin() + sp.prompt_off[r]);
    std::copy(s.output, s.output + no[r], sp.history.begin() + sp.output_off[r]);
  }
}

}  // namespace

QueryRows query_rows(const ForwardPlan& f, int rank, int size) {
  DSV41RT_CHECK_CODE(kInternal, size >= 1 && rank >= 0 && rank < size, "rank ", rank, " of ", size);
  QueryRows q;
  q.max_local = (f.rows + size - 1) / size;
  for (int64_t g = rank; g < f.rows; g += size) q.global.push_back(g);
  q.rows = int64_t(q.global.size());
  q.n_visible.resize(f.ratios.size());
  q.key_offset.resize(f.ratios.size());
  q.engram_rows.resize(f.engram_rows.size());
  for (int64_t g : q.global) {
    q.tokens.push_back(f.tokens[g]);
    q.row_item.push_back(f.row_item[g]);
    q.positions.push_back(f.positions[g]);
    for (size_t r = 0; r < f.ratios.size(); ++r) {
      q.n_visible[r].push_back(f.ratios[r].n_visible[g]);
      q.key_offset[r].push_back(f.ratios[r].key_offset[g]);
    }
    for (size_t l = 0; l < f.engram_rows.size(); ++l) {
      const int64_t cols = int64_t(f.engram_rows[l].size()) / f.rows;
      q.engram_rows[l].insert(q.engram_rows[l].end(), f.engram_rows[l].begin() + g * cols,
                              f.engram_rows[l].begin() + (g + 1) * cols);
    }
  }
  return q;
}

ForwardPlan plan_forward(const ModelPlan& plan, const StateLayout& layout,
                         const std::vector<BatchItem>& batch, const EngramTables& engram,
                         const std::vector<const int32_t*>& histories) {
  const ModelConfig& c = plan.config;
  DSV41RT_CHECK(!batch.empty(), "forward needs at least one item");
  DSV41RT_CHECK(histories.size() == batch.size(), "one Engram history per item");
  const int64_t W = c.sliding_window, hist = layout.history_len();
  ForwardPlan f;
  f.items = int64_t(batch.size());

  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& b = batch[i];
    DSV41RT_CHECK(b.n > 0 && b.tokens, "batch item ", i, " has no tokens");
    DSV41RT_CHECK(b.request.slot != nullptr, "batch item ", i, " has no state slot");
    DSV41RT_CHECK(b.request.n_pages * layout.page_tokens() >= b.request.length + b.n, "batch item ",
                  i, ": pages cover ", b.request.n_pages * layout.page_tokens(),
                  " positions, the forward needs ", b.request.length + b.n);
    for (int64_t t = 0; t < b.n; ++t) {
      DSV41RT_CHECK(b.tokens[t] >= 0 && b.tokens[t] < c.vocab_size, "batch item ", i, ": token id ",
                    b.tokens[t], " at index ", t, " is outside the vocabulary [0, ", c.vocab_size,
                    ")");
    }
    if (b.sample) {
      DSV41RT_CHECK(b.sampled != nullptr, "batch item ", i, " samples but has no output");
      kernels::validate_sampling_params(b.sample->params, c.vocab_size);
      for (const auto& [ids, n] : {std::pair(b.sample->prompt, b.sample->n_prompt),
                                   std::pair(b.sample->output, b.sample->n_output)}) {
        DSV41RT_CHECK(n >= 0 && (n == 0 || ids), "batch item ", i, ": missing sampling history");
        for (int64_t t = 0; t < n; ++t) {
          DSV41RT_CHECK(ids[t] >= 0 && ids[t] < c.vocab_size, "batch item ", i,
                        ": sampling history token ", ids[t], " is outside the vocabulary");
        }
      }
    }
    const int64_t P = b.request.length;
    f.slots.push_back(reinterpret_cast<uint64_t>(b.request.slot));
    f.length.push_back(P);
    f.row0.push_back(f.rows);
    f.new_rows.push_back(b.n);
    const int64_t w0 = std::max<int64_t>(0, P - W + 1);
    f.window_first.push_back(w0);
    f.old_count.push_back(P - w0);
    f.old_offset.push_back(f.old_rows);
    f.old_rows += P - w0;
    f.max_old = std::max(f.max_old, P - w0);
    f.max_pages = std::max(f.max_pages, b.request.n_pages);
    for (int64_t t = 0; t < b.n; ++t) {
      f.tokens.push_back(b.tokens[t]);
      f.row_item.push_back(int32_t(i));
      f.positions.push_back(P + t);
      f.store_window.push_back(P + t >= P + b.n - W ? 1 : 0);  // the ring keeps the newest W
    }
    // Head rows: every row of an all-logits item, else the last row of an item that wants its
    // logits or samples; none for the others (a prefill chunk that does not sample).
    f.head_first.push_back(b.logits || b.sample ? int64_t(f.head_rows.size()) : -1);
    if (b.logits || b.sample) {
      for (int64_t t = b.logits && b.all_logits ? 0 : b.n - 1; t < b.n; ++t) {
        f.head_rows.push_back(f.rows + t);
      }
    }
    if (b.sample) {
      add_sample(f.sample, *b.sample, int64_t(f.head_rows.size()) - 1, int32_t(i), c.vocab_size);
    }
    f.rows += b.n;
  }
  finish_samples(f.sample, batch);
  f.max_pages = std::max<int64_t>(f.max_pages, 1);
  f.page_table.assign(f.items * f.max_pages, 0);
  for (int64_t i = 0; i < f.items; ++i) {
    const RequestView& r = batch[i].request;
    std::copy(r.pages, r.pages + r.n_pages, f.page_table.begin() + i * f.max_pages);
  }

  // Compression ratios, in the order of their first layer.
  for (const LayerPlan& layer : plan.layers) {
    if (layer.ratio <= 0) continue;
    auto it = std::find_if(f.ratios.begin(), f.ratios.end(),
                           [&](const RatioPlan& p) { return p.ratio == layer.ratio; });
    if (it == f.ratios.end()) {
      f.ratios.emplace_back();
      it = f.ratios.end() - 1;
      it->ratio = layer.ratio;
    }
    it->compressor = it->compressor || layer.owns_compressor();
  }
  int64_t longest = 0;
  for (int64_t i = 0; i < f.items; ++i) longest = std::max(longest, f.length[i] + batch[i].n);
  for (RatioPlan& rp : f.ratios) {
    const int64_t m = rp.ratio;
    rp.visible_width = context_bucket(plan.config, longest) / m;
    for (int64_t i = 0; i < f.items; ++i) {
      const int64_t P = f.length[i], n = batch[i].n, T = (P + n) / m;
      rp.count.push_back(T);
      rp.comp_offset.push_back(rp.comp_rows);
      rp.comp_rows += T;
      rp.max_count = std::max(rp.max_count, T);
      for (int64_t t = 0; t < n; ++t) {
        rp.n_visible.push_back((P + t + 1) / m);
        rp.key_offset.push_back(rp.comp_offset.back());
      }
      if (rp.compressor) {
        rp.group0.push_back(int64_t(rp.group_item.size()));
        plan_groups(rp, int32_t(i), P, n, f.row0[i]);
      }
    }
  }

  // Engram: compressed ids of (history, chunk) per item, hashed into table rows per layer.
  if (c.engram) {
    const EngramSpec& e = *c.engram;
    const int64_t cols = int64_t(e.max_ngram_size - 1) * e.n_heads;
    const int64_t pad = engram.token_map[e.pad_token_id];
    f.engram_rows.assign(engram.layers.size(), std::vector<int64_t>(f.rows * cols));
    for (int64_t i = 0; i < f.items; ++i) {
      const BatchItem& b = batch[i];
      const int64_t P = f.length[i];
      std::vector<int64_t> cids(hist + b.n, -1);  // positions before 0 block the lookback
      for (int64_t s = std::max<int64_t>(0, hist - P); s < hist; ++s) {
        cids[s] = engram.token_map[histories[i][s]];
      }
      for (int64_t t = 0; t < b.n; ++t) cids[hist + t] = engram.token_map[b.tokens[t]];
      for (size_t l = 0; l < engram.layers.size(); ++l) {
        const EngramTables::Layer& L = engram.layers[l];
        kernels::cpu::engram_hash_rows(cids.data(), b.n, e.max_ngram_size, e.n_heads,
                                       L.multipliers.data(), L.primes.data(), L.offsets.data(), pad,
                                       f.engram_rows[l].data() + f.row0[i] * cols);
      }
    }
  }
  return f;
}

namespace {

int64_t pow2_at_least(int64_t v, int64_t floor) {
  int64_t p = 1;
  while (p < v || p < floor) p *= 2;
  return p;
}

// The sample plan of a decode batch (item i = row i) padded to B rows, row b drawing for item b:
// items that do not sample, and padding, draw greedily with no history and are not read.
SamplePlan pad_samples(const SamplePlan& sp, int64_t B) {
  std::vector<int64_t> from(size_t(B), -1);  // the unpadded sample row of each padded row
  for (int64_t r = 0; r < sp.rows(); ++r) from[size_t(sp.item[r])] = r;
  SamplePlan p;
  p.max_top = kMaxTopLogprobs;
  p.prompt_off.push_back(0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = from[size_t(b)];
    p.logit_row.push_back(b);
    p.params.push_back(r < 0 ? kernels::SamplingParams{0.0f} : sp.params[r]);
    p.steps.push_back(r < 0 ? 0 : sp.steps[r]);
    p.item.push_back(r < 0 ? -1 : sp.item[r]);
    if (r >= 0) {
      p.history.insert(p.history.end(), sp.history.begin() + sp.prompt_off[r],
                       sp.history.begin() + sp.prompt_off[r + 1]);
    }
    p.prompt_off.push_back(int64_t(p.history.size()));
  }
  p.output_off.push_back(int64_t(p.history.size()));
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = from[size_t(b)];
    if (r >= 0) {
      p.history.insert(p.history.end(), sp.history.begin() + sp.output_off[r],
                       sp.history.begin() + sp.output_off[r + 1]);
    }
    p.output_off.push_back(int64_t(p.history.size()));
  }
  return p;
}

template <typename T>
void pad_to(std::vector<T>& v, size_t n, T value) {
  if (v.size() < n) v.resize(n, value);
}

}  // namespace

int64_t context_bucket(const ModelConfig& c, int64_t longest) {
  const int64_t floor = std::max<int64_t>(256, 2 * c.sliding_window);
  const int64_t context =
      longest <= 8192 ? pow2_at_least(longest, floor) : (longest + 8191) / 8192 * 8192;
  return std::max(context, floor);
}

DecodeBucket decode_bucket(const ModelConfig& c, const std::vector<BatchItem>& batch) {
  int64_t longest = 0;
  bool head = false, sample = false;
  for (const BatchItem& b : batch) {
    if (b.n != 1) return {};
    longest = std::max(longest, b.request.length + 1);
    head = head || b.logits;
    sample = sample || b.sample;
  }
  return {pow2_at_least(int64_t(batch.size()), 1), context_bucket(c, longest), head, sample};
}

ForwardPlan pad_decode_plan(const ForwardPlan& f, const ModelConfig& c, const StateLayout& layout,
                            DecodeBucket bucket) {
  const int64_t B = bucket.items, W = c.sliding_window;
  DSV41RT_CHECK_CODE(kInternal, f.rows == f.items && f.items <= B, "not a decode plan of <= ", B,
                     " items");
  ForwardPlan p = f;
  p.rows = p.items = B;
  pad_to<int32_t>(p.tokens, B, 0);
  pad_to<int32_t>(p.row_item, B, -1);
  pad_to<int64_t>(p.positions, B, 0);
  pad_to<uint8_t>(p.store_window, B, 0);
  pad_to<uint64_t>(p.slots, B, 0);
  pad_to<int64_t>(p.length, B, 0);
  pad_to<int64_t>(p.window_first, B, 0);
  pad_to<int64_t>(p.old_count, B, 0);
  pad_to<int64_t>(p.new_rows, B, 0);
  p.row0.resize(B);
  p.old_offset.resize(B);
  for (int64_t b = 0; b < B; ++b) {
    p.row0[b] = b;
    p.old_offset[b] = b * (W - 1);
  }
  p.max_old = W - 1;
  p.old_rows = B * (W - 1);
  p.max_pages = (bucket.context + layout.page_tokens() - 1) / layout.page_tokens();
  p.page_table.assign(B * p.max_pages, 0);
  for (int64_t b = 0; b < f.items; ++b) {
    const int64_t n = std::min(f.max_pages, p.max_pages);
    std::copy(f.page_table.begin() + b * f.max_pages, f.page_table.begin() + b * f.max_pages + n,
              p.page_table.begin() + b * p.max_pages);
  }
  for (RatioPlan& r : p.ratios) {
    const int64_t cap = bucket.context / r.ratio;
    pad_to<int64_t>(r.count, B, 0);
    r.max_count = cap;
    r.visible_width = cap;
    r.comp_rows = B * cap;
    r.comp_offset.resize(B);
    for (int64_t b = 0; b < B; ++b) r.comp_offset[b] = b * cap;
    pad_to<int64_t>(r.n_visible, B, 0);
    r.key_offset.resize(B);
    for (int64_t row = 0; row < B; ++row) r.key_offset[row] = row * cap;  // row == item
    if (r.compressor) {
      pad_to<int32_t>(r.group_item, B, -1);
      pad_to<int64_t>(r.group_pending, B, 0);
      pad_to<int64_t>(r.group_first, B, 0);
      pad_to<int64_t>(r.group_entry, B, 0);
      pad_to<int64_t>(r.group_position, B, 0);
      // Padding items have no rows: they write nothing from wherever they start.
      pad_to<int64_t>(r.group0, B, int64_t(f.ratio(r.ratio).group_item.size()));
      if (r.ratio > 1) {
        pad_to<int32_t>(r.left_item, B, -1);
        pad_to<int64_t>(r.left_src, B, 0);
        pad_to<int64_t>(r.left_dst, B, 0);
      }
    }
  }
  for (auto& rows : p.engram_rows) pad_to<int64_t>(rows, B * (rows.size() / f.rows), 0);
  // Every row goes through the head and draws a token when the bucket says so (fixed launch
  // sizes); padding rows draw greedily without history, and nobody reads their results.
  p.head_rows.clear();
  p.head_first.assign(B, -1);
  if (bucket.head || bucket.sample) {
    for (int64_t b = 0; b < B; ++b) p.head_rows.push_back(b), p.head_first[b] = b;
  }
  if (bucket.sample) p.sample = pad_samples(f.sample, B);
  return p;
}

}  // namespace dsv41rt::model
