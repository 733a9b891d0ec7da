// Context parallelism with one process per rank (docs/design/context-parallel.md, "One process
// per GPU"). Rank 0's process runs the engine over a leader executor that ships every call which
// touches the state (forward, copy_state, backend options) to the other ranks as a broadcast
// message, then runs it itself; every other process runs run_cp_worker, which replays the calls
// on its own executor until the leader shuts down. The replayed calls are the in-process group's
// (forward_cp for batches with a prefill chunk, the plain forward otherwise), so the logits are
// the same; a tensor/expert-parallel group (docs/design/parallelism.md) uses the same protocol
// with the plain forward throughout. Slot and page ids travel as ids: every rank's pool has the
// same geometry.
#pragma once

#include <memory>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "runtime/model/executor.h"

namespace dsv41rt::model {

/// Rank 0: `local` computes rank 0's share; `comm` is rank 0 of the group. The optional
/// `workers` (threads running run_cp_worker in this process, with their executors and
/// communicators) are joined after the shutdown message when the leader is destroyed.
struct CpWorkerThreads {
  std::vector<std::shared_ptr<Executor>> executors;
  std::vector<std::unique_ptr<comm::Communicator>> comms;
  std::vector<std::thread> threads;
};
/// `parallel`: the group is tensor/expert-parallel (sizes tp, ep; every forward runs whole on
/// every rank, and under TP every rank computes the head rows rank 0 does), not context-parallel.
struct GroupKind {
  bool parallel = false;
  int64_t tp = 1, ep = 1;
};
std::shared_ptr<Executor> make_cp_leader(std::shared_ptr<Executor> local,
                                         std::unique_ptr<comm::Communicator> comm,
                                         std::unique_ptr<CpWorkerThreads> workers = nullptr,
                                         GroupKind kind = {});

/// Rank r > 0: replays the leader's calls on `local` until the leader's shutdown message. A
/// failure aborts the group (so the leader's collectives fail too) and is rethrown.
void run_cp_worker(Executor& local, comm::Communicator& comm);

/// The executor of a worker process (rank > 0): its forwards come from the leader;
/// Executor::run_cp_worker() runs the loop.
std::shared_ptr<Executor> make_cp_worker(std::shared_ptr<Executor> local,
                                         std::unique_ptr<comm::Communicator> comm);

}  // namespace dsv41rt::model
