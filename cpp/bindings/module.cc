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
void register_draft(nb::module_& m);
void register_grammar(nb::module_& m);
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
          // The instance carries `code` (status_code_name: "out_of_range", "invalid_argument",
          // ...), e.g. for a server to answer 503 to a full pool and 400 to bad input.
          PyObject* type = static_cast<PyObject*>(payload);
          PyObject* value = PyObject_CallFunction(type, "s", e.what());
          if (value == nullptr) return;  // the call's own error stands
          PyObject* code = PyUnicode_FromString(dsv41rt::status_code_name(e.kind()));
          if (code != nullptr) PyObject_SetAttrString(value, "code", code);
          Py_XDECREF(code);
          PyErr_SetObject(type, value);
          Py_DECREF(value);
        }
      },
      error);
  dsv41rt::bindings::register_dtype(m);
  dsv41rt::bindings::register_checkpoint(m);
  dsv41rt::bindings::register_ops(m);
  dsv41rt::bindings::register_model_config(m);
  dsv41rt::bindings::register_runtime(m);
  dsv41rt::bindings::register_comm(m);
  dsv41rt::bindings::register_draft(m);
  dsv41rt::bindings::register_grammar(m);
  m.def("cuda_device_count", &dsv41rt::cuda_device_count,
        "Number of usable CUDA devices (0 for CPU-only builds or without a driver).");
}
