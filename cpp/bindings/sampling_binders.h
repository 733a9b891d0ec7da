// The numpy wrappers of the sampling ops (the filtered distribution and the seeded draw), shared by
// dsv41rt._core.ops (CPU reference) and dsv41rt._core.cuda_ops (CUDA kernels through host-pointer
// test entries): the implementation is passed as function pointers with the signatures of
// kernels/sampling.h. Parameters come as a dict whose keys are the SamplingParams fields.
#pragma once

#include <nanobind/nanobind.h>

#include <cstdint>

#include "kernels/sampling.h"

namespace dsv41rt::bindings {

struct SamplingFns {
  using Probs = void (*)(const float*, int64_t, const kernels::SamplingParams&, const int32_t*,
                         int64_t, const int32_t*, int64_t, float*);
  using Sample = kernels::SampledToken (*)(const float*, int64_t,
                                                const kernels::SamplingParams&, const int32_t*,
                                                int64_t, const int32_t*, int64_t, uint64_t);
  Probs sampling_probs;
  Sample sample_token;
};

/// Defines sampling_probs and sample_token on `ops` with the implementations in `fns`.
void register_sampling_family(nanobind::module_& ops, const SamplingFns& fns);

}  // namespace dsv41rt::bindings
