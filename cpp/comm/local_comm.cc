#include "comm/local_comm.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <string>

#include "runtime/status.h"

namespace dsv41rt::comm {
namespace {

size_t element_bytes(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kBF16:
    case DType::kF16:
      return 2;
    case DType::kI64:
      return 8;
    default:
      return 1;
  }
}

// The shared state of one group: a generation-counted rendezvous and the published calls.
struct Group {
  struct Call {
    const char* op = nullptr;
    const void* send = nullptr;
    void* recv = nullptr;
    size_t count = 0;
    DType dtype = DType::kU8;
    ReduceOp reduce = ReduceOp::kSum;
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

template <typename T>
void reduce_into(T* out, const std::vector<const T*>& in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    T acc = in[0][i];
    for (size_t r = 1; r < in.size(); ++r) {
      acc = op == ReduceOp::kSum ? T(acc + in[r][i]) : std::max(acc, in[r][i]);
    }
    out[i] = acc;
  }
}

void reduce_bf16(uint16_t* out, const std::vector<const uint16_t*>& in, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    float acc = bf16_to_f32(in[0][i]);
    for (size_t r = 1; r < in.size(); ++r) {
      const float v = bf16_to_f32(in[r][i]);
      acc = op == ReduceOp::kSum ? acc + v : std::max(acc, v);
    }
    out[i] = f32_to_bf16(acc);
  }
}

// out[0, n) = reduction over ranks of (base_r + offset)[0, n), in rank order.
void reduce(void* out, const std::vector<const void*>& bases, size_t offset, size_t n, DType t,
            ReduceOp op) {
  auto ptrs = [&](auto tag) {
    using T = decltype(tag);
    std::vector<const T*> p;
    for (const void* b : bases) p.push_back(static_cast<const T*>(b) + offset);
    return p;
  };
  switch (t) {
    case DType::kF32:
      return reduce_into(static_cast<float*>(out), ptrs(float{}), n, op);
    case DType::kI32:
      return reduce_into(static_cast<int32_t*>(out), ptrs(int32_t{}), n, op);
    case DType::kI64:
      return reduce_into(static_cast<int64_t*>(out), ptrs(int64_t{}), n, op);
    case DType::kBF16:
      return reduce_bf16(static_cast<uint16_t*>(out), ptrs(uint16_t{}), n, op);
    default:
      DSV41RT_THROW_CODE(kUnsupported, "LocalComm: reductions of ", dtype_name(t),
                         " are not supported (F32, BF16, I32, I64)");
  }
}

class LocalComm final : public Communicator {
 public:
  LocalComm(std::shared_ptr<Group> g, int rank) : g_(std::move(g)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }

  void all_gather(const void* send, void* recv, size_t count, DType t, void*) override {
    run("all_gather", send, recv, count, t, ReduceOp::kSum,
        [&](const std::vector<Group::Call>& c, uint8_t* out) {
          const size_t bytes = count * element_bytes(t);
          for (int r = 0; r < size(); ++r) std::memcpy(out + r * bytes, c[r].send, bytes);
        });
  }

  void reduce_scatter(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                      void*) override {
    run("reduce_scatter", send, recv, count, t, op,
        [&](const std::vector<Group::Call>& c, uint8_t* out) {
          reduce(out, sends(c), size_t(rank_) * count, count, t, op);
        });
  }

  void all_reduce(const void* send, void* recv, size_t count, DType t, ReduceOp op,
                  void*) override {
    run("all_reduce", send, recv, count, t, op,
        [&](const std::vector<Group::Call>& c, uint8_t* out) {
          reduce(out, sends(c), 0, count, t, op);
        });
  }

  void all_to_all(const void* send, void* recv, size_t count, DType t, void*) override {
    run("all_to_all", send, recv, count, t, ReduceOp::kSum,
        [&](const std::vector<Group::Call>& c, uint8_t* out) {
          const size_t bytes = count * element_bytes(t);
          for (int p = 0; p < size(); ++p) {
            std::memcpy(out + p * bytes,
                        static_cast<const uint8_t*>(c[p].send) + size_t(rank_) * bytes, bytes);
          }
        });
  }

  void broadcast(void* buf, size_t count, DType t, int root, void*) override {
    DSV41RT_CHECK(root >= 0 && root < size(), "LocalComm broadcast: root ", root, " of ", size());
    // The root rides in the call record's op field, so ranks naming different roots mismatch.
    run("broadcast", buf, buf, count, t, ReduceOp(root),
        [&](const std::vector<Group::Call>& c, uint8_t* out) {
          std::memcpy(out, c[size_t(root)].send, count * element_bytes(t));
        });
  }

  void barrier() override { g_->rendezvous(rank_, "barrier"); }

  void abort(const std::string& reason) override {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->failure.empty()) g_->failure = "aborted: " + reason;
    g_->cv.notify_all();
  }

 private:
  static std::vector<const void*> sends(const std::vector<Group::Call>& c) {
    std::vector<const void*> out;
    for (const Group::Call& call : c) out.push_back(call.send);
    return out;
  }

  // Publish, rendezvous, check every rank made the same call, compute into a private buffer,
  // rendezvous (every rank has read every input), then write the output: outputs may alias the
  // caller's own inputs (in-place collectives).
  template <class Compute>
  void run(const char* op, const void* send, void* recv, size_t count, DType t, ReduceOp reduce_op,
           Compute&& compute) {
    DSV41RT_CHECK(count == 0 || (send && recv), "LocalComm ", op, ": NULL buffer on rank ", rank_);
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      g_->calls[size_t(rank_)] = {op, send, recv, count, t, reduce_op};
    }
    g_->rendezvous(rank_, op);
    std::vector<Group::Call> calls;
    {
      std::lock_guard<std::mutex> lock(g_->mu);
      calls = g_->calls;
    }
    bool same = true;
    std::string all;
    for (int r = 0; r < size(); ++r) {
      const Group::Call& c = calls[size_t(r)];
      same = same && std::strcmp(c.op, op) == 0 && c.count == count && c.dtype == t &&
             c.reduce == reduce_op;
      all += (r ? ", rank " : "rank ") + std::to_string(r) + " " + c.op + "(count " +
             std::to_string(c.count) + ", " + dtype_name(c.dtype) + ")";
    }
    DSV41RT_CHECK(same, "LocalComm: the ranks called different collectives: ", all);
    std::vector<uint8_t> out(out_elements(op, count) * element_bytes(t));
    if (count) compute(calls, out.data());
    g_->rendezvous(rank_, op);
    if (!out.empty()) std::memcpy(recv, out.data(), out.size());
  }

  size_t out_elements(const char* op, size_t count) const {
    const bool whole = std::strcmp(op, "all_gather") == 0 || std::strcmp(op, "all_to_all") == 0;
    return whole ? count * size_t(size()) : count;
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
