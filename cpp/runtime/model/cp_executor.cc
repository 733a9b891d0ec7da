#include "runtime/model/cp_executor.h"

#include <algorithm>
#include <exception>
#include <memory>
#include <thread>

#include "core/status.h"
#include "runtime/model/delegating_executor.h"

namespace dsv41rt::model {
namespace {

// A group's host copy: every rank holds the whole state, bitwise alike (context parallelism writes
// every row's state on every rank; tensor/expert ranks compute the whole latent KV, index keys and
// Engram history), so a copy to the host reads rank 0's and a copy from the host writes every
// rank's (the same page and slot ids in each pool).
class GroupHostCopy final : public HostStateCopy {
 public:
  explicit GroupHostCopy(std::vector<HostStateCopy*> ranks) : ranks_(std::move(ranks)) {}
  int64_t page_bytes() const override { return ranks_[0]->page_bytes(); }
  int64_t slot_state_bytes() const override { return ranks_[0]->slot_state_bytes(); }
  std::shared_ptr<uint8_t> alloc_host(int64_t bytes) override {
    return ranks_[0]->alloc_host(bytes);
  }
  void page_to_host(int32_t page, uint8_t* dst) override { ranks_[0]->page_to_host(page, dst); }
  void slot_to_host(int32_t slot, uint8_t* dst) override { ranks_[0]->slot_to_host(slot, dst); }
  void page_from_host(const uint8_t* src, int32_t page) override {
    for (HostStateCopy* r : ranks_) r->page_from_host(src, page);
  }
  void slot_from_host(const uint8_t* src, int32_t slot) override {
    for (HostStateCopy* r : ranks_) r->slot_from_host(src, slot);
  }

 private:
  std::vector<HostStateCopy*> ranks_;
};

class CpExecutor final : public DelegatingExecutor {
 public:
  // context_parallel: prefill forwards split their queries over the CP ranks (else every forward
  // runs whole on every rank: the tensor/expert-parallel group). Executor i is tensor/expert rank
  // i % group.size of CP rank i / group.size; comms[i] is its CP communicator (or, without CP, its
  // group communicator); group.inner keeps the tensor/expert communicators of a CP x TP grid alive.
  CpExecutor(std::vector<std::shared_ptr<Executor>> ranks,
             std::vector<std::unique_ptr<comm::Communicator>> comms, bool context_parallel,
             GroupShape group = {})
      : DelegatingExecutor(ranks.empty() ? nullptr : ranks[0].get()),
        ranks_(std::move(ranks)),
        comms_(std::move(comms)),
        context_parallel_(context_parallel),
        group_(std::move(group)) {
    DSV41RT_CHECK(!ranks_.empty() && ranks_.size() == comms_.size(),
                  "a context-parallel group needs ranks and one communicator each (", ranks_.size(),
                  " executors, ", comms_.size(), " communicators)");
    const int64_t per = context_parallel_ ? group_.size : int64_t(ranks_.size());
    DSV41RT_CHECK(per >= 1 && int64_t(ranks_.size()) % per == 0, "a grid of ", ranks_.size(),
                  " ranks in groups of ", per);
    const model::PoolGeometry& g = ranks_[0]->pool().geometry();
    for (size_t r = 0; r < ranks_.size(); ++r) {
      const model::PoolGeometry& gr = ranks_[r]->pool().geometry();
      const int want = context_parallel_ ? int(int64_t(r) / per) : int(r);
      const int size = context_parallel_ ? int(int64_t(ranks_.size()) / per) : int(ranks_.size());
      DSV41RT_CHECK(comms_[r]->rank() == want && comms_[r]->size() == size, "communicator ", r,
                    " is rank ", comms_[r]->rank(), " of ", comms_[r]->size());
      DSV41RT_CHECK(
          gr.page_bytes == g.page_bytes && gr.slot_bytes == g.slot_bytes &&
              ranks_[r]->pool().usage().pages_total == ranks_[0]->pool().usage().pages_total &&
              ranks_[r]->pool().usage().slots_total == ranks_[0]->pool().usage().slots_total,
          "context-parallel rank ", r, " has a different pool than rank 0");
    }
    std::vector<HostStateCopy*> copies;
    for (auto& r : ranks_) copies.push_back(r->host_state_copy());
    if (std::find(copies.begin(), copies.end(), nullptr) == copies.end()) {
      host_copy_ = std::make_unique<GroupHostCopy>(std::move(copies));
    }
  }

  HostStateCopy* host_state_copy() override { return host_copy_.get(); }

