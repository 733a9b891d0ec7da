// dsv41rt._core.ops bindings of the moe ops.
#include <nanobind/nanobind.h>

namespace nb = nanobind;

namespace dsv41rt::bindings {

void register_ops_moe(nb::module_& ops) { (void)ops; }

}  // namespace dsv41rt::bindings
