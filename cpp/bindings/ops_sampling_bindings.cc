// dsv41rt._core.ops bindings of the sampling ops.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_sampling(nb::module_& ops) { (void)ops; }

}  // namespace dsv41rt::bindings
