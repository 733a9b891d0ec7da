#include "comm/nccl_watchdog.h"

#include <cuda_runtime.h>

#include <utility>

#include "core/status.h"

namespace dsv41rt::comm {

NcclWatchdog::NcclWatchdog(int cuda_device, std::chrono::milliseconds timeout,
                           std::function<std::string()> async_error, std::function<void()> abort)
    : device_(cuda_device),
      timeout_(timeout),
      async_error_(std::move(async_error)),
      abort_(std::move(abort)),
      thread_([this] { run(); }) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
  for (const Pending& p : pending_) cudaEventDestroy(p.event);
  for (CUevent_st* e : spare_) cudaEventDestroy(e);
}

void NcclWatchdog::track(const char* op, void* stream) {
  auto* s = static_cast<cudaStream_t>(stream);
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &capture) != cudaSuccess) cudaGetLastError();
  if (capture != cudaStreamCaptureStatusNone) return;
  std::lock_guard<std::mutex> lock(mu_);
  cudaEvent_t event = nullptr;
  if (!spare_.empty()) {
    event = spare_.back();
    spare_.pop_back();
  } else {
    const cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    DSV41RT_CHECK_CODE(kInternal, e == cudaSuccess,
                       "NcclComm watchdog: cudaEventCreate failed: ", cudaGetErrorString(e));
  }
  const cudaError_t e = cudaEventRecord(event, s);
  if (e != cudaSuccess) {
    spare_.push_back(event);
    DSV41RT_THROW_CODE(kInternal, "NcclComm watchdog: cudaEventRecord after ", op,
                       " failed: ", cudaGetErrorString(e));
  }
  pending_.push_back({event, op, std::chrono::steady_clock::now()});
  wake_.notify_one();
}

bool NcclWatchdog::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_;
}

std::string NcclWatchdog::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

std::string NcclWatchdog::check_locked() {
  while (!pending_.empty()) {
    const cudaError_t q = cudaEventQuery(pending_.front().event);
    if (q == cudaErrorNotReady) break;
    if (q != cudaSuccess) {
      cudaGetLastError();
      return std::string(pending_.front().op) + " failed on the device: " + cudaGetErrorString(q);
    }
    spare_.push_back(pending_.front().event);
    pending_.pop_front();
  }
  if (!pending_.empty()) {
    const auto age = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - pending_.front().enqueued);
    if (age > timeout_) {
      return std::string(pending_.front().op) + " did not complete within " +
             std::to_string(timeout_.count()) +
             " ms (a rank died, stopped, or made a different call)";
    }
    std::string async = async_error_();
    if (!async.empty()) return async;
  }
  return {};
}

void NcclWatchdog::run() noexcept {
  if (cudaSetDevice(device_) != cudaSuccess) cudaGetLastError();  // for the event queries
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    // Idle without collectives in flight (or once aborted); otherwise poll often enough for
    // short timeouts.
    if (pending_.empty() || failed_) {
      wake_.wait(lock, [this] { return stop_ || (!failed_ && !pending_.empty()); });
    } else {
      wake_.wait_for(lock, std::chrono::milliseconds(20));
    }
    if (stop_ || failed_) continue;
    std::string why = check_locked();
    if (why.empty()) continue;
    failed_ = true;
    reason_ = std::move(why);
    lock.unlock();  // the abort can take a while; track() and failed() must not wait for it
    abort_();
    lock.lock();
  }
}

}  // namespace dsv41rt::comm
