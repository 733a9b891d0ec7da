// The dsv41rt._core extension module: wires the exception type and the per-area bindings.
#include <nanobind/nanobind.h>

#include <exception>

#include "core/device.h"
#include "core/status.h"

namespace nb = nanobind;

namespace dsv41rt::bindings {
// Defined in dtype_bindings.cc and checkpoint_bindings.cc.
void register_dtype(nb::module_& m);
void register_checkpoint(nb::module_& m);
void register_ops(nb::module_& m);
void register_model_config(nb::module_& m);
void register_runtime(nb::module_& m);
void register_comm(nb::module_& m);
}  // namespace dsv41rt::bindings

NB_MODULE(_core, m) {
  m.doc() = "dsv41rt C++ core: the engine and executors, checkpoints, dtype codecs, CPU ops, comm.";
  // dsv41rt._core.Error derives from dsv41rt.errors.Dsv41rtError (so Python callers catch one
  // base for everything the library refuses) and from ValueError (every library error is about
  // bad input: a malformed file, an unknown dtype, a bad option). The message is Error::what(),
  // naming the offending option, file or tensor.
  nb::object base = nb::module_::import_("dsv41rt.errors").attr("Dsv41rtError");
  PyObject* error = PyErr_NewException(
      "dsv41rt._core.Error", nb::make_tuple(base, nb::handle(PyExc_ValueError)).ptr(), nullptr);
  m.attr("Error") = nb::steal(error);
  nb::register_exception_translator(
      [](const std::exception_ptr& p, void* payload) {
        try {
          std::rethrow_exception(p);
        } catch (const dsv41rt::Error& e) {
          PyErr_SetString(static_cast<PyObject*>(payload), e.what());
        }
      },
      error);
  dsv41rt::bindings::register_dtype(m);
  dsv41rt::bindings::register_checkpoint(m);
  dsv41rt::bindings::register_ops(m);
  dsv41rt::bindings::register_model_config(m);
  dsv41rt::bindings::register_runtime(m);
  dsv41rt::bindings::register_comm(m);
  m.def("cuda_device_count", &dsv41rt::cuda_device_count,
        "Number of usable CUDA devices (0 for CPU-only builds or without a driver).");
}
