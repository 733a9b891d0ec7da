#include "runtime/model/group_collectives.h"

namespace dsv41rt::model {

GroupCollectives::GroupCollectives(Backend& be) : be_(be), host_backend_(be.device() == "cpu") {}

float* GroupCollectives::staging(int64_t floats) {
  if (host_floats_ < floats) {
    host_ = be_.alloc_host(floats * int64_t(sizeof(float)));
    host_floats_ = floats;
  }
  return static_cast<float*>(host_.get());
}

void GroupCollectives::all_gather(comm::Communicator& c, const float* send, float* recv,
                                  int64_t count, Stream s) {
  if (direct(c)) {
    // A host communicator completes before returning: the backend's work must be done first.
    if (!c.device_buffers()) be_.synchronize(s);
    c.all_gather(send, recv, size_t(count), DType::kF32, s.handle);
    return;
  }
  const int64_t P = c.size();
  float* hsend = staging((P + 1) * count);
  float* hrecv = hsend + count;
  be_.to_host(hsend, send, count * int64_t(sizeof(float)), s);
  be_.synchronize(s);
  c.all_gather(hsend, hrecv, size_t(count), DType::kF32, nullptr);
  be_.to_device(recv, hrecv, P * count * int64_t(sizeof(float)), s);
  be_.synchronize(s);  // the staging buffer is reused by the next call
}

void GroupCollectives::all_reduce_sum(comm::Communicator& c, float* buf, int64_t count, Stream s) {
  if (direct(c)) {
    if (!c.device_buffers()) be_.synchronize(s);
    c.all_reduce(buf, buf, size_t(count), DType::kF32, comm::ReduceOp::kSum, s.handle);
    return;
  }
  float* host = staging(count);
  be_.to_host(host, buf, count * int64_t(sizeof(float)), s);
  be_.synchronize(s);
  c.all_reduce(host, host, size_t(count), DType::kF32, comm::ReduceOp::kSum, nullptr);
  be_.to_device(buf, host, count * int64_t(sizeof(float)), s);
  be_.synchronize(s);
}

}  // namespace dsv41rt::model