  void forward(std::vector<BatchItem>& batch) override {
    // bad input fails here, before any rank runs
    check_cp_batch(*this, batch, speculation());
    if (!context_parallel_) {
      on_every_rank(batch, [&](int r, std::vector<BatchItem>& mine) { ranks_[r]->forward(mine); });
      return;
    }
    bool prefill = false;
    for (const BatchItem& b : batch) prefill = prefill || b.n > 1;
    cp_forwards_ += prefill ? 1 : 0;
    // Speculation: every rank writes the same state, so rank 0's undo record serves every rank
    // (undo() restores each rank's slot from it). A drafter's features of a context-parallel
    // forward come from the rank that computed each row (its query rows), merged into rank 0's.
    const int P = int(ranks_.size());
    const bool merge = prefill && std::any_of(batch.begin(), batch.end(), [](const BatchItem& b) {
                         return b.dspark_features != nullptr;
                       });
    std::vector<std::vector<std::vector<float>>> features{size_t(merge ? P : 0)};
    on_every_rank(batch, [&](int r, std::vector<BatchItem>& mine) {
      if (r > 0) {
        if (merge) features[size_t(r)].resize(mine.size());
        for (size_t i = 0; i < mine.size(); ++i) {
          mine[i].undo = nullptr;
          if (mine[i].dspark_features) {
            mine[i].dspark_features = merge ? &features[size_t(r)][i] : nullptr;
          }
        }
      }
      run_cp_forward(*ranks_[r], *comms_[r], mine);
    });
    if (!merge) return;  // none asked, or a replicated forward: rank 0's are every row's
    int64_t g = 0;       // the batch's global rows, in item order
    for (size_t i = 0; i < batch.size(); ++i) {
      BatchItem& b = batch[i];
      if (b.dspark_features) {
        const size_t row = b.dspark_features->size() / size_t(b.n);
        for (int64_t j = 0; j < b.n; ++j) {
          const int owner = int((g + j) % P);
          if (owner == 0) continue;
          const std::vector<float>& src = features[size_t(owner)][i];
          std::copy(src.begin() + ptrdiff_t(size_t(j) * row),
                    src.begin() + ptrdiff_t(size_t(j + 1) * row),
                    b.dspark_features->begin() + ptrdiff_t(size_t(j) * row));
        }
      }
      g += b.n;
    }
  }

  // Speculation (context parallelism alone): every rank holds the same state, so rank 0's record
  // restores each rank's slot, and rank 0's drafter drafts for the group.
  void undo(const RequestView& request, const UndoRecord& record, int64_t length) override {
    require_speculation("rollback");
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->undo(translate(int(r), request), record, length);
    }
  }
  bool has_drafter() const override { return speculation() && ranks_[0]->has_drafter(); }
  void draft_greedy(const DraftInputs& in, DraftOutputs& out) override {
    require_speculation("drafting");
    ranks_[0]->draft_greedy(in, out);
  }

  void forward_cp(std::vector<BatchItem>&, comm::Communicator&) override {
    DSV41RT_THROW_CODE(kUnsupported, "a context-parallel group cannot be a rank of another");
  }

  void copy_state(const RequestView& src, const RequestView& dst) override {
    for (size_t r = 0; r < ranks_.size(); ++r) {
      ranks_[r]->copy_state(translate(int(r), src), translate(int(r), dst));
    }
  }

  BackendStats backend_stats() const override {
    BackendStats s = ranks_[0]->backend_stats();
    if (context_parallel_) {
      s.cp_size = int64_t(ranks_.size()) / group_.size;
      s.cp_forwards = cp_forwards_;  // forwards run context-parallel (the rest replicated)
    }
    s.tp_size = group_.tp, s.ep_size = group_.ep;
    return s;
  }
  void set_switch(Switch which, bool on) override {
    for (auto& r : ranks_) r->set_switch(which, on);
  }

 private:
  // Rank r's view of a request: the same slot and page ids in its own pool.
  RequestView translate(int r, const RequestView& v) const {
    if (r == 0) return v;
    const model::KvPool& p0 = ranks_[0]->pool();
    const int64_t slot = (v.slot - p0.slot_data(0)) / p0.geometry().slot_bytes;
    RequestView out = v;
    out.slot = ranks_[r]->pool().slot_data(int32_t(slot));
    return out;
  }

