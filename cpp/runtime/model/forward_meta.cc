#include "runtime/model/forward_meta.h"

#include <cstring>

namespace dsv41rt::model {

template <typename T>
size_t MetaUploader::add(const std::vector<T>& v) {
  const size_t at = (bytes_.size() + 15) / 16 * 16;
  bytes_.resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(bytes_.data() + at, v.data(), v.size() * sizeof(T));
  return at;
}

ForwardMeta MetaUploader::upload(Backend& be, const ForwardPlan& f, int64_t hc, const QueryRows* q,
                                 int64_t cp_size, Stream s, uint64_t& generation) {
  bytes_.clear();
  const size_t tokens = add(f.tokens), row_item = add(f.row_item), positions = add(f.positions),
               store = add(f.store_window), slots = add(f.slots), length = add(f.length),
               wfirst = add(f.window_first), old_count = add(f.old_count),
               old_offset = add(f.old_offset), row0 = add(f.row0), new_rows = add(f.new_rows),
               pages = add(f.page_table), head = add(f.head_rows);
  std::vector<float> onehot(size_t(f.rows * hc), 0.0f);
  for (int64_t t = 0; t < f.rows; ++t) onehot[size_t(t * hc)] = 1.0f;
  const size_t pre0 = add(onehot);
  struct RatioOffsets {
    size_t count, comp_offset, n_visible, key_offset, gi, gp, gf, ge, gpos, li, ls, ld, g0;
  };
  std::map<int, RatioOffsets> ro;
  for (const RatioPlan& r : f.ratios) {
    ro[r.ratio] = {add(r.count),       add(r.comp_offset), add(r.n_visible),
                   add(r.key_offset),  add(r.group_item),  add(r.group_pending),
                   add(r.group_first), add(r.group_entry), add(r.group_position),
                   add(r.left_item),   add(r.left_src),    add(r.left_dst),
                   add(r.group0)};
  }
  std::vector<size_t> engram;
  for (const auto& rows : f.engram_rows) engram.push_back(add(rows));
  size_t q_tokens = 0, q_item = 0, q_pos = 0, src_row = 0;
  std::vector<std::pair<size_t, size_t>> q_ratio;
  std::vector<size_t> q_engram;
  if (q) {
    q_tokens = add(q->tokens), q_item = add(q->row_item), q_pos = add(q->positions);
    for (size_t r = 0; r < f.ratios.size(); ++r) {
      q_ratio.emplace_back(add(q->n_visible[r]), add(q->key_offset[r]));
    }
    for (const auto& rows : q->engram_rows) q_engram.push_back(add(rows));
    std::vector<int64_t> src(size_t(f.rows));
    for (int64_t g = 0; g < f.rows; ++g)
      src[size_t(g)] = (g % cp_size) * q->max_local + g / cp_size;
    src_row = add(src);
  }
  const SamplePlan& sp = f.sample;
  const size_t s_row = add(sp.logit_row), s_params = add(sp.params), s_steps = add(sp.steps),
               s_poff = add(sp.prompt_off), s_ooff = add(sp.output_off);
  const size_t m_row = add(sp.mask_logit_row), m_words = add(sp.mask_words);  // none in graphs
  const size_t history = add(sp.history);  // last: its length varies within a decode bucket

  const int64_t n = std::max<int64_t>(int64_t(bytes_.size()), 16);
  if (n > staging_capacity_) {
    staging_ = be.alloc_host(2 * n);
    staging_capacity_ = 2 * n;
  }
  std::memcpy(staging_.get(), bytes_.data(), bytes_.size());
  device_.ensure([&be](int64_t b) { return be.alloc(b); }, n, generation);
  be.to_device(device_.get(), staging_.get(), int64_t(bytes_.size()), s);

  ForwardMeta m;
  m.tokens = at<int32_t>(tokens);
  m.row_item = at<int32_t>(row_item);
  m.positions = at<int64_t>(positions);
  m.store_window = at<uint8_t>(store);
  m.slots = at<uint8_t* const>(slots);
  m.length = at<int64_t>(length);
  m.window_first = at<int64_t>(wfirst);
  m.old_count = at<int64_t>(old_count);
  m.old_offset = at<int64_t>(old_offset);
  m.row0 = at<int64_t>(row0);
  m.new_rows = at<int64_t>(new_rows);
  m.page_table = at<int32_t>(pages);
  m.head_rows = at<int64_t>(head);
  m.pre0 = at<float>(pre0);
  for (const auto& [r, o] : ro) {
    m.ratio[r] = {at<int64_t>(o.count),      at<int64_t>(o.comp_offset), at<int64_t>(o.n_visible),
                  at<int64_t>(o.key_offset), at<int32_t>(o.gi),          at<int32_t>(o.li),
                  at<int64_t>(o.gp),         at<int64_t>(o.gf),          at<int64_t>(o.ge),
                  at<int64_t>(o.gpos),       at<int64_t>(o.ls),          at<int64_t>(o.ld),
                  at<int64_t>(o.g0)};
  }
  for (size_t off : engram) m.engram_rows.push_back(at<int64_t>(off));
  m.sample_logit_row = at<int64_t>(s_row);
  m.sample_params = at<kernels::SamplingParams>(s_params);
  m.sample_steps = at<uint64_t>(s_steps);
  m.prompt_off = at<int64_t>(s_poff);
  m.output_off = at<int64_t>(s_ooff);
  m.history = at<int32_t>(history);
  m.mask_logit_row = at<int64_t>(m_row);
  m.mask_words = at<uint32_t>(m_words);
  if (!q) {
    m.nq = f.rows;
    m.q_tokens = m.tokens, m.q_row_item = m.row_item, m.q_positions = m.positions;
    for (const auto& [r, o] : m.ratio) m.q_ratio[r] = {o.n_visible, o.key_offset};
    m.q_engram_rows = m.engram_rows;
    return m;
  }
  m.nq = q->rows;
  m.q_tokens = at<int32_t>(q_tokens);
  m.q_row_item = at<int32_t>(q_item);
  m.q_positions = at<int64_t>(q_pos);
  for (size_t r = 0; r < f.ratios.size(); ++r) {
    m.q_ratio[f.ratios[r].ratio] = {at<int64_t>(q_ratio[r].first), at<int64_t>(q_ratio[r].second)};
  }
  for (size_t off : q_engram) m.q_engram_rows.push_back(at<int64_t>(off));
  m.cp_src_row = at<int64_t>(src_row);
  return m;
}

}  // namespace dsv41rt::model
