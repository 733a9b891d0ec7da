// The communication interface model code sees (design: docs/design/context-parallel.md, to come
// with the CP issue). Collectives over the ranks of one group, with NCCL's buffer conventions:
//   all_gather:     send [count]          -> recv [size * count], rank-major
//   reduce_scatter: send [size * count]   -> recv [count], rank r gets the reduction of chunk r
//   all_reduce:     send [count]          -> recv [count]
//   all_to_all:     send [size * count]   -> recv [size * count]; chunk p of rank r's recv is
//                   chunk r of rank p's send
//   broadcast:      buf [count] of rank `root` -> buf [count] of every rank (in place)
// `stream` is the cudaStream_t of GPU implementations (collectives are stream-ordered there) and
// ignored by CPU ones, which complete before returning. Reductions run in rank order, so every
// rank gets bitwise the same result. Errors (mismatched calls between ranks, a rank that never
// arrives) throw dsv41rt::Error on every rank involved; no collective hangs forever.
#pragma once

#include <cstddef>
#include <string>

#include "core/dtype.h"
#include "core/export.h"

namespace dsv41rt::comm {

enum class ReduceOp { kSum, kMax };

class DSV41RT_API Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_gather(const void* send, void* recv, size_t count, DType dtype,
                          void* stream = nullptr) = 0;
  virtual void reduce_scatter(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                              void* stream = nullptr) = 0;
  virtual void all_reduce(const void* send, void* recv, size_t count, DType dtype, ReduceOp op,
                          void* stream = nullptr) = 0;
  virtual void all_to_all(const void* send, void* recv, size_t count, DType dtype,
                          void* stream = nullptr) = 0;
  virtual void broadcast(void* buf, size_t count, DType dtype, int root,
                         void* stream = nullptr) = 0;
  virtual void barrier() = 0;
  /// True when the buffers are device memory used on `stream` (NCCL); false for host-memory
  /// communicators (LocalComm), which a GPU caller stages through host memory.
  virtual bool device_buffers() const { return false; }
  /// Makes the group unusable so that ranks blocked in (or arriving at) a collective fail with
  /// `reason` instead of waiting for a rank that will not come; called by a group driver when
  /// one rank failed. Safe from any thread.
  virtual void abort(const std::string& reason) = 0;
  /// Throws the error that made the group unusable behind the caller's back (NCCL: its watchdog
  /// aborted a collective that did not complete); nothing otherwise. Called after a forward's
  /// results are synchronised, so that results a failed collective cut short are never used.
  virtual void check_healthy() const {}
  /// Watches work enqueued on `stream` that holds this group's collectives without a call of
  /// this communicator (a replayed CUDA graph that captured them): a device communicator's
  /// watchdog then aborts the group if that work does not complete in time. No-op by default.
  virtual void watch_launch(const char* what, void* stream) {
    (void)what;
    (void)stream;
  }
};

}  // namespace dsv41rt::comm
