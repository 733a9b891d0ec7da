// Raising the Python control plane's own exception types (dsv41rt.errors) from the bindings of
// the config parser and checkpoint validation, so Python callers see ConfigError /
// CheckpointError with the library's message, exactly as if Python had raised them.
#pragma once

#include <nanobind/nanobind.h>

#include <string>
#include <utility>

#include "runtime/model/model_config.h"

namespace dsv41rt::bindings {

/// Raises dsv41rt.errors.<type>(*args) (pending Python exception + nb::python_error).
[[noreturn]] inline void raise_dsv41rt_error(const char* type, const nanobind::tuple& args) {
  nanobind::object cls = nanobind::module_::import_("dsv41rt.errors").attr(type);
  nanobind::object exc = cls(*args);
  PyErr_SetObject(cls.ptr(), exc.ptr());
  throw nanobind::python_error();
}

/// Runs `f`, turning a ConfigError into Python's ConfigError with the message (which names the
/// config's source and the field; the "file.cc:LINE" of the check adds nothing for a user).
template <typename F>
auto config_errors_as_python(F&& f) -> decltype(f()) {
  try {
    return std::forward<F>(f)();
  } catch (const ConfigError& e) {
    raise_dsv41rt_error("ConfigError", nanobind::make_tuple(e.message()));
  }
}

}  // namespace dsv41rt::bindings
