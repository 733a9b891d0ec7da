#include "comm/nccl_comm.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <thread>
#include <utility>

#include "comm/nccl_loader.h"
#include "comm/nccl_watchdog.h"
#include "core/status.h"

namespace dsv41rt::comm {
namespace {

void cuda_check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) [[unlikely]] {
    DSV41RT_THROW_CODE(kInternal, "NcclComm: ", what, " failed: ", cudaGetErrorName(err), ": ",
                       cudaGetErrorString(err));
  }
}

// NCCL runs on the device that was current when the communicator was made; the caller's thread
// may be on another one. Get/SetDevice are not stream work, so this is fine inside a capture.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cuda_check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      cuda_check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// A clear error before NCCL's own (which on a machine without a GPU is an opaque init failure).
void check_device(int device) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  DSV41RT_CHECK_CODE(kUnsupported, err == cudaSuccess, "NcclComm: no usable CUDA device (",
                     cudaGetErrorName(err), ": ", cudaGetErrorString(err), ")");
  DSV41RT_CHECK(device >= 0 && device < n, "NcclComm: CUDA device ", device, " does not exist (", n,
                " visible)");
}

// Moves copy elements untouched, so 1-byte float codes travel as bytes; fp4 packs two elements
// per byte and a count of them is not a byte count.
constexpr std::pair<DType, ncclDataType_t> kMoveTypes[] = {
    {DType::kF32, ncclFloat32}, {DType::kBF16, ncclBfloat16}, {DType::kF16, ncclFloat16},
    {DType::kI8, ncclInt8},     {DType::kI32, ncclInt32},     {DType::kI64, ncclInt64},
    {DType::kU8, ncclUint8},    {DType::kFP8E4M3, ncclUint8}, {DType::kE8M0, ncclUint8}};

ncclDataType_t move_type(DType dtype, const char* op) {
  for (const auto& [d, t] : kMoveTypes) {
    if (d == dtype) return t;
  }
  DSV41RT_THROW_CODE(kUnsupported, "NcclComm ", op, ": dtype ", dtype_name(dtype),
                     " is not supported (f32, bf16, f16, fp8_e4m3, e8m0, i8, i32, i64, u8)");
}

ncclDataType_t reduce_type(DType dtype, const char* op) {
  // Summing fp8/e8m0 codes as bytes would be wrong; NCCL's native fp8 needs >= 2.24 and sm_90.
  if (dtype == DType::kFP8E4M3 || dtype == DType::kE8M0 || dtype == DType::kFP4E2M1) {
    DSV41RT_THROW_CODE(kUnsupported, "NcclComm ", op, ": reductions of ", dtype_name(dtype),
                       " are not supported (f32, bf16, f16, i8, i32, i64, u8)");
  }
  return move_type(dtype, op);
}

ncclRedOp_t nccl_op(ReduceOp op) { return op == ReduceOp::kMax ? ncclMax : ncclSum; }

}  // namespace

std::string NcclComm::nccl_unique_id() {
  const NcclApi& api = nccl_api();
  ncclUniqueId id;
  const ncclResult_t r = api.get_unique_id(&id);
  DSV41RT_CHECK_CODE(kInternal, r == ncclSuccess, nccl_error_text(api, r, "ncclGetUniqueId"));
  return std::string(id.internal, sizeof(id.internal));
}

