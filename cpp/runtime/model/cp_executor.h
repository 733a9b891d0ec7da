// A context-parallel group presented to the engine as one executor (design:
// docs/design/context-parallel.md). It owns `cp_size` rank executors, each with a full replica of
// the KV state (identical pools: the engine allocates slot and page ids from rank 0's pool and
// every rank uses the same ids in its own), one Communicator per rank, and one thread per rank.
//
// Forwards that carry a prefill chunk (an item of more than one token) run as a CP forward:
// every rank calls forward_cp with the whole batch, computes its round-robin share of the query
// rows and writes every row's state. Decode-only forwards run without CP: every rank runs the
// plain forward on the whole batch, which keeps the replicas identical (on separate GPUs the
// replicated decode costs no latency; with virtual ranks on one device it costs time, which is
// why CP is a prefill feature). Logits come from rank 0.
#pragma once

#include <memory>
#include <vector>

#include "comm/communicator.h"
#include "runtime/model/executor.h"

namespace dsv41rt::model {

/// One executor per rank (same plan, options and cache formats) and one communicator per rank
/// (comms[r].rank() == r).
std::shared_ptr<Executor> make_cp_executor(std::vector<std::shared_ptr<Executor>> ranks,
                                           std::vector<std::unique_ptr<comm::Communicator>> comms);

/// A tensor/expert-parallel group (docs/design/parallelism.md) on the same machinery: every
/// forward runs on every rank with the whole batch (replicated state); each rank's executor holds
/// its shards and runs the collectives over comms[r] (its group_comm). tp, ep: the group's sizes
/// (reported in backend_stats).
std::shared_ptr<Executor> make_parallel_executor(
    std::vector<std::shared_ptr<Executor>> ranks,
    std::vector<std::unique_ptr<comm::Communicator>> comms, int64_t tp, int64_t ep);

/// The tensor/expert-parallel groups inside a context-parallel group: `size` ranks per CP rank
/// (sizes tp, ep) and `inner`, their group communicators (kept alive and aborted with the rest).
struct GroupShape {
  int64_t tp = 1, ep = 1, size = 1;
  std::vector<std::unique_ptr<comm::Communicator>> inner;
};

/// Context parallelism over tensor/expert-parallel groups (a CP x TP grid): executor i is rank
/// i % group.size of its group and CP rank i / group.size; cp_comms[i] joins the executors of the
/// same group rank across the CP ranks.
std::shared_ptr<Executor> make_cp_grid_executor(
    std::vector<std::shared_ptr<Executor>> ranks,
    std::vector<std::unique_ptr<comm::Communicator>> cp_comms, GroupShape group);

/// What every rank's forward would refuse, checked once on the host before any rank runs (so bad
/// input leaves the group usable). Throws Error naming the item. `speculation`: items may be kept
/// undoable or give drafter features (context parallelism in one process: such forwards run
/// whole on every rank).
void check_cp_batch(const Executor& e, const std::vector<BatchItem>& batch,
                    bool speculation = false);

/// One rank's part of a group forward: forward_cp when an item carries a prefill chunk (more than
/// one token), else the plain forward on the whole batch (decode runs replicated).
void run_cp_forward(Executor& e, comm::Communicator& comm, std::vector<BatchItem>& batch);

}  // namespace dsv41rt::model
