#include "core/logging.h"

#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include "core/enum_names.h"

namespace dsv41rt {
namespace {

constexpr int kUnset = -1;
std::atomic<int> g_level{kUnset};

std::mutex& write_mutex() {
  static std::mutex mu;
  return mu;
}

LogLevel level_from_env() noexcept {
  const char* env = std::getenv("DSV41RT_LOG_LEVEL");
  if (env == nullptr || *env == '\0') return LogLevel::kInfo;
  if (auto parsed = parse_log_level(env)) return *parsed;
  std::fprintf(stderr, "[dsv41rt W] ignoring DSV41RT_LOG_LEVEL=%s (use debug|info|warning|error)\n",
               env);
  return LogLevel::kInfo;
}

char level_letter(LogLevel level) {
  static constexpr const char* kLetters[] = {"D", "I", "W", "E"};
  return enum_name(level, kLetters, "?")[0];
}

}  // namespace

LogLevel log_level() noexcept {
  int level = g_level.load(std::memory_order_relaxed);
  if (level == kUnset) {
    // Racing first calls may both read the environment; they agree, so either store wins.
    int expected = kUnset;
    g_level.compare_exchange_strong(expected, static_cast<int>(level_from_env()));
    level = g_level.load(std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(level);
}

void set_log_level(LogLevel level) noexcept {
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
}

std::optional<LogLevel> parse_log_level(std::string_view text) noexcept {
  std::string lower;
  try {
    for (char c : text)
      lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  } catch (...) {
    return std::nullopt;
  }
  if (lower == "debug") return LogLevel::kDebug;
  if (lower == "info") return LogLevel::kInfo;
  if (lower == "warning" || lower == "warn") return LogLevel::kWarning;
  if (lower == "error") return LogLevel::kError;
  return std::nullopt;
}

void log_message(LogLevel level, const char* file, int line, std::string_view message) noexcept {
  const char* base = file ? std::strrchr(file, '/') : nullptr;
  base = base ? base + 1 : (file ? file : "?");
  try {
    std::string out = "[dsv41rt ";
    out += level_letter(level);
    out += ' ';
    out += base;
    out += ':';
    out += std::to_string(line);
    out += "] ";
    out.append(message.data(), message.size());
    out += '\n';
    std::lock_guard<std::mutex> lock(write_mutex());
    std::fwrite(out.data(), 1, out.size(), stderr);
    std::fflush(stderr);
  } catch (...) {
    // Logging must never take the process down; drop the line.
  }
}

namespace detail {

LogLine::~LogLine() {
  try {
    log_message(level_, file_, line_, stream_.str());
  } catch (...) {
  }
}

}  // namespace detail
}  // namespace dsv41rt