NcclComm::NcclComm(ncclComm* comm, int rank, int size, int cuda_device,
                   std::chrono::milliseconds barrier_timeout)
    : api_(&nccl_api()),
      comm_(comm),
      rank_(rank),
      size_(size),
      device_(cuda_device),
      barrier_timeout_(barrier_timeout) {
  // Everything barrier() needs is made here, so no collective ever allocates.
  try {
    DeviceGuard guard(device_);
    cudaStream_t stream = nullptr;
    cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    barrier_stream_ = stream;
    cuda_check(cudaMalloc(&barrier_value_, sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemset(barrier_value_, 0, sizeof(float)), "cudaMemset");
    // The watchdog reads comm_ from its thread; comm_ changes only after it is stopped
    // (abort_now, release), and its abort leaves comm_ alone (the main thread checks it first).
    watchdog_ = std::make_unique<NcclWatchdog>(
        device_, barrier_timeout_,
        [this] {
          ncclResult_t async = ncclSuccess;
          api_->comm_get_async_error(comm_, &async);
          return async == ncclSuccess || async == ncclInProgress
                     ? std::string()
                     : nccl_error_text(*api_, async, "asynchronous NCCL error");
        },
        [this] {
          // Wait (briefly) for an enqueue in progress; one blocked inside NCCL is what
          // ncclCommAbort is for, so abort regardless after a second.
          std::unique_lock<std::timed_mutex> lock(enqueue_mu_, std::defer_lock);
          (void)lock.try_lock_for(std::chrono::seconds(1));
          api_->comm_abort(comm_);
        });
  } catch (...) {
    release();
    throw;
  }
}

NcclComm::~NcclComm() { release(); }

void NcclComm::release() noexcept {
  const bool aborted = watchdog_fired();
  watchdog_.reset();  // joins its thread: nothing reads comm_ after this
  if (comm_ && !aborted) {
    // Destroy flushes outstanding work, which never finishes once NCCL has failed: abort then.
    ncclResult_t async = ncclSuccess;
    api_->comm_get_async_error(comm_, &async);
    if (async != ncclSuccess && async != ncclInProgress) {
      api_->comm_abort(comm_);
    } else {
      api_->comm_destroy(comm_);
    }
    comm_ = nullptr;
  }
  int previous = 0;
  const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                        cudaSetDevice(device_) == cudaSuccess;
  if (barrier_stream_) cudaStreamDestroy(barrier_stream_);
  if (barrier_value_) cudaFree(barrier_value_);
  barrier_stream_ = nullptr;
  barrier_value_ = nullptr;
  if (switched) cudaSetDevice(previous);
}

void NcclComm::abort(const std::string&) { abort_now(); }

void NcclComm::abort_now() noexcept {
  const bool aborted = watchdog_fired();
  watchdog_.reset();
  if (comm_ && !aborted) api_->comm_abort(comm_);
  comm_ = nullptr;
}

bool NcclComm::watchdog_fired() const { return watchdog_ && watchdog_->failed(); }

void NcclComm::check_healthy() const {
  DSV41RT_CHECK_CODE(kInternal, !watchdog_fired(), "NcclComm rank ", rank_, " of ", size_,
                     ": aborted by its watchdog: ", watchdog_->reason());
}

std::unique_lock<std::timed_mutex> NcclComm::enqueue_lock(const char* op) {
  std::unique_lock<std::timed_mutex> lock(enqueue_mu_);
  DSV41RT_CHECK_CODE(kInternal, !watchdog_fired(), "NcclComm ", op, " (rank ", rank_, " of ", size_,
                     "): the communicator was aborted by its watchdog: ", watchdog_->reason());
  return lock;
}

void NcclComm::watch(const char* op, void* stream) {
  if (watchdog_) watchdog_->track(op, stream);
}

// Validates a call whose largest buffer holds `chunks` * count elements and that the communicator
// is healthy; returns count's bytes. Host-side only (an atomic read), so capture safe.
size_t NcclComm::prepare(const char* op, const void* send, const void* recv, size_t count,
                         DType dtype, int chunks) const {
  const size_t elem = size_t(dtype_bits(dtype) / 8);
  DSV41RT_CHECK(count <= SIZE_MAX / size_t(chunks) / elem, "NcclComm ", op, ": count ", count,
                " overflows");
  DSV41RT_CHECK(count == 0 || (send && recv), "NcclComm ", op, ": NULL buffer (send ", send,
                ", recv ", recv, ") for ", count, " elements");
  check_usable(op);
  return count * elem;
}

void NcclComm::check_usable(const char* op) const {
  DSV41RT_CHECK_CODE(kInternal, comm_ != nullptr, "NcclComm ", op, " (rank ", rank_,
                     "): the communicator was aborted after an earlier error");
  DSV41RT_CHECK_CODE(kInternal, !watchdog_fired(), "NcclComm ", op, " (rank ", rank_, " of ", size_,
                     "): the communicator was aborted by its watchdog: ", watchdog_->reason());
  ncclResult_t async = ncclSuccess;
  api_->comm_get_async_error(comm_, &async);
  DSV41RT_CHECK_CODE(kInternal, async == ncclSuccess || async == ncclInProgress,
                     nccl_error_text(*api_, async, "NcclComm: asynchronous NCCL error"), " before ",
                     op, " on rank ", rank_);
}

void NcclComm::check_nccl(int result, const char* what) const {
  DSV41RT_CHECK_CODE(kInternal, result == ncclSuccess, "NcclComm rank ", rank_, " of ", size_, ": ",
                     nccl_error_text(*api_, ncclResult_t(result), what));
}

void NcclComm::all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  const ncclDataType_t type = move_type(dtype, "all_gather");
  const size_t bytes = prepare("all_gather", send, recv, count, dtype, size_);
  if (bytes == 0) return;
  DeviceGuard guard(device_);
  const auto lock = enqueue_lock("all_gather");
  check_nccl(api_->all_gather(send, recv, type == ncclUint8 ? bytes : count, type, comm_,
                              static_cast<cudaStream_t>(stream)),
             "ncclAllGather");
  watch("all_gather", stream);
}

