// NcclWatchdog: watches one NCCL communicator's collectives from a thread of its own.
//
// Why: NCCL collectives are only enqueued; a rank that dies (or calls differently) leaves the other
// ranks' NCCL kernels waiting forever, and with them every host thread that synchronises on the
// stream. Nothing else would ever notice. Each enqueue records an event on its stream (track());
// a collective not complete within `timeout`, or an asynchronous NCCL error, makes the watchdog
// call `abort` once (the communicator's ncclCommAbort: the collectives in flight return) and keep
// the reason, which the communicator's later calls and check_healthy() throw.
//
// Under stream capture nothing is tracked (the event would belong to the graph, not to a run).
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

struct CUevent_st;  // cudaEvent_t

namespace dsv41rt::comm {

class NcclWatchdog {
 public:
  /// `async_error`: the communicator's asynchronous error as text, empty when there is none.
  /// `abort`: aborts the communicator (called once, from the watchdog's thread).
  NcclWatchdog(int cuda_device, std::chrono::milliseconds timeout,
               std::function<std::string()> async_error, std::function<void()> abort);
  /// Stops the thread (without aborting) and frees the events.
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  /// After `op` was enqueued on `stream` (a cudaStream_t): watch it. Throws Error when the event
  /// cannot be recorded.
  void track(const char* op, void* stream);
  bool failed() const;
  /// Why the watchdog aborted the communicator ("" while it has not).
  std::string reason() const;

 private:
  struct Pending {
    CUevent_st* event;
    const char* op;
    std::chrono::steady_clock::time_point enqueued;
  };
  void run() noexcept;
  // Under mu_: drops the completed collectives at the front; the reason to abort, or "".
  std::string check_locked();

  const int device_;
  const std::chrono::milliseconds timeout_;
  const std::function<std::string()> async_error_;
  const std::function<void()> abort_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::deque<Pending> pending_;
  std::vector<CUevent_st*> spare_;
  std::string reason_;
  bool failed_ = false, stop_ = false;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace dsv41rt::comm
