// The numpy wrappers of the Engram ops (hash rows, gated residual update), shared by
// dsv41rt._core.ops (CPU reference) and dsv41rt._core.cuda_ops (CUDA kernels through host-pointer
// test entries): the implementation is passed as function pointers with the signatures of
// kernels/engram.h.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

namespace dsv41rt::bindings {

struct EngramFns {
  using HashRows = void (*)(const int64_t*, int64_t, int64_t, int64_t, const int64_t*,
                            const int64_t*, const int64_t*, int64_t, int64_t*);
  using Forward = void (*)(float*, const float*, const float*, const float*, const float*,
                           const uint8_t*, int64_t, int64_t, int64_t, int64_t, float);
  HashRows engram_hash_rows;
  Forward engram_forward;
};

/// Defines engram_hash_rows and engram_forward on `ops` with the implementations in `fns`.
void register_engram_family(nanobind::module_& ops, const EngramFns& fns);

}  // namespace dsv41rt::bindings