void NcclComm::reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              void* stream) {
  const ncclDataType_t type = reduce_type(dtype, "reduce_scatter");
  prepare("reduce_scatter", send, recv, count, dtype, size_);
  if (count == 0) return;
  DeviceGuard guard(device_);
  const auto lock = enqueue_lock("reduce_scatter");
  check_nccl(api_->reduce_scatter(send, recv, count, type, nccl_op(op), comm_,
                                  static_cast<cudaStream_t>(stream)),
             "ncclReduceScatter");
  watch("reduce_scatter", stream);
}

void NcclComm::all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          void* stream) {
  const ncclDataType_t type = reduce_type(dtype, "all_reduce");
  prepare("all_reduce", send, recv, count, dtype, 1);
  if (count == 0) return;
  DeviceGuard guard(device_);
  const auto lock = enqueue_lock("all_reduce");
  check_nccl(api_->all_reduce(send, recv, count, type, nccl_op(op), comm_,
                              static_cast<cudaStream_t>(stream)),
             "ncclAllReduce");
  watch("all_reduce", stream);
}

void NcclComm::broadcast(void* buf, size_t count, DType dtype, int root, void* stream) {
  const ncclDataType_t type = move_type(dtype, "broadcast");
  DSV41RT_CHECK(root >= 0 && root < size_, "NcclComm broadcast: root ", root, " of ", size_);
  const size_t bytes = prepare("broadcast", buf, buf, count, dtype, 1);
  if (bytes == 0) return;
  DeviceGuard guard(device_);
  const auto lock = enqueue_lock("broadcast");
  check_nccl(api_->broadcast(buf, buf, type == ncclUint8 ? bytes : count, type, root, comm_,
                             static_cast<cudaStream_t>(stream)),
             "ncclBroadcast");
  watch("broadcast", stream);
}

void NcclComm::all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream) {
  const ncclDataType_t type = move_type(dtype, "all_to_all");
  const size_t bytes = prepare("all_to_all", send, recv, count, dtype, size_);
  if (bytes == 0) return;
  // Point-to-point chunks land while others are still being read: no in-place form exists.
  const uintptr_t s = reinterpret_cast<uintptr_t>(send), d = reinterpret_cast<uintptr_t>(recv);
  const size_t total = bytes * size_t(size_);
  DSV41RT_CHECK(s + total <= d || d + total <= s,
                "NcclComm all_to_all: send and recv overlap; it cannot run in place");
  DeviceGuard guard(device_);
  const size_t n = type == ncclUint8 ? bytes : count;
  const auto* in = static_cast<const uint8_t*>(send);
  auto* out = static_cast<uint8_t*>(recv);
  auto* st = static_cast<cudaStream_t>(stream);
  const auto lock = enqueue_lock("all_to_all");
  // One fused launch for all peers; the group is always closed, even after a failed call.
  check_nccl(api_->group_start(), "ncclGroupStart");
  ncclResult_t first = ncclSuccess;
  const char* failed = nullptr;
  for (int p = 0; p < size_ && first == ncclSuccess; ++p) {
    const size_t off = size_t(p) * bytes;
    first = api_->send(in + off, n, type, p, comm_, st);
    failed = "ncclSend";
    if (first == ncclSuccess) {
      first = api_->recv(out + off, n, type, p, comm_, st);
      failed = "ncclRecv";
    }
  }
  const ncclResult_t end = api_->group_end();
  check_nccl(first, failed);
  check_nccl(end, "ncclGroupEnd (all_to_all)");
  watch("all_to_all", stream);
}

