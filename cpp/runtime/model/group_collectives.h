// The model runner's collectives over backend buffers (design: docs/design/parallelism.md). One
// place decides how a group's data moves: stream-ordered on a device communicator (NCCL, no host
// round trip, capturable); through pinned host staging when a host communicator (LocalComm
// virtual ranks, TCP sockets) serves a device backend; directly on the CPU backend.
#pragma once

#include <cstdint>
#include <memory>

#include "comm/communicator.h"
#include "runtime/model/backend.h"

namespace dsv41rt::model {

class GroupCollectives {
 public:
  explicit GroupCollectives(Backend& be);
  /// recv [P * count] = every rank's send [count], rank-major (P = c.size()).
  void all_gather(comm::Communicator& c, const float* send, float* recv, int64_t count, Stream s);
  /// buf [count] = the sum over the ranks of their buf (in place; the same bits on every rank).
  void all_reduce_sum(comm::Communicator& c, float* buf, int64_t count, Stream s);

 private:
  // Pinned host memory of at least `floats` floats (kept and grown).
  float* staging(int64_t floats);
  bool direct(const comm::Communicator& c) const { return c.device_buffers() || host_backend_; }

  Backend& be_;
  const bool host_backend_;
  std::shared_ptr<void> host_;
  int64_t host_floats_ = 0;
};

}  // namespace dsv41rt::model
