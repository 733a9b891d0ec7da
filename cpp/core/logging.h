// Tiny leveled logger writing one line per message to stderr.
//
//   DSV41RT_LOG(INFO) << "loaded " << n << " tensors";
//
// The threshold comes from the environment variable DSV41RT_LOG_LEVEL (debug, info, warning,
// error; default info), read once on first use; set_log_level() overrides it. Messages below the
// threshold cost one comparison: the stream expression is not evaluated. Each line is formatted
// first and written with a single locked write so concurrent threads never interleave.
#pragma once

#include <optional>
#include <sstream>
#include <string_view>

#include "core/export.h"

namespace dsv41rt {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

DSV41RT_API LogLevel log_level() noexcept;
DSV41RT_API void set_log_level(LogLevel level) noexcept;
inline bool log_enabled(LogLevel level) noexcept {
  return static_cast<int>(level) >= static_cast<int>(log_level());
}
// "debug" / "info" / "warning" (or "warn") / "error", case-insensitive; nullopt otherwise.
DSV41RT_API std::optional<LogLevel> parse_log_level(std::string_view text) noexcept;
// Writes "[dsv41rt W file.cc:12] message\n" to stderr. Never throws.
DSV41RT_API void log_message(LogLevel level, const char* file, int line,
                             std::string_view message) noexcept;

namespace detail {

// Collects one message and emits it from the destructor (which never throws).
class DSV41RT_API LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line) : level_(level), file_(file), line_(line) {}
  ~LogLine();
  LogLine(const LogLine&) = delete;
  LogLine& operator=(const LogLine&) = delete;
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  const char* file_;
  int line_;
  std::ostringstream stream_;
};

inline constexpr LogLevel kLogDEBUG = LogLevel::kDebug;
inline constexpr LogLevel kLogINFO = LogLevel::kInfo;
inline constexpr LogLevel kLogWARNING = LogLevel::kWarning;
inline constexpr LogLevel kLogERROR = LogLevel::kError;

}  // namespace detail
}  // namespace dsv41rt

// severity is one of DEBUG, INFO, WARNING, ERROR. The if/else form keeps the macro safe inside
// unbraced if statements and skips evaluating the streamed operands when disabled.
#define DSV41RT_LOG(severity)                                       \
  if (!::dsv41rt::log_enabled(::dsv41rt::detail::kLog##severity)) { \
  } else                                                            \
    ::dsv41rt::detail::LogLine(::dsv41rt::detail::kLog##severity, __FILE__, __LINE__).stream()