void NcclComm::barrier() {
  check_usable("barrier");
  DeviceGuard guard(device_);
  check_nccl(api_->all_reduce(barrier_value_, barrier_value_, 1, ncclFloat32, ncclSum, comm_,
                              barrier_stream_),
             "ncclAllReduce (barrier)");
  // Poll rather than cudaStreamSynchronize: a rank that never arrives must not hang us forever,
  // and a peer failure shows up as an asynchronous NCCL error while we wait.
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + barrier_timeout_;
  for (auto pause = std::chrono::microseconds(10);;
       pause = std::min(pause * 2, std::chrono::microseconds(1000))) {
    const cudaError_t q = cudaStreamQuery(barrier_stream_);
    if (q == cudaSuccess) return;
    if (q != cudaErrorNotReady) cuda_check(q, "cudaStreamQuery (barrier)");
    ncclResult_t async = ncclSuccess;
    api_->comm_get_async_error(comm_, &async);
    const bool failed = async != ncclSuccess && async != ncclInProgress;
    if (failed || Clock::now() > deadline) {
      const std::string why = failed ? nccl_error_text(*api_, async, "asynchronous NCCL error")
                                     : "not every rank arrived within " +
                                           std::to_string(barrier_timeout_.count()) + " ms";
      abort_now();
      DSV41RT_THROW_CODE(kInternal, "NcclComm barrier (rank ", rank_, " of ", size_, "): ", why,
                         "; the communicator is aborted");
    }
    std::this_thread::sleep_for(pause);
  }
}

std::unique_ptr<Communicator> make_nccl_comm(const std::string& unique_id, int rank, int size,
                                             int cuda_device,
                                             std::chrono::milliseconds barrier_timeout) {
  DSV41RT_CHECK(unique_id.size() == NCCL_UNIQUE_ID_BYTES, "NcclComm: the unique id must be ",
                NCCL_UNIQUE_ID_BYTES, " bytes (from nccl_unique_id()), got ", unique_id.size());
  DSV41RT_CHECK(size >= 1 && rank >= 0 && rank < size, "NcclComm: rank ", rank,
                " is not in a group of ", size);
  const NcclApi& api = nccl_api();
  check_device(cuda_device);
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), sizeof(id.internal));
  ncclComm_t comm = nullptr;
  {
    DeviceGuard guard(cuda_device);  // NCCL binds the communicator to the current device
    const ncclResult_t r = api.comm_init_rank(&comm, size, id, rank);
    DSV41RT_CHECK_CODE(kInternal, r == ncclSuccess, nccl_error_text(api, r, "ncclCommInitRank"),
                       " (rank ", rank, " of ", size, ", CUDA device ", cuda_device, ")");
  }
  return std::make_unique<NcclComm>(comm, rank, size, cuda_device, barrier_timeout);
}

std::unique_ptr<Communicator> make_nccl_comm_single(int cuda_device,
                                                    std::chrono::milliseconds barrier_timeout) {
  const NcclApi& api = nccl_api();
  check_device(cuda_device);
  ncclComm_t comm = nullptr;
  const ncclResult_t r = api.comm_init_all(&comm, 1, &cuda_device);
  DSV41RT_CHECK_CODE(kInternal, r == ncclSuccess, nccl_error_text(api, r, "ncclCommInitAll"),
                     " (CUDA device ", cuda_device, ")");
  return std::make_unique<NcclComm>(comm, 0, 1, cuda_device, barrier_timeout);
}

}  // namespace dsv41rt::comm
