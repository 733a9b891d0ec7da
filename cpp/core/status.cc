#include "core/status.h"

#include <cstring>
#include <exception>
#include <new>

#include "core/enum_names.h"

namespace dsv41rt {
namespace {

const char* basename_of(const char* path) {
  if (path == nullptr) return "";
  const char* slash = std::strrchr(path, '/');
  return slash ? slash + 1 : path;
}

std::string format_what(const char* file, int line, const std::string& message) {
  return std::string(basename_of(file)) + ":" + std::to_string(line) + ": " + message;
}

}  // namespace

const char* status_code_name(StatusCode code) noexcept {
  static constexpr const char* kNames[] = {
      "ok",       "invalid_argument", "not_found",    "io_error",
      "out_of_range", "internal",     "unsupported", "engine_failed"};
  return enum_name(code, kNames, "unknown");
}

Error::Error(StatusCode kind, const char* file, int line, const std::string& message)
    : std::runtime_error(format_what(file, line, message)),
      kind_(kind),
      file_(basename_of(file)),
      line_(line),
      message_(message) {}

Status Status::FromCurrentException() noexcept {
  try {
    try {
      throw;
    } catch (const Error& e) {
      return Status(e.kind(), e.what());
    } catch (const std::bad_alloc& e) {
      return Status(StatusCode::kInternal, std::string("out of memory: ") + e.what());
    } catch (const std::exception& e) {
      return Status(StatusCode::kInternal, e.what());
    } catch (...) {
      return Status(StatusCode::kInternal, "unknown exception");
    }
  } catch (...) {
    // Building the message itself failed (e.g. out of memory) or no exception was active.
    return Status(StatusCode::kInternal, std::string());
  }
}

std::string Status::to_string() const {
  if (ok()) return "ok";
  return std::string(status_code_name(code_)) + ": " + message_;
}

namespace detail {

void throw_error(StatusCode kind, const char* file, int line, const std::string& message) {
  throw Error(kind, file, line, message);
}

}  // namespace detail
}  // namespace dsv41rt
