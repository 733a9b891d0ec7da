// dsv41rt._core.cuda_ops: the CUDA kernels on numpy arrays (host in, host out), for the
// device-parameterised op tests that compare every CUDA kernel with its CPU reference
// (tests/python/test_cuda_ops_*.py). Present only in CUDA builds; calling it without a GPU raises.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_cuda_ops_norm(nb::module_& ops);
void register_cuda_ops_quant(nb::module_& ops);
void register_cuda_ops_attention(nb::module_& ops);
void register_cuda_ops_moe(nb::module_& ops);

void register_cuda_ops(nb::module_& m) {
#ifdef DSV41RT_WITH_CUDA
  nb::module_ ops = m.def_submodule("cuda_ops", "CUDA kernels on numpy arrays, for op tests.");
  register_cuda_ops_norm(ops);
  register_cuda_ops_quant(ops);
  register_cuda_ops_attention(ops);
  register_cuda_ops_moe(ops);
#else
  (void)m;
#endif
}

}  // namespace dsv41rt::bindings
