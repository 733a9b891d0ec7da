// Executor selection by device name (the only place that knows both backends).
#include <algorithm>
#include <exception>
#include <string>
#include <thread>

#include "comm/local_comm.h"
#include "comm/socket_comm.h"
#if DSV41RT_HAVE_NCCL
#include "comm/nccl_comm.h"
#endif
#include "core/status.h"
#include "runtime/model/cp_executor.h"
#include "runtime/model/cp_remote.h"
#include "runtime/model/executor.h"
#include "runtime/model/model_executor.h"
#include "runtime/model/v4_support.h"

namespace dsv41rt::model {

void Executor::forward_cp(std::vector<BatchItem>&, comm::Communicator&) {
  DSV41RT_THROW_CODE(kUnsupported, "context parallelism is not implemented by the ", device(),
                     " executor");
}

void Executor::undo(const RequestView&, const UndoRecord&, int64_t) {
  DSV41RT_THROW_CODE(kUnsupported, "rolling back a sequence is not built for the ", device(),
                     " executor of a context-, tensor- or expert-parallel group");
}

void Executor::draft_greedy(const DraftInputs&, DraftOutputs&) {
  DSV41RT_THROW_CODE(kUnsupported, "this ", device(),
                     " executor has no DSpark drafter (load the runtime with load_drafter; not "
                     "built for context-, tensor- or expert-parallel groups)");
}

void Executor::run_cp_worker() {
  DSV41RT_THROW_CODE(kUnsupported, "this ", device(),
                     " executor is not a context-parallel worker (rank > 0)");
}

void check_copy_state(const model::KvPool& pool, const RequestView& src, const RequestView& dst) {
  const int64_t pages = pool.pages_for(src.length);
  DSV41RT_CHECK(src.slot && dst.slot && src.slot != dst.slot,
                "copy_state: need two distinct slots");
  DSV41RT_CHECK(src.n_pages >= pages && dst.n_pages >= pages, "copy_state: ", src.length,
                " positions need ", pages, " pages; source has ", src.n_pages, ", destination ",
                dst.n_pages);
}

namespace {

// Rank r of P over NCCL on this process's GPU (options.device cuda:N, cp_id an NCCL unique id).
std::unique_ptr<comm::Communicator> rank_nccl_comm(const ExecutorOptions& options, int r, int P) {
  const std::string& d = options.device;
  DSV41RT_CHECK_CODE(kInvalidArgument, options.cp_id.size() == 128,
                     "group_id must be the 128 bytes of an NCCL unique id, got ",
                     options.cp_id.size());
  DSV41RT_CHECK_CODE(kInvalidArgument, d.rfind("cuda:", 0) == 0 && d.size() > 5,
                     "rank over NCCL needs an explicit device cuda:N, got '", d, "'");
#if DSV41RT_HAVE_NCCL
  return comm::make_nccl_comm(options.cp_id, r, P, std::stoi(d.substr(5)));
#else
  (void)r, (void)P;
  DSV41RT_THROW_CODE(kUnsupported, "rank: this build of dsv41rt has no NCCL");
#endif
}

// What a tensor/expert-parallel group of these options cannot do, refused at load; its size.
int check_parallel_group(const ExecutorOptions& options) {
  const int64_t tp = options.tp_size, ep = options.ep_size;
  DSV41RT_CHECK_CODE(kUnsupported, tp == 1 || ep == 1 || ep == tp, "expert_parallel_size ", ep,
                     " with tensor_parallel_size ", tp,
                     ": expert parallelism inside tensor parallelism needs the same size (or 1)");
  return int(std::max(tp, ep));
}

// Rank r's weights: expert shard r, then tensor shard r (heads, output groups, vocabulary) of
// that, moved: each kept tensor is copied once and no dropped expert at all.
ModelWeights rank_weights(const ModelWeights& weights, const ModelPlan& plan,
                          const ExecutorOptions& options, int r, int P) {
  ModelWeights mine = options.ep_size > 1 ? expert_shard(weights, plan, r, P) : weights;
  return options.tp_size > 1 ? tensor_shard(std::move(mine), plan, r, P) : mine;
}

// Tensor / expert parallelism over virtual ranks in this process (LocalComm), optionally inside
// context parallelism.
std::shared_ptr<Executor> make_parallel_group(ModelPlan plan, const ModelWeights& weights,
                                              const EngramTables& engram,
                                              const ExecutorOptions& options) {
  const int P = check_parallel_group(options);
  DSV41RT_CHECK_CODE(kInvalidArgument, options.cp_comm == "local", "context_parallel_backend '",
                     options.cp_comm, "' is for one process per rank (set rank)");
  // With context parallelism: a grid of C CP ranks x P group ranks; the executors of group rank t
  // across the CP ranks share one CP communicator group.
  const int C = int(options.cp_size);
  std::vector<std::vector<std::unique_ptr<comm::Communicator>>> cp_by_rank;
  for (int t = 0; t < P && C > 1; ++t) cp_by_rank.push_back(comm::make_local_group(C));
  std::vector<std::shared_ptr<Executor>> ranks;
  std::vector<std::unique_ptr<comm::Communicator>> cp_comms, group_comms;
  for (int c = 0; c < C; ++c) {
    auto group = comm::make_local_group(P);
    for (int t = 0; t < P; ++t) {
      ExecutorOptions one = options;
      one.cp_size = 1;
      one.group_comm = group[t].get();
      ranks.push_back(make_executor(plan, rank_weights(weights, plan, options, t, P), engram, one));
      if (C > 1) cp_comms.push_back(std::move(cp_by_rank[t][c]));
      group_comms.push_back(std::move(group[t]));
    }
  }
  if (C == 1) {
    return make_parallel_executor(std::move(ranks), std::move(group_comms), options.tp_size,
                                  options.ep_size);
  }
  GroupShape shape;
  shape.tp = options.tp_size, shape.ep = options.ep_size, shape.size = P;
  shape.inner = std::move(group_comms);
  return make_cp_grid_executor(std::move(ranks), std::move(cp_comms), std::move(shape));
}

// One process per rank of a tensor/expert-parallel group, over NCCL (cp_id = the 128 bytes of an
// NCCL unique id; device cuda:N) or TCP (cp_id = rank 0's host:port; any device): this process's
// executor, as the leader (rank 0) or a worker.
std::shared_ptr<Executor> make_parallel_rank(ModelPlan plan, const ModelWeights& weights,
                                             const EngramTables& engram,
                                             const ExecutorOptions& options) {
  const int P = check_parallel_group(options);
  DSV41RT_CHECK_CODE(kUnsupported, options.cp_size == 1, "tensor/expert parallelism (sizes ",
                     options.tp_size, ", ", options.ep_size,
                     ") with context parallelism runs in one process only so far "
                     "(context_parallel_size ",
                     options.cp_size, " with one process per rank)");
  const int r = int(options.cp_rank);
  DSV41RT_CHECK_CODE(kInvalidArgument,
                     (options.cp_comm == "socket" || options.cp_comm == "nccl") && r < P, "rank ",
                     r,
                     " of a tensor/expert-parallel group needs context_parallel_backend 'nccl' or "
                     "'socket' and rank < the group size (",
                     P, ")");
  std::unique_ptr<comm::Communicator> comm = options.cp_comm == "nccl"
                                                 ? rank_nccl_comm(options, r, P)
                                                 : comm::make_socket_comm(options.cp_id, r, P);
  ExecutorOptions one = options;
  one.cp_rank = -1, one.cp_comm = "local", one.cp_id.clear();
  one.group_comm = comm.get();
  auto local = make_executor(plan, rank_weights(weights, plan, options, r, P), engram, one);
  if (r > 0) return make_cp_worker(std::move(local), std::move(comm));
  return make_cp_leader(std::move(local), std::move(comm), nullptr,
                        GroupKind{true, options.tp_size, options.ep_size});
}

}  // namespace

std::shared_ptr<Executor> make_executor(ModelPlan plan, ModelWeights weights, EngramTables engram,
                                        ExecutorOptions options) {
  const std::string& d = options.device;
  DSV41RT_CHECK_CODE(
      kInvalidArgument,
      options.precision == "fp32" || options.precision == "bf16" || options.precision == "fp8",
      "unknown precision '", options.precision, "' (expected 'fp32', 'bf16' or 'fp8')");
  DSV41RT_CHECK_CODE(kInvalidArgument, options.cp_size >= 1 && options.cp_size <= 64,
                     "context_parallel_size ", options.cp_size, " must be in [1, 64]");
  DSV41RT_CHECK_CODE(
      kInvalidArgument,
      options.cp_comm == "local" || options.cp_comm == "nccl" || options.cp_comm == "socket",
      "unknown context_parallel_backend '", options.cp_comm,
      "' (expected 'local', 'nccl' or 'socket')");
  DSV41RT_CHECK_CODE(kInvalidArgument, options.ep_size >= 1 && options.ep_size <= 64,
                     "expert_parallel_size ", options.ep_size, " must be in [1, 64]");
  DSV41RT_CHECK_CODE(kInvalidArgument, options.tp_size >= 1 && options.tp_size <= 64,
                     "tensor_parallel_size ", options.tp_size, " must be in [1, 64]");
  check_v4_options(plan, options);  // before any rank or group is built
  if ((options.ep_size > 1 || options.tp_size > 1) && !options.group_comm) {
    return options.cp_rank >= 0 ? make_parallel_rank(std::move(plan), weights, engram, options)
                                : make_parallel_group(std::move(plan), weights, engram, options);
  }
  const bool nccl = options.cp_comm == "nccl";
  DSV41RT_CHECK_CODE(kInvalidArgument, options.cp_comm != "socket" || options.cp_rank >= 0,
                     "context_parallel_backend 'socket' is for one process per rank (set rank)");
  if (options.cp_rank >= 0) {
    // One process per rank: this process's executor and its communicator (NCCL between GPUs;
    // TCP sockets on any device, cp_id = "host:port" of rank 0).
    DSV41RT_CHECK_CODE(
        kInvalidArgument, options.cp_comm != "local" && options.cp_rank < options.cp_size, "rank ",
        options.cp_rank,
        " needs context_parallel_backend 'nccl' or 'socket' and rank < context_parallel_size (",
        options.cp_size, ")");
    ExecutorOptions one = options;
    one.cp_size = 1, one.cp_rank = -1, one.cp_comm = "local", one.cp_id.clear();
    std::unique_ptr<comm::Communicator> comm;
    if (nccl) comm = rank_nccl_comm(options, int(options.cp_rank), int(options.cp_size));
    auto local = make_executor(std::move(plan), std::move(weights), std::move(engram), one);
    if (!nccl) {
      comm = comm::make_socket_comm(options.cp_id, int(options.cp_rank), int(options.cp_size));
    }
    return options.cp_rank == 0 ? make_cp_leader(std::move(local), std::move(comm))
                                : make_cp_worker(std::move(local), std::move(comm));
  }
  if (options.cp_size > 1 || nccl) {
    // One full executor per rank, each with its own replica of the state.
    const int P = int(options.cp_size);
    int base = 0;
    if (nccl) {
      DSV41RT_CHECK_CODE(kInvalidArgument, d == "cuda" || d.rfind("cuda:", 0) == 0,
                         "context_parallel_backend 'nccl' needs a CUDA device, got '", d, "'");
      base = d == "cuda" ? 0 : std::stoi(d.substr(5));
    }
    std::vector<std::shared_ptr<Executor>> ranks;
    for (int r = 0; r < P; ++r) {
      ExecutorOptions one = options;
      one.cp_size = 1;
      one.cp_comm = "local";
      if (nccl) one.device = "cuda:" + std::to_string(base + r);
      ranks.push_back(
          r + 1 < P ? make_executor(plan, weights, engram, one)
                    : make_executor(std::move(plan), std::move(weights), std::move(engram), one));
    }
    if (!nccl && options.cp_workers) {
      // The one-process-per-rank protocol with the ranks as threads of this process. The workers
      // idle in a collective while rank 0 has no work: no timeout.
      auto comms = comm::make_local_group(P, std::chrono::hours(24 * 365));
      auto workers = std::make_unique<CpWorkerThreads>();
      for (int r = 1; r < P; ++r) {
        workers->executors.push_back(ranks[r]);
        workers->comms.push_back(std::move(comms[r]));
      }
      for (int r = 1; r < P; ++r) {
        Executor* e = workers->executors[r - 1].get();
        comm::Communicator* c = workers->comms[r - 1].get();
        workers->threads.emplace_back([e, c] {
          try {
            run_cp_worker(*e, *c);
          } catch (...) {  // the group is aborted: rank 0's next call fails with the reason
          }
        });
      }
      return make_cp_leader(ranks[0], std::move(comms[0]), std::move(workers));
    }
    if (!nccl) return make_cp_executor(std::move(ranks), comm::make_local_group(P));
#if DSV41RT_HAVE_NCCL
    // ncclCommInitRank returns once every rank joined: one thread per rank.
    const std::string id = comm::NcclComm::nccl_unique_id();
    std::vector<std::unique_ptr<comm::Communicator>> comms(static_cast<size_t>(P));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(P));
    std::vector<std::thread> threads;
    for (int r = 0; r < P; ++r) {
      threads.emplace_back([&, r] {
        try {
          comms[r] = comm::make_nccl_comm(id, r, P, base + r);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    for (const std::exception_ptr& e : errors) {
      if (e) std::rethrow_exception(e);
    }
    return make_cp_executor(std::move(ranks), std::move(comms));
#else
    DSV41RT_THROW_CODE(
        kUnsupported,
        "context_parallel_backend 'nccl': this build of dsv41rt has no NCCL (configure with "
        "nccl.h available, e.g. pip install nvidia-nccl-cu13)");
#endif
  }
  // One executor over the device's backend (precision "bf16" / "fp8" on the CPU: the emulation
  // of the GPU's tensor-core paths).
  if (d == "cpu" || d == "cuda" || d.rfind("cuda:", 0) == 0) {
    auto backend = d == "cpu" ? make_cpu_backend() : make_cuda_backend(d);
    return std::make_shared<ModelExecutor>(std::move(plan), std::move(weights), std::move(engram),
                                           std::move(options), std::move(backend));
  }
  DSV41RT_THROW_CODE(kInvalidArgument, "unknown device '", d,
                     "' (expected 'cpu', 'cuda' or 'cuda:N')");
}

}  // namespace dsv41rt::model
