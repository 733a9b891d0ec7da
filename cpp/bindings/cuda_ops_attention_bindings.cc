// dsv41rt._core.cuda_ops bindings of the attention CUDA kernels.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_cuda_ops_attention(nb::module_& ops) { (void)ops; }

}  // namespace dsv41rt::bindings
