#include "comm/collective_math.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "core/enum_names.h"
#include "core/status.h"

namespace dsv41rt::comm::detail {
namespace {

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
      DSV41RT_THROW_CODE(kUnsupported, "host collectives: reductions of ", dtype_name(t),
                         " are not supported (F32, BF16, I32, I64)");
  }
}

}  // namespace

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

const char* op_name(Op op) {
  static constexpr const char* kNames[] = {"all_gather", "reduce_scatter", "all_reduce",
                                           "all_to_all", "broadcast",      "barrier"};
  return enum_name(op, kNames, "?");
}

size_t input_elements(Op op, size_t count, int size) {
  return op == Op::kReduceScatter || op == Op::kAllToAll ? count * size_t(size)
         : op == Op::kBarrier                            ? 0
                                                         : count;
}

size_t output_elements(Op op, size_t count, int size) {
  return op == Op::kAllGather || op == Op::kAllToAll ? count * size_t(size)
         : op == Op::kBarrier                        ? 0
                                                     : count;
}

void collective_output(Op op, const std::vector<const void*>& sends, int rank, size_t count,
                       DType t, ReduceOp reduce_op, int root, void* out) {
  const size_t bytes = count * element_bytes(t);
  uint8_t* o = static_cast<uint8_t*>(out);
  switch (op) {
    case Op::kAllGather:
      for (size_t r = 0; r < sends.size(); ++r) std::memcpy(o + r * bytes, sends[r], bytes);
      return;
    case Op::kReduceScatter:
      return reduce(out, sends, size_t(rank) * count, count, t, reduce_op);
    case Op::kAllReduce:
      return reduce(out, sends, 0, count, t, reduce_op);
    case Op::kAllToAll:
      for (size_t p = 0; p < sends.size(); ++p) {
        std::memcpy(o + p * bytes, static_cast<const uint8_t*>(sends[p]) + size_t(rank) * bytes,
                    bytes);
      }
      return;
    case Op::kBroadcast:
      std::memcpy(out, sends[size_t(root)], bytes);
      return;
    case Op::kBarrier:
      return;
  }
}

}  // namespace dsv41rt::comm::detail
