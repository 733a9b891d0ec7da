// dsv41rt._core.ops bindings of the quant ops (kernels/quant.h): cache QDQ, packed cache rows and
// release-format weight dequantisation, numpy in / numpy out (fresh arrays), GIL released around
// the compute. The wrappers are shared with the CUDA op module (bindings/quant_binders.h).
#include <nanobind/nanobind.h>

#include "bindings/quant_binders.h"
#include "kernels/quant.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_quant(nb::module_& ops) {
  namespace k = kernels::cpu;
  register_quant_family(
      ops, QuantFns{k::fp8_window_qdq, k::nvfp4_qdq, k::mxfp4_qdq, k::fp8_window_pack,
                    k::nvfp4_pack, k::mxfp4_pack, k::fp8_window_unpack, k::nvfp4_unpack,
                    k::mxfp4_unpack, k::dequant_fp8_blocks, k::dequant_fp4_rows});
}

}  // namespace dsv41rt::bindings
