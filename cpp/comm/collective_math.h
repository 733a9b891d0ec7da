// The host-side arithmetic of the collectives, shared by the host communicators (LocalComm and
// SocketComm): one rank's output computed from every rank's input, reductions in rank order (so
// every rank gets bitwise the same values).
#pragma once

#include <cstddef>
#include <vector>

#include "comm/communicator.h"

namespace dsv41rt::comm::detail {

enum class Op : int { kAllGather, kReduceScatter, kAllReduce, kAllToAll, kBroadcast, kBarrier };

const char* op_name(Op op);
size_t element_bytes(DType t);
/// Elements of a rank's send buffer / of its output for `count` (the Communicator conventions).
size_t input_elements(Op op, size_t count, int size);
size_t output_elements(Op op, size_t count, int size);

/// Writes rank `rank`'s output of `op` into `out` from every rank's send buffer (`sends`, in rank
/// order). Throws Error for reductions of an unsupported dtype.
void collective_output(Op op, const std::vector<const void*>& sends, int rank, size_t count,
                       DType t, ReduceOp reduce, int root, void* out);

}  // namespace dsv41rt::comm::detail
