#include "runtime/model/cp_remote.h"

#include <cstring>
#include <string>

#include "core/status.h"
#include "runtime/model/cp_executor.h"
#include "runtime/model/delegating_executor.h"
#if DSV41RT_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace dsv41rt::model {
namespace {

enum Kind : int64_t {
  kShutdown = 0,
  kForward = 1,
  kCopyState = 2,
  kOption = 3,
  kPageFromHost = 4,  // {kind, page, bytes, bytes packed into int64 words}
  kSlotFromHost = 5,  // {kind, slot, bytes, ...}
};

// Messages are int64 arrays broadcast from rank 0: first the length, then the array. Device
// communicators (NCCL) move them through a device buffer on the rank's GPU.
class Channel {
 public:
  Channel(comm::Communicator& comm, const std::string& device) : comm_(comm) {
    if (device.rfind("cuda", 0) == 0) gpu_ = device == "cuda" ? 0 : std::stoi(device.substr(5));
  }
  ~Channel() {
#if DSV41RT_WITH_CUDA
    if (dev_) cudaFree(dev_);
#endif
  }
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  void send(std::vector<int64_t> msg) {
    int64_t n = int64_t(msg.size());
    move(&n, 1);
    move(msg.data(), n);
  }
  std::vector<int64_t> receive() {
    int64_t n = 0;
    move(&n, 1);
    DSV41RT_CHECK_CODE(kInternal, n >= 1 && n < (int64_t(1) << 34), "context-parallel worker ",
                       comm_.rank(), ": bad message length ", n);
    std::vector<int64_t> msg(static_cast<size_t>(n));
    move(msg.data(), n);
    return msg;
  }

