// dsv41rt._core.ops: the CPU reference ops on numpy arrays, so Python tests can compare each op
// with an independent implementation (NeMo Automodel, torch). One registration function per area,
// each in its own ops_<area>_bindings.cc.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include "core/status.h"
#include "kernels/linear.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_quant(nb::module_& ops);
void register_ops_norm(nb::module_& ops);
void register_ops_moe(nb::module_& ops);
void register_ops_attention(nb::module_& ops);
void register_ops_sampling(nb::module_& ops);

namespace {
using F32In = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::numpy, float> linear_np(F32In x, F32In w) {
  DSV41RT_CHECK(x.shape(1) == w.shape(1), "linear: x has ", x.shape(1), " columns, w has ",
                w.shape(1));
  const int64_t m = x.shape(0), k = x.shape(1), n = w.shape(0);
  auto* y = new float[m * n];
  nb::capsule owner(y, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  {
    nb::gil_scoped_release release;  // pure C++ compute on borrowed buffers
    kernels::cpu::linear(x.data(), w.data(), m, k, n, y);
  }
  return nb::ndarray<nb::numpy, float>(y, {size_t(m), size_t(n)}, owner);
}
}  // namespace

void register_ops(nb::module_& m) {
  nb::module_ ops = m.def_submodule("ops", "CPU reference ops (FP32) on numpy arrays, for tests.");
  ops.def("linear", &linear_np, nb::arg("x"), nb::arg("w"), "y = x @ w.T (FP32)");
  register_ops_quant(ops);
  register_ops_norm(ops);
  register_ops_moe(ops);
  register_ops_attention(ops);
  register_ops_sampling(ops);
}

}  // namespace dsv41rt::bindings
