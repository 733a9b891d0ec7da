// Direct sequences of a Runtime (runtime.hpp: open_sequence / forward / fork / decode /
// close_sequence): a request's slot and pages taken from the engine's pool and run through the
// executor without the scheduler (scoring, parity tests, benchmarks). Not thread-safe: the
// Runtime calls it under the lock that also guards the engine's steps.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "runtime/model/executor.h"
#include "runtime/model/state_undo.h"

namespace dsv41rt {

class Sequences {
 public:
  /// Asks the pool's other user (the engine's prefix cache) for one page / one slot back; false
  /// when it has none to give.
  struct Reclaim {
    std::function<bool()> page, slot;
  };

  explicit Sequences(model::Executor& exec, Reclaim reclaim = {})
      : exec_(exec), reclaim_(std::move(reclaim)) {}
  ~Sequences();
  Sequences(const Sequences&) = delete;
  Sequences& operator=(const Sequences&) = delete;

  int64_t open();
  /// Runs `n` tokens; logits of every new position (all_logits) or of the last: [rows, vocab].
  /// `undoable`: keep what they overwrite, so rollback() can take them back.
  void forward(int64_t seq, const int32_t* tokens, int64_t n, bool all_logits, float* logits,
               bool undoable = false);
  /// Takes back the last `r` positions of `seq`'s latest forward, which ran undoable (the rule:
  /// model/state_undo.h): its state becomes bitwise the shorter sequence's, the pages past the
  /// new length go back to the pool. Error(kInvalidArgument) for r < 0, Error(kOutOfRange) when
  /// they cannot be taken back (no undoable forward since the last decode / rollback floor).
  void rollback(int64_t seq, int64_t r);
  /// The most positions rollback() can take back from `seq` now.
  int64_t rollback_limit(int64_t seq);
  /// One greedy speculative step (Runtime::verify_greedy): one forward over [last, draft...],
  /// the longest draft prefix the target's greedy tokens agree with kept, the rest rolled back;
  /// returns the kept drafts and the target's next token.
  std::vector<int32_t> verify_greedy(int64_t seq, int32_t last, const std::vector<int32_t>& draft);
  /// The drafter's greedy block anchored at `last` (Runtime::draft_greedy).
  DraftBlock draft_greedy(int64_t seq, int32_t last);
  /// The pool owners these sequences hold (Runtime::check_invariants), after checking that each
  /// holds the pages its length needs.
  void owners(std::vector<const std::vector<int32_t>*>& tables, std::vector<int32_t>& slots) const;
  /// A new sequence holding a copy of `seq`'s state.
  int64_t fork(int64_t seq);
  /// One token per sequence in one batched forward; logits [seqs, vocab].
  void decode(const std::vector<int64_t>& seqs, const int32_t* tokens, float* logits);
  void decode_greedy(const std::vector<int64_t>& seqs, const int32_t* tokens, int32_t* next,
                     float* logprobs);
  void close(int64_t seq);
  /// `seq`'s state as one checked blob (runtime/sequence_state.h), for import into another
  /// runtime of the same model and pool layout; Error(kUnsupported) where the executor cannot
  /// copy its state to the host (context parallelism).
  std::vector<uint8_t> export_state(int64_t seq);
  /// A new sequence holding the state of a blob export_state made (here or in another runtime):
  /// it continues exactly as the exported sequence would. The blob is checked before any pool
  /// memory is taken.
  int64_t import_state(const uint8_t* data, size_t size);

 private:
  struct Sequence {
    int32_t slot = -1;
    std::vector<int32_t> pages;
    int64_t length = 0;
    model::UndoRecord undo;  // of the latest forward, when it ran undoable
    // With a drafter: the DSpark target features of positions [features_first, length), T * H
    // floats each (the drafter reads the last sliding_window; rows an undo may need are kept).
    std::vector<float> features;
    int64_t features_first = 0;
  };

  Sequence& find(int64_t seq);
  model::RequestView view(const Sequence& s) const;
  // One single-token item per sequence (distinct), pages reserved for the new position.
  std::vector<model::BatchItem> decode_batch(const std::vector<int64_t>& seqs,
                                             const int32_t* tokens);
  // Runs a decode batch of `seqs`: lengths, undo records and drafter features follow.
  void run_decode(const std::vector<int64_t>& seqs, std::vector<model::BatchItem>& batch);
  void free(Sequence& s);
  // Appends the features of `n` new positions (the forward's capture) and drops rows no draft or
  // rollback can read any more.
  void keep_features(Sequence& s, const std::vector<float>& rows, int64_t n);
  int64_t feature_width() const;
  /// Pages for `positions` positions of `s`, or Error(kOutOfRange) naming `what`.
  void reserve(Sequence& s, int64_t positions, int64_t seq);

  model::Executor& exec_;
  Reclaim reclaim_;
  std::map<int64_t, Sequence> seqs_;
  int64_t next_ = 1;
};

}  // namespace dsv41rt
