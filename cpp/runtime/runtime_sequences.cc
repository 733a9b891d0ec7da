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
                        float* logits) {
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
  exec_.forward(batch);
  s.length += n;
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
  exec_.forward(batch);
  for (int64_t seq : seqs) find(seq).length += 1;
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
  exec_.forward(batch);
  for (size_t i = 0; i < batch.size(); ++i) {
    next[i] = sampled[i].token;
    logprobs[i] = sampled[i].logprob;
  }
  for (int64_t seq : seqs) find(seq).length += 1;
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
