// Error reporting for the runtime.
//
// Inside the library, failures are C++ exceptions of type dsv41rt::Error (never abort()/exit()).
// The message always starts with "file.cc:LINE: " so a report from a user pinpoints the check.
// Status is the value type used where exceptions must not cross (the future C ABI boundary).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/export.h"

namespace dsv41rt {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,
  kNotFound,
  kIoError,
  kOutOfRange,
  kInternal,
  kUnsupported,
  kEngineFailed,  ///< the engine stopped after an error; the runtime takes no more work
};

// "ok", "invalid_argument", "not_found", ...
DSV41RT_API const char* status_code_name(StatusCode code) noexcept;

class DSV41RT_API Error : public std::runtime_error {
 public:
  // `file` may be a full path (__FILE__); only its basename is kept in the message.
  Error(StatusCode kind, const char* file, int line, const std::string& message);

  StatusCode kind() const noexcept { return kind_; }
  // The message without the "file:line: " prefix.
  const std::string& message() const noexcept { return message_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }

 private:
  StatusCode kind_;
  std::string file_;
  int line_;
  std::string message_;
};

class DSV41RT_API Status {
 public:
  Status() = default;  // OK
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  // Converts the exception currently being handled (call only inside a catch block) into a
  // Status, so C entry points can be written as `try { ... } catch (...) { return
  // status_from_current_exception(); }`.
  static Status FromCurrentException() noexcept;

  bool ok() const noexcept { return code_ == StatusCode::kOk; }
  StatusCode code() const noexcept { return code_; }
  const std::string& message() const noexcept { return message_; }
  // "ok" or "<code name>: <message>".
  std::string to_string() const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] DSV41RT_API void throw_error(StatusCode kind, const char* file, int line,
                                          const std::string& message);

// The message of a failed check: the caller's message if there is one, else the condition text.
inline std::string check_message(const char* condition) { return condition; }
template <typename First, typename... Rest>
std::string check_message(const char*, First&& first, Rest&&... rest) {
  return str_cat(std::forward<First>(first), std::forward<Rest>(rest)...);
}

}  // namespace detail
}  // namespace dsv41rt

// DSV41RT_THROW("bad x: ", x) throws Error(kInvalidArgument) with "file.cc:LINE: bad x: 3".
// Most failures the library reports are about its inputs, hence kInvalidArgument by default.
#define DSV41RT_THROW(...)                                                                    \
  ::dsv41rt::detail::throw_error(::dsv41rt::StatusCode::kInvalidArgument, __FILE__, __LINE__, \
                                 ::dsv41rt::detail::str_cat(__VA_ARGS__))

// DSV41RT_THROW_CODE(kNotFound, "no tensor ", name)
#define DSV41RT_THROW_CODE(code, ...)                                             \
  ::dsv41rt::detail::throw_error(::dsv41rt::StatusCode::code, __FILE__, __LINE__, \
                                 ::dsv41rt::detail::str_cat(__VA_ARGS__))

// DSV41RT_CHECK(x > 0, "bad x: ", x): throws Error(kInvalidArgument) when cond is false. The
// message args are only evaluated on failure. The message is what users read, so the condition
// text appears only when there is no message.
#define DSV41RT_CHECK(cond, ...)                                                                \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::dsv41rt::detail::throw_error(                                                           \
          ::dsv41rt::StatusCode::kInvalidArgument, __FILE__, __LINE__,                          \
          ::dsv41rt::detail::check_message("check failed: " #cond __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                           \
  } while (0)

#define DSV41RT_CHECK_CODE(code, cond, ...)                                                     \
  do {                                                                                          \
    if (!(cond)) [[unlikely]] {                                                                 \
      ::dsv41rt::detail::throw_error(                                                           \
          ::dsv41rt::StatusCode::code, __FILE__, __LINE__,                                      \
          ::dsv41rt::detail::check_message("check failed: " #cond __VA_OPT__(, ) __VA_ARGS__)); \
    }                                                                                           \
  } while (0)
