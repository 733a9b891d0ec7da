// The dsv41rt._core extension module: wires the exception type and the per-area bindings.
#include <nanobind/nanobind.h>

#include "core/device.h"
#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
// Defined in dtype_bindings.cc and checkpoint_bindings.cc.
void register_dtype(nb::module_& m);
void register_checkpoint(nb::module_& m);
void register_ops(nb::module_& m);
void register_model_config(nb::module_& m);
void register_engine(nb::module_& m);
void register_comm(nb::module_& m);
}  // namespace dsv41rt::bindings

NB_MODULE(_core, m) {
  m.doc() = "dsv41rt C++ core: the engine and executors, checkpoints, dtype codecs, CPU ops, comm.";
  // Subclass of ValueError: every library error is about bad input (a malformed file, an
  // unknown dtype), so callers catching ValueError keep working. The message is Error::what(),
  // i.e. "file.cc:LINE: ..." naming the offending checkpoint file and tensor.
  nb::exception<dsv41rt::Error>(m, "Error", PyExc_ValueError);
  dsv41rt::bindings::register_dtype(m);
  dsv41rt::bindings::register_checkpoint(m);
  dsv41rt::bindings::register_ops(m);
  dsv41rt::bindings::register_model_config(m);
  dsv41rt::bindings::register_engine(m);
  dsv41rt::bindings::register_comm(m);
  m.def("cuda_device_count", &dsv41rt::cuda_device_count,
        "Number of usable CUDA devices (0 for CPU-only builds or without a driver).");
}
