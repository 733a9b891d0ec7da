// dsv41rt._core.ops bindings of the sampling ops (wrappers shared with the CUDA op module:
// bindings/sampling_binders.h).
#include <nanobind/nanobind.h>

#include "bindings/sampling_binders.h"
#include "kernels/sampling.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_sampling(nb::module_& ops) {
  register_sampling_family(ops,
                           SamplingFns{kernels::cpu::sampling_probs, kernels::cpu::sample_token});
}

}  // namespace dsv41rt::bindings
