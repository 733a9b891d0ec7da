// dsv41rt._core.ops bindings of the attention-side CPU ops (the wrappers are shared with the CUDA
// op module: bindings/attention_binders.h).
#include <nanobind/nanobind.h>

#include "bindings/attention_binders.h"
#include "kernels/attention.h"
#include "kernels/compressor.h"
#include "kernels/indexer.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_attention(nb::module_& ops) {
  namespace c = kernels::cpu;
  register_attention_family(ops,
                            AttentionFns{c::sparse_attention, c::compress_pool, c::indexer_scores,
                                         c::candidate_blocks, c::topk_select});
}

}  // namespace dsv41rt::bindings