 private:
  // In place: rank 0's values to every rank.
  void move(int64_t* host, int64_t n) {
    if (!comm_.device_buffers()) {
      comm_.broadcast(host, size_t(n), DType::kI64, 0);
      return;
    }
#if DSV41RT_WITH_CUDA
    auto ok = [](cudaError_t e, const char* what) {
      DSV41RT_CHECK_CODE(kInternal, e == cudaSuccess, what, ": ", cudaGetErrorString(e));
    };
    ok(cudaSetDevice(gpu_), "cudaSetDevice");
    if (n > capacity_) {
      if (dev_) cudaFree(dev_);
      dev_ = nullptr;
      ok(cudaMalloc(&dev_, size_t(n) * sizeof(int64_t)), "cudaMalloc");
      capacity_ = n;
    }
    ok(cudaMemcpy(dev_, host, size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice), "cudaMemcpy");
    comm_.broadcast(dev_, size_t(n), DType::kI64, 0, nullptr);
    ok(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize");
    ok(cudaMemcpy(host, dev_, size_t(n) * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
#else
    DSV41RT_THROW_CODE(kUnsupported, "a device communicator in a build without CUDA");
#endif
  }

  comm::Communicator& comm_;
  int gpu_ = -1;
  void* dev_ = nullptr;
  int64_t capacity_ = 0;
};

// The state copies of a group whose ranks are processes: every rank holds a replica of the state
// (context parallelism and tensor/expert parallelism alike), so rank 0's copy is read to the
// host; bytes coming from the host go to rank 0's copy and, as a message, to every worker's.
class RemoteGroupHostCopy final : public HostStateCopy {
 public:
  RemoteGroupHostCopy(HostStateCopy& local, Channel& channel) : local_(local), channel_(channel) {}
  int64_t page_bytes() const override { return local_.page_bytes(); }
  int64_t slot_state_bytes() const override { return local_.slot_state_bytes(); }
  std::shared_ptr<uint8_t> alloc_host(int64_t bytes) override { return local_.alloc_host(bytes); }
  void page_to_host(int32_t page, uint8_t* dst) override { local_.page_to_host(page, dst); }
  void slot_to_host(int32_t slot, uint8_t* dst) override { local_.slot_to_host(slot, dst); }
  void page_from_host(const uint8_t* src, int32_t page) override {
    channel_.send(packed(kPageFromHost, page, src, page_bytes()));
    local_.page_from_host(src, page);
  }
  void slot_from_host(const uint8_t* src, int32_t slot) override {
    channel_.send(packed(kSlotFromHost, slot, src, slot_state_bytes()));
    local_.slot_from_host(src, slot);
  }

 private:
  static std::vector<int64_t> packed(Kind kind, int32_t index, const uint8_t* src, int64_t bytes) {
    std::vector<int64_t> m{kind, index, bytes};
    m.resize(3 + size_t((bytes + 7) / 8), 0);
    std::memcpy(m.data() + 3, src, size_t(bytes));
    return m;
  }
  HostStateCopy& local_;
  Channel& channel_;
};

// A worker's side of RemoteGroupHostCopy: the message's bytes into its own copy.
void replay_from_host(Executor& local, const std::vector<int64_t>& m) {
  HostStateCopy* copy = local.host_state_copy();
  DSV41RT_CHECK_CODE(kInternal, copy != nullptr && m.size() >= 3, "worker: a state copy without ",
                     copy ? "its bytes" : "a host copy");
  const int64_t bytes = m[2];
  const int64_t want = m[0] == kPageFromHost ? copy->page_bytes() : copy->slot_state_bytes();
  DSV41RT_CHECK_CODE(kInternal, bytes == want && int64_t(m.size()) == 3 + (bytes + 7) / 8,
                     "worker: a state copy of ", bytes, " bytes, expected ", want);
  const auto* src = reinterpret_cast<const uint8_t*>(m.data() + 3);
  if (m[0] == kPageFromHost) {
    copy->page_from_host(src, int32_t(m[1]));
  } else {
    copy->slot_from_host(src, int32_t(m[1]));
  }
}

int64_t slot_id(const Executor& e, const uint8_t* slot) {
  const model::KvPool& p = const_cast<Executor&>(e).pool();
  return (slot - p.slot_data(0)) / p.geometry().slot_bytes;
}

void put_request(const Executor& e, const RequestView& r, std::vector<int64_t>& m) {
  m.push_back(slot_id(e, r.slot));
  m.push_back(r.length);
  m.push_back(r.n_pages);
  m.insert(m.end(), r.pages, r.pages + r.n_pages);
}

// A request read back from a message: the view points into `pages`, which must outlive it.
RequestView get_request(Executor& e, const std::vector<int64_t>& m, size_t& at,
                        std::vector<int32_t>& pages) {
  RequestView r;
  r.slot = e.pool().slot_data(int32_t(m.at(at++)));
  r.length = m.at(at++);
  r.n_pages = m.at(at++);
  pages.assign(m.begin() + int64_t(at), m.begin() + int64_t(at + size_t(r.n_pages)));
  at += size_t(r.n_pages);
  r.pages = pages.data();
  return r;
}

// Message header after the kind: 1 = a tensor/expert-parallel group's forward (plain, on the
// whole batch), 0 = a context-parallel one (run_cp_forward).
// The worker's logits equal rank 0's and nobody reads them: no output buffer (one of up to
// rows x vocab floats, touched afresh per forward, made the worker reach the first all-gather
// hundreds of ms late on all-position prefills; rank 0 waited for it there) - except under
// tensor parallelism, where every rank takes part in the head's all-gather: there the worker
// computes the head rows rank 0 does (per item: 0 none, 1 the last row, 2 every row) into scratch.
void replay_forward(Executor& local, comm::Communicator& comm, const std::vector<int64_t>& m) {
  size_t at = 1;
  const bool parallel = m.at(at++) != 0;
  const int64_t items = m.at(at++);
  std::vector<BatchItem> batch(static_cast<size_t>(items));
  std::vector<std::vector<int32_t>> pages(static_cast<size_t>(items)), tokens(batch.size());
  std::vector<std::vector<float>> logits(batch.size());
  const int64_t V = local.plan().config.vocab_size;
  for (int64_t i = 0; i < items; ++i) {
    BatchItem& b = batch[size_t(i)];
    b.request = get_request(local, m, at, pages[size_t(i)]);
    b.n = m.at(at++);
    b.all_logits = m.at(at++) != 0;
    const int64_t head = m.at(at++);
    tokens[size_t(i)].assign(m.begin() + int64_t(at), m.begin() + int64_t(at + size_t(b.n)));
    at += size_t(b.n);
    b.tokens = tokens[size_t(i)].data();
    if (head > 0) {
      b.all_logits = head == 2;
      logits[size_t(i)].resize(size_t((b.all_logits ? b.n : 1) * V));
      b.logits = logits[size_t(i)].data();
    }
  }
  if (parallel) {
    local.forward(batch);
  } else {
    run_cp_forward(local, comm, batch);
  }
}

class CpLeader final : public DelegatingExecutor {
 public:
  CpLeader(std::shared_ptr<Executor> local, std::unique_ptr<comm::Communicator> comm,
           std::unique_ptr<CpWorkerThreads> workers, GroupKind kind)
      : DelegatingExecutor(local.get()),
        local_(std::move(local)),
        comm_(std::move(comm)),
        channel_(*comm_, local_->device()),
        workers_(std::move(workers)),
        kind_(kind) {
    DSV41RT_CHECK(comm_->rank() == 0, "the context-parallel leader must be rank 0, not ",
                  comm_->rank());
    if (HostStateCopy* local_copy = local_->host_state_copy()) {
      host_copy_ = std::make_unique<RemoteGroupHostCopy>(*local_copy, channel_);
    }
  }
  ~CpLeader() override {
    try {
      channel_.send({kShutdown});
    } catch (...) {  // a broken group: the workers fail on their own
    }
    if (workers_) {
      for (std::thread& t : workers_->threads) t.join();
    }
  }

  void forward(std::vector<BatchItem>& batch) override {
    check_cp_batch(*local_, batch);  // bad input fails before anything is sent
    std::vector<int64_t> m{kForward, kind_.parallel ? 1 : 0, int64_t(batch.size())};
    for (const BatchItem& b : batch) {
      put_request(*local_, b.request, m);
      m.push_back(b.n);
      m.push_back(b.all_logits ? 1 : 0);
      const bool head = kind_.parallel && kind_.tp > 1 && (b.logits || b.sample);
      m.push_back(!head ? 0 : (b.logits && b.all_logits ? 2 : 1));
      m.insert(m.end(), b.tokens, b.tokens + b.n);
    }
    channel_.send(std::move(m));
    guarded([&] {
      if (kind_.parallel) {
        local_->forward(batch);
      } else {
        run_cp_forward(*local_, *comm_, batch);
      }
    });
  }
  void copy_state(const RequestView& src, const RequestView& dst) override {
    check_copy_state(local_->pool(), src, dst);
    std::vector<int64_t> m{kCopyState};
    put_request(*local_, src, m);
    put_request(*local_, dst, m);
    channel_.send(std::move(m));
    local_->copy_state(src, dst);
  }
  void set_switch(Switch which, bool on) override {
    local_->set_switch(which, on);  // one that does not apply fails here, before sending
    channel_.send({kOption, on ? 1 : 0, int64_t(which)});
  }
  void forward_cp(std::vector<BatchItem>&, comm::Communicator&) override {
    DSV41RT_THROW_CODE(kUnsupported, "a context-parallel group cannot be a rank of another");
  }
  HostStateCopy* host_state_copy() override { return host_copy_.get(); }

  BackendStats backend_stats() const override {
    BackendStats s = local_->backend_stats();
    if (kind_.parallel) {
      s.tp_size = kind_.tp, s.ep_size = kind_.ep;
    } else {
      s.cp_size = comm_->size();
    }
    s.cp_processes = workers_ ? 0 : 1;  // ranks in processes (CP, TP or EP)
    return s;
  }

 private:
  template <typename Fn>
  void guarded(Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      comm_->abort(std::string("rank 0 failed: ") + e.what());
      throw;
    }
  }

  std::shared_ptr<Executor> local_;
  std::unique_ptr<comm::Communicator> comm_;
  Channel channel_;
  std::unique_ptr<CpWorkerThreads> workers_;
  GroupKind kind_;
  std::unique_ptr<RemoteGroupHostCopy> host_copy_;  // after channel_: it sends through it
};

class CpWorker final : public DelegatingExecutor {
 public:
  CpWorker(std::shared_ptr<Executor> local, std::unique_ptr<comm::Communicator> comm)
      : DelegatingExecutor(local.get()), local_(std::move(local)), comm_(std::move(comm)) {}
  void run_cp_worker() override { model::run_cp_worker(*local_, *comm_); }
  void forward(std::vector<BatchItem>&) override { refuse(); }
  void forward_cp(std::vector<BatchItem>&, comm::Communicator&) override { refuse(); }
  void copy_state(const RequestView&, const RequestView&) override { refuse(); }

 private:
  [[noreturn]] void refuse() const {
    DSV41RT_THROW_CODE(kUnsupported, "context-parallel rank ", comm_->rank(),
                       " is a worker: its work comes from rank 0 (call run_cp_worker)");
  }
  std::shared_ptr<Executor> local_;
  std::unique_ptr<comm::Communicator> comm_;
};

}  // namespace

void run_cp_worker(Executor& local, comm::Communicator& comm) {
  Channel channel(comm, local.device());
  try {
    for (;;) {
      const std::vector<int64_t> m = channel.receive();
      switch (m[0]) {
        case kShutdown:
          return;
        case kForward:
          replay_forward(local, comm, m);
          break;
        case kCopyState: {
          size_t at = 1;
          std::vector<int32_t> a, b;
          const RequestView src = get_request(local, m, at, a);
          const RequestView dst = get_request(local, m, at, b);
          local.copy_state(src, dst);
          break;
        }
        case kOption:
          local.set_switch(Switch(m.at(2)), m.at(1) != 0);
          break;
        case kPageFromHost:
        case kSlotFromHost:
          replay_from_host(local, m);
          break;
        default:
          DSV41RT_THROW_CODE(kInternal, "context-parallel worker ", comm.rank(),
                             ": unknown message kind ", m[0]);
      }
    }
  } catch (const std::exception& e) {
    comm.abort("rank " + std::to_string(comm.rank()) + " failed: " + e.what());
    throw;
  }
}

std::shared_ptr<Executor> make_cp_leader(std::shared_ptr<Executor> local,
                                         std::unique_ptr<comm::Communicator> comm,
                                         std::unique_ptr<CpWorkerThreads> workers, GroupKind kind) {
  return std::make_shared<CpLeader>(std::move(local), std::move(comm), std::move(workers), kind);
}

std::shared_ptr<Executor> make_cp_worker(std::shared_ptr<Executor> local,
                                         std::unique_ptr<comm::Communicator> comm) {
  return std::make_shared<CpWorker>(std::move(local), std::move(comm));
}

}  // namespace dsv41rt::model