  // Runs fn(rank, that rank's batch) on one thread per rank; rank 0 writes the caller's logits
  // and tokens (the other ranks' would equal them and are not computed).
  template <typename Fn>
  void on_every_rank(std::vector<BatchItem>& batch, Fn fn) {
    const int P = int(ranks_.size());
    std::vector<std::vector<BatchItem>> batches(size_t(P), batch);
    // Rank 0 returns the logits and draws the tokens. Under tensor parallelism every rank takes
    // part in the head's all-gather, so the others compute them too, into scratch.
    const int64_t V = plan().config.vocab_size;
    const int64_t tp = group_.tp;
    std::vector<std::vector<float>> logits_scratch;
    std::vector<kernels::SampledToken> sampled_scratch(tp > 1 ? batch.size() * size_t(P) : 0);
    for (int r = 1; r < P; ++r) {
      for (size_t i = 0; i < batches[r].size(); ++i) {
        BatchItem& b = batches[r][i];
        b.request = translate(r, b.request);
        if (tp > 1 && (b.logits || b.sample)) {
          if (b.logits) {
            logits_scratch.emplace_back(size_t((b.all_logits ? b.n : 1) * V));
            b.logits = logits_scratch.back().data();
          }
          if (b.sampled) b.sampled = &sampled_scratch[size_t(r) * batch.size() + i];
          continue;
        }
        b.logits = nullptr;
        b.sample = nullptr;
        b.sampled = nullptr;
      }
    }
    std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
    // A rank that fails aborts the group, so the others do not wait for it in a collective.
    auto guarded = [&](int r) {
      try {
        fn(r, batches[r]);
      } catch (const std::exception& e) {
        errors[r] = std::current_exception();
        abort_all("rank " + std::to_string(r) + " failed: " + e.what());
      } catch (...) {
        errors[r] = std::current_exception();
        abort_all("rank " + std::to_string(r) + " failed");
      }
    };
    std::vector<std::thread> threads;
    for (int r = 1; r < P; ++r) threads.emplace_back(guarded, r);
    guarded(0);
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors) {
      if (e) std::rethrow_exception(e);  // rank 0's first: the others often fail because of it
    }
  }

  bool speculation() const { return context_parallel_ && group_.size == 1; }
  void require_speculation(const char* what) const {
    DSV41RT_CHECK_CODE(kUnsupported, speculation(), what,
                       " is not built for tensor- or expert-parallel groups");
  }

  void abort_all(const std::string& reason) {
    for (auto& c : comms_) c->abort(reason);
    for (auto& c : group_.inner) c->abort(reason);
  }

  std::vector<std::shared_ptr<Executor>> ranks_;
  std::vector<std::unique_ptr<comm::Communicator>> comms_;
  bool context_parallel_;
  GroupShape group_;
  int64_t cp_forwards_ = 0;
  std::unique_ptr<GroupHostCopy> host_copy_;  // null when a rank has no host copy
};

}  // namespace

void check_cp_batch(const Executor& e, const std::vector<BatchItem>& batch, bool speculation) {
  const ModelConfig& c = e.plan().config;
  DSV41RT_CHECK(!batch.empty(), "forward needs at least one item");
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& b = batch[i];
    DSV41RT_CHECK(b.n > 0 && b.tokens, "batch item ", i, " has no tokens");
    DSV41RT_CHECK(b.request.slot != nullptr, "batch item ", i, " has no state slot");
    DSV41RT_CHECK_CODE(kUnsupported,
                       speculation || (b.undo == nullptr && b.dspark_features == nullptr),
                       "batch item ", i,
                       ": keeping a forward undoable (rollback) or its drafter features is not "
                       "built for tensor- or expert-parallel groups or one process per rank");
    DSV41RT_CHECK(b.request.n_pages * e.layout().page_tokens() >= b.request.length + b.n,
                  "batch item ", i, ": pages cover ", b.request.n_pages * e.layout().page_tokens(),
                  " positions, the forward needs ", b.request.length + b.n);
    for (int64_t t = 0; t < b.n; ++t) {
      DSV41RT_CHECK(b.tokens[t] >= 0 && b.tokens[t] < c.vocab_size, "batch item ", i, ": token id ",
                    b.tokens[t], " at index ", t, " is outside the vocabulary [0, ", c.vocab_size,
                    ")");
    }
  }
}

void run_cp_forward(Executor& e, comm::Communicator& comm, std::vector<BatchItem>& batch) {
  bool prefill = false;
  for (const BatchItem& b : batch) prefill = prefill || b.n > 1;
  if (prefill) {
    e.forward_cp(batch, comm);
  } else {
    e.forward(batch);
  }
}

std::shared_ptr<Executor> make_cp_executor(std::vector<std::shared_ptr<Executor>> ranks,
                                           std::vector<std::unique_ptr<comm::Communicator>> comms) {
  return std::make_shared<CpExecutor>(std::move(ranks), std::move(comms), true);
}

std::shared_ptr<Executor> make_parallel_executor(
    std::vector<std::shared_ptr<Executor>> ranks,
    std::vector<std::unique_ptr<comm::Communicator>> comms, int64_t tp, int64_t ep) {
  GroupShape g;
  g.tp = tp, g.ep = ep, g.size = int64_t(ranks.size());
  return std::make_shared<CpExecutor>(std::move(ranks), std::move(comms), false, std::move(g));
}

std::shared_ptr<Executor> make_cp_grid_executor(
    std::vector<std::shared_ptr<Executor>> ranks,
    std::vector<std::unique_ptr<comm::Communicator>> cp_comms, GroupShape group) {
  return std::make_shared<CpExecutor>(std::move(ranks), std::move(cp_comms), true,
                                      std::move(group));
}

}  // namespace dsv41rt::model
