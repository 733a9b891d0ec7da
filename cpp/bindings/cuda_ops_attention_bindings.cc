// dsv41rt._core.cuda_ops bindings of the attention-side CUDA kernels, through the host-pointer test
// entries, with the CPU module's wrappers and signatures (bindings/attention_binders.h).
#include <nanobind/nanobind.h>

#include "bindings/attention_binders.h"
#ifdef DSV41RT_WITH_CUDA
#include "kernels/cuda/testing/attention_test_entry.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_cuda_ops_attention(nb::module_& ops) {
#ifdef DSV41RT_WITH_CUDA
  namespace e = kernels::cuda::testing;
  register_attention_family(ops,
                            AttentionFns{e::sparse_attention, e::compress_pool, e::indexer_scores,
                                         e::candidate_blocks, e::topk_select});
#else
  (void)ops;
#endif
}

}  // namespace dsv41rt::bindings
