#include "runtime/runtime_sequences.h"

#include "core/status.h"
#include "runtime/sequence_state.h"

namespace dsv41rt {

Sequences::~Sequences() {
  for (auto& [id, s] : seqs_) free(s);
}

int64_t Sequences::open() {
  Sequence s;
  s.slot = exec_.pool().alloc_slot();
  while (s.slot < 0 && reclaim_.slot && reclaim_.slot()) s.slot = exec_.pool().alloc_slot();
  DSV41RT_CHECK_CODE(kOutOfRange, s.slot >= 0, "no free request slot: ", exec_.pool().describe(),
                     "; close a sequence or finish requests first");
  seqs_.emplace(next_, std::move(s));
  return next_++;
}

void Sequences::forward(int64_t seq, const int32_t* tokens, int64_t n, bool all_logits,
                        float* logits, bool undoable) {
  Sequence& s = find(seq);
  DSV41RT_CHECK(n > 0 && tokens, "forward: no tokens for sequence ", seq);
  DSV41RT_CHECK(logits, "forward: logits is NULL");
  reserve(s, s.length + n, seq);
  std::vector<model::BatchItem> batch(1);
  batch[0].request = view(s);
  batch[0].tokens = tokens;
  batch[0].n = n;
  batch[0].logits = logits;
  batch[0].all_logits = all_logits;
  model::UndoRecord record;
  if (undoable) batch[0].undo = &record;
  std::vector<float> features;
  if (exec_.has_drafter()) batch[0].dspark_features = &features;
  // V4's MTP layer reads the token after the last row: the greedy one.
  model::SampleSpec greedy;
  greedy.params.temperature = 0.0f;
  kernels::SampledToken sampled;
  if (exec_.has_mtp()) batch[0].sample = &greedy, batch[0].sampled = &sampled;
  s.undo = {};  // the state it described is about to change
  exec_.forward(batch);
  s.length += n;
  s.undo = std::move(record);
  if (exec_.has_drafter()) keep_features(s, features, n);
}

int64_t Sequences::rollback_limit(int64_t seq) {
  const Sequence& s = find(seq);
  const int64_t done = s.length - s.undo.length;
  return s.undo.can_restore(s.length, s.undo.length) ? done : 0;
}

void Sequences::rollback(int64_t seq, int64_t r) {
  Sequence& s = find(seq);
  DSV41RT_CHECK_CODE(kInvalidArgument, r >= 0, "rollback: ", r,
                     " positions (must be >= 0) for sequence ", seq);
  if (r == 0) return;
  DSV41RT_CHECK_CODE(kOutOfRange, s.undo.recorded(), "rollback: sequence ", seq,
                     " has no undoable forward to take positions back from (run forward with "
                     "undoable = true; a decode replaces it)");
  const int64_t limit = rollback_limit(seq);
  DSV41RT_CHECK_CODE(
      kOutOfRange, r <= limit && s.undo.can_restore(s.length, s.length - r), "rollback: ", r,
      " positions of sequence ", seq, " (length ", s.length, "); its last undoable forward ran ",
      s.undo.n, " from ", s.undo.length, ", so at most ", limit,
      s.undo.n > s.undo.window ? ", and only all of them (longer than the window)" : "",
      " can be taken back");
  model::RequestView v = view(s);
  exec_.undo(v, s.undo, s.length - r);
  s.length -= r;
  if (s.length >= s.features_first) {
    s.features.resize(size_t((s.length - s.features_first) * feature_width()));
  } else {
    s.features.clear();
    s.features_first = s.length;
  }
  std::vector<int32_t> tail(s.pages.begin() + exec_.pool().pages_for(s.length), s.pages.end());
  s.pages.resize(s.pages.size() - tail.size());
  exec_.pool().free_pages(tail);
}

void Sequences::owners(std::vector<const std::vector<int32_t>*>& tables,
                       std::vector<int32_t>& slots) const {
  for (const auto& [id, s] : seqs_) {
    // (>=: a forward that failed keeps the pages it reserved until the sequence closes)
    DSV41RT_CHECK_CODE(kInternal, int64_t(s.pages.size()) >= exec_.pool().pages_for(s.length),
                       "sequence ", id, " of length ", s.length, " holds ", s.pages.size(),
                       " pages, it needs ", exec_.pool().pages_for(s.length));
    DSV41RT_CHECK_CODE(
        kInternal,
        !s.undo.recorded() || (s.undo.length <= s.length && s.length <= s.undo.length + s.undo.n),
        "sequence ", id, " of length ", s.length, " keeps an undo record of ", s.undo.n,
        " positions from ", s.undo.length);
    tables.push_back(&s.pages);
    slots.push_back(s.slot);
  }
}

int64_t Sequences::fork(int64_t seq) {
  const Sequence& src = find(seq);
  const int64_t id = open();
  Sequence& dst = seqs_.at(id);
  try {
    reserve(dst, src.length, seq);
  } catch (...) {
    close(id);
    throw;
  }
  exec_.copy_state(view(src), view(dst));
  dst.length = src.length;
  dst.features = src.features;
  dst.features_first = src.features_first;
  return id;
}

std::vector<model::BatchItem> Sequences::decode_batch(const std::vector<int64_t>& seqs,
                                                      const int32_t* tokens) {
  const size_t B = seqs.size();
  DSV41RT_CHECK(B > 0 && tokens, "decode: no sequences or tokens");
  for (size_t i = 0; i < B; ++i) {
    for (size_t j = 0; j < i; ++j) {
      DSV41RT_CHECK(seqs[i] != seqs[j], "decode: sequence ", seqs[i], " given twice");
    }
  }
  std::vector<model::BatchItem> batch(B);
  for (size_t i = 0; i < B; ++i) {
    Sequence& s = find(seqs[i]);
    reserve(s, s.length + 1, seqs[i]);
    batch[i].request = view(s);
    batch[i].tokens = tokens + i;
    batch[i].n = 1;
    batch[i].all_logits = false;
  }
  return batch;
}

void Sequences::decode(const std::vector<int64_t>& seqs, const int32_t* tokens, float* logits) {
  DSV41RT_CHECK(logits, "decode: no logits buffer");
  std::vector<model::BatchItem> batch = decode_batch(seqs, tokens);
  const int64_t V = exec_.plan().config.vocab_size;
  for (size_t i = 0; i < batch.size(); ++i) batch[i].logits = logits + int64_t(i) * V;
  run_decode(seqs, batch);
}

void Sequences::run_decode(const std::vector<int64_t>& seqs, std::vector<model::BatchItem>& batch) {
  std::vector<std::vector<float>> features(batch.size());
  model::SampleSpec greedy;  // V4's MTP layer reads each item's next token (the greedy one)
  greedy.params.temperature = 0.0f;
  std::vector<kernels::SampledToken> sampled(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (exec_.has_mtp() && !batch[i].sample)
      batch[i].sample = &greedy, batch[i].sampled = &sampled[i];
    if (exec_.has_drafter()) batch[i].dspark_features = &features[i];
    find(seqs[i]).undo = {};
  }
  exec_.forward(batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    Sequence& s = find(seqs[i]);
    s.length += 1;
    if (exec_.has_drafter()) keep_features(s, features[i], 1);
  }
}

void Sequences::decode_greedy(const std::vector<int64_t>& seqs, const int32_t* tokens,
                              int32_t* next, float* logprobs) {
  DSV41RT_CHECK(next && logprobs, "decode_greedy: no output buffers");
  std::vector<model::BatchItem> batch = decode_batch(seqs, tokens);
  model::SampleSpec greedy;
  greedy.params.temperature = 0.0f;
  std::vector<kernels::SampledToken> sampled(batch.size());
  for (size_t i = 0; i < batch.size(); ++i)
    batch[i].sample = &greedy, batch[i].sampled = &sampled[i];
  run_decode(seqs, batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    next[i] = sampled[i].token;
    logprobs[i] = sampled[i].logprob;
  }
}

std::vector<uint8_t> Sequences::export_state(int64_t seq) {
  const Sequence& s = find(seq);
  return export_sequence_state(exec_, s.slot, s.pages.data(), s.length);
}

int64_t Sequences::import_state(const uint8_t* data, size_t size) {
  const SequenceStateView v = check_sequence_state(exec_, data, size);
  const int64_t id = open();
  try {
    Sequence& s = seqs_.at(id);
    reserve(s, v.header.length, id);
    write_sequence_state(exec_, v, s.slot, s.pages.data());
    s.length = v.header.length;
    s.features_first = s.length;  // the blob carries no drafter features
  } catch (...) {
    close(id);
    throw;
  }
  return id;
}

void Sequences::close(int64_t seq) {
  free(find(seq));
  seqs_.erase(seq);
}

Sequences::Sequence& Sequences::find(int64_t seq) {
  auto it = seqs_.find(seq);
  DSV41RT_CHECK_CODE(kNotFound, it != seqs_.end(), "unknown sequence handle ", seq);
  return it->second;
}

model::RequestView Sequences::view(const Sequence& s) const {
  return {exec_.pool().slot_data(s.slot), s.pages.data(), int64_t(s.pages.size()), s.length};
}

void Sequences::free(Sequence& s) {
  exec_.pool().free_pages(s.pages);
  if (s.slot >= 0) exec_.pool().free_slot(s.slot);
  s.slot = -1;
}

void Sequences::reserve(Sequence& s, int64_t positions, int64_t seq) {
  bool reserved = false;
  while (!(reserved = exec_.pool().ensure_pages(s.pages, positions)) && reclaim_.page &&
         reclaim_.page()) {
  }
  DSV41RT_CHECK_CODE(kOutOfRange, reserved, "KV pool exhausted: sequence ", seq, " needs ",
                     positions, " positions; ", exec_.pool().describe());
}

}  // namespace dsv41rt
