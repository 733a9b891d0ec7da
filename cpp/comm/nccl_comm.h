// NcclComm: the Communicator over NCCL, one rank per GPU (one per process, or several GPUs driven
// from one process). libnccl.so.2 is loaded at first use (comm/nccl_loader.h), never linked.
//
// Collectives are only ENQUEUED on the caller's stream (a cudaStream_t; nullptr = the legacy
// default stream): no host synchronisation and no allocation happens inside them, so they can be
// recorded into a CUDA graph (create the communicator before the capture, and destroy graphs
// that replay its collectives before the communicator). Buffers are device pointers on the
// communicator's GPU. NCCL cannot check that the ranks made matching calls: a mismatch (or a dead
// rank) would hang the GPU work; a watchdog thread (nccl_watchdog.h) aborts the communicator when
// a collective has not completed within the timeout or NCCL reports an asynchronous error, and
// the next call and check_healthy() throw the reason. barrier() waits for itself likewise.
//
// Data types: moves (all_gather, all_to_all) take every dtype with whole-byte elements (f32,
// bf16, f16, fp8_e4m3 and e8m0 as bytes, i8, i32, i64, u8); reductions take f32, bf16, f16, i8,
// i32, i64, u8. Others (fp4_e2m1: two elements per byte) throw Error naming the dtype.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "comm/communicator.h"

struct ncclComm;     // NCCL's communicator (ncclComm_t): this header needs no nccl.h
struct CUstream_st;  // cudaStream_t

namespace dsv41rt::comm {

struct NcclApi;
class NcclWatchdog;

class DSV41RT_API NcclComm final : public Communicator {
 public:
  /// The 128 bytes of a fresh ncclUniqueId. Rank 0 makes it and ships it to the other ranks.
  static std::string nccl_unique_id();

  /// Takes ownership of an initialised NCCL communicator; use make_nccl_comm*() instead.
  NcclComm(ncclComm* comm, int rank, int size, int cuda_device,
           std::chrono::milliseconds barrier_timeout);
  ~NcclComm() override;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  int cuda_device() const { return device_; }

  void all_gather(const void* send, void* recv, size_t count, DType dtype,
                  void* stream = nullptr) override;
  void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                      void* stream = nullptr) override;
  void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                  void* stream = nullptr) override;
  void all_to_all(const void* send, void* recv, size_t count, DType dtype,
                  void* stream = nullptr) override;
  void broadcast(void* buf, size_t count, DType dtype, int root, void* stream = nullptr) override;
  /// A 1-element all_reduce on an internal stream, waited for on the host (so: not inside a
  /// graph capture). Throws, and aborts the communicator, if NCCL reports an asynchronous error
  /// (a peer died) or the ranks do not all arrive within the barrier timeout.
  void barrier() override;
  bool device_buffers() const override { return true; }  // device pointers, stream-ordered
  /// ncclCommAbort: collectives in flight on the GPU return; the communicator is unusable after.
  void abort(const std::string& reason) override;
  /// Throws (kInternal) with the watchdog's reason once it has aborted the communicator.
  void check_healthy() const override;
  /// A replayed graph's collectives: the watchdog watches `stream` past them.
  void watch_launch(const char* what, void* stream) override { watch(what, stream); }

 private:
  size_t prepare(const char* op, const void* send, const void* recv, size_t count, DType dtype,
                 int chunks) const;
  void check_usable(const char* op) const;
  void check_nccl(int result, const char* what) const;  // throws unless ncclSuccess
  void abort_now() noexcept;
  void release() noexcept;
  // Serialises an enqueue with the watchdog's abort (which must not free the communicator under
  // a call) and refuses once the watchdog has aborted; then watch(op, stream) after the enqueue.
  std::unique_lock<std::timed_mutex> enqueue_lock(const char* op);
  void watch(const char* op, void* stream);
  bool watchdog_fired() const;

  const NcclApi* api_;
  ncclComm* comm_;
  int rank_;
  int size_;
  int device_;
  std::chrono::milliseconds barrier_timeout_;
  CUstream_st* barrier_stream_ = nullptr;
  void* barrier_value_ = nullptr;  // the barrier's one f32, on device_
  std::timed_mutex enqueue_mu_;
  std::unique_ptr<NcclWatchdog> watchdog_;
};

/// Whether NCCL can be used: built with it and libnccl.so.2 loads. Never throws.
DSV41RT_API bool nccl_available() noexcept;

/// "NCCL 2.27.3 (/path/libnccl.so.2)"; throws Error "NCCL not available: ..." otherwise.
DSV41RT_API std::string nccl_library_info();

/// Rank `rank` of a `size`-rank group on CUDA device `cuda_device`. Every rank calls this with the
/// same `unique_id` (from NcclComm::nccl_unique_id() on rank 0); it returns once all have joined.
/// `barrier_timeout` bounds barrier() and, through the watchdog, every collective's completion.
DSV41RT_API std::unique_ptr<Communicator> make_nccl_comm(
    const std::string& unique_id, int rank, int size, int cuda_device,
    std::chrono::milliseconds barrier_timeout = std::chrono::minutes(10));

/// A one-rank group on `cuda_device` (collectives become copies; for tests and single-GPU runs).
DSV41RT_API std::unique_ptr<Communicator> make_nccl_comm_single(
    int cuda_device, std::chrono::milliseconds barrier_timeout = std::chrono::minutes(10));

}  // namespace dsv41rt::comm
