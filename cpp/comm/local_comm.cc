#include "comm/local_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "comm/collective_math.h"
#include "core/status.h"

namespace dsv41rt::comm {
namespace {

using detail::element_bytes;
using detail::Op;

// The shared state of one group: a generation-counted rendezvous and the published calls.
struct Group {
  struct Call {
    const char* op = nullptr;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    DType dtype = DType::kU8;
    ReduceOp reduce = ReduceOp::kSum;
    int root = 0;
  };
  explicit Group(int n, std::chrono::milliseconds t) : size(n), timeout(t), calls(size_t(n)) {}

  const int size;
  const std::chrono::milliseconds timeout;
  std::mutex mu;
  std::condition_variable cv;
  uint64_t generation = 0;
  int arrived = 0;
  std::vector<Call> calls;
  std::string failure;  // set once a rendezvous failed: the group is unusable afterwards

  // Waits until every rank has arrived at this rendezvous; throws on timeout or failure.
  void rendezvous(int rank, const char* what) {
    std::unique_lock<std::mutex> lock(mu);
    DSV41RT_CHECK_CODE(kInternal, failure.empty(), "LocalComm rank ", rank, ": ", failure);
    const uint64_t gen = generation;
    if (++arrived == size) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return;
    }
    if (!cv.wait_for(lock, timeout, [&] { return generation != gen || !failure.empty(); })) {
      failure = std::string(what) + ": " + std::to_string(size - arrived) + " of " +
                std::to_string(size) + " ranks did not arrive within " +
                std::to_string(timeout.count()) + " ms";
      cv.notify_all();
    }
    DSV41RT_CHECK_CODE(kInternal, failure.empty(), "LocalComm rank ", rank, ": ", failure);
  }
};

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_gather(const void* send, void* recv, size_t count, DType t, void*) override {
    run(Op::kAllGather, send, recv, count, t, ReduceOp::kSum, 0);
  }
  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                      void*) override {
    run(Op::kReduceScatter, send, recv, count, t, op, 0);
  }
  void all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                  void*) override {
    run(Op::kAllReduce, send, recv, count, t, op, 0);
  }
  void all_to_all(const void* send, void* recv, size_t count, DType t, void*) override {
    run(Op::kAllToAll, send, recv, count, t, ReduceOp::kSum, 0);
  }
  void broadcast(void* buf, size_t count, DType t, int root, void*) override {
    DSV41RT_CHECK(root >= 0 && root < size(), "LocalComm broadcast: root ", root, " of ", size());
    run(Op::kBroadcast, buf, buf, count, t, ReduceOp::kSum, root);
  }
  void barrier() override { g_->rendezvous(rank_, "barrier"); }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->failure.empty()) g_->failure = "aborted: " + reason;
    g_->cv.notify_all();
  }

 private:
  // Publish, rendezvous, check every rank made the same call, compute into a private buffer,
  // rendezvous (every rank has read every input), then write the output: outputs may alias the
  // caller's own inputs (in-place collectives).
  void run(Op op, const void* send, void* recv, size_t count, DType t, ReduceOp reduce_op,
           int root) {
    const char* name = detail::op_name(op);
    DSV41RT_CHECK(count == 0 || (send && recv), "LocalComm ", name, ": NULL buffer on rank ",
                  rank_);
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      g_->calls[size_t(rank_)] = {name, send, recv, count, t, reduce_op, root};
    }
    g_->rendezvous(rank_, name);
    std::vector<Group::Call> calls;
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      calls = g_->calls;
    }
    bool same = true;
    std::string all;
    std::vector<const void*> sends;
    for (int r = 0; r < size(); ++r) {
      const Group::Call& c = calls[size_t(r)];
      same = same && std::strcmp(c.op, name) == 0 && c.count == count && c.dtype == t &&
             c.reduce == reduce_op && c.root == root;
      all += (r ? ", rank " : "rank ") + std::to_string(r) + " " + c.op + "(count " +
             std::to_string(c.count) + ", " + dtype_name(c.dtype) + ")";
      sends.push_back(c.send);
    }
    DSV41RT_CHECK(same, "LocalComm: the ranks called different collectives: ", all);
    std::vector<uint8_t> out(detail::output_elements(op, count, size()) * element_bytes(t));
    if (count) detail::collective_output(op, sends, rank_, count, t, reduce_op, root, out.data());
    g_->rendezvous(rank_, name);
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
  }

  std::shared_ptr<Group> g_;
  int rank_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_local_group(int size,
                                                            std::chrono::milliseconds timeout) {
  DSV41RT_CHECK(size >= 1, "LocalComm: group size must be >= 1, got ", size);
  auto g = std::make_shared<Group>(size, timeout);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<LocalComm>(g, r));
  return out;
}

}  // namespace dsv41rt::comm
