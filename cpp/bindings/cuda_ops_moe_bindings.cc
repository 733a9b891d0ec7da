// dsv41rt._core.cuda_ops bindings of the moe CUDA kernels.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_cuda_ops_moe(nb::module_& ops) { (void)ops; }

}  // namespace dsv41rt::bindings
