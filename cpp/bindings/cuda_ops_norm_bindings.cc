// dsv41rt._core.cuda_ops bindings of the norm-family CUDA kernels.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>

#include <optional>
#include <vector>

#include "core/status.h"
#ifdef DSV41RT_WITH_CUDA
#include "kernels/cuda/testing/norm_test_entry.h"
#endif

namespace nb = nanobind;

namespace dsv41rt::bindings {

#ifdef DSV41RT_WITH_CUDA
namespace {

using F32In = nb::ndarray<const float, nb::c_contig, nb::device::cpu>;

nb::ndarray<nb::numpy, float> rms_norm_np(F32In x, std::optional<F32In> weight, float eps) {
  DSV41RT_CHECK(x.ndim() >= 1, "rms_norm: x must have at least one dimension");
  const int64_t dim = x.shape(x.ndim() - 1), rows = dim ? int64_t(x.size()) / dim : 0;
  DSV41RT_CHECK(!weight || int64_t(weight->size()) == dim, "rms_norm: weight has ",
                weight ? weight->size() : 0, " elements, x rows have ", dim);
  float* y = new float[x.size() ? x.size() : 1];
  nb::capsule owner(y, [](void* p) noexcept { delete[] static_cast<float*>(p); });
  std::vector<size_t> shape(x.ndim());
  for (size_t i = 0; i < x.ndim(); ++i) shape[i] = x.shape(i);
  {
    nb::gil_scoped_release release;
    kernels::cuda::testing::rms_norm(x.data(), weight ? weight->data() : nullptr, rows, dim, eps,
                                     y);
  }
  return nb::ndarray<nb::numpy, float>(y, shape.size(), shape.data(), owner);
}

}  // namespace

void register_cuda_ops_norm(nb::module_& ops) {
  ops.def("rms_norm", &rms_norm_np, nb::arg("x"), nb::arg("weight").none(), nb::arg("eps"));
}
#else
void register_cuda_ops_norm(nb::module_&) {}
#endif

}  // namespace dsv41rt::bindings
