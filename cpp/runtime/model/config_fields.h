// Typed reads of one config.json object that name `prefix.key` in every error (the parser's
// vocabulary: required vs defaulted fields, integer bounds, finite numbers, lists of ints).
// Internal to the config parser (model_config.cc).
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/json.h"

namespace dsv41rt::config {

// A JSON value as it would be written in config.json, for "got ..." in messages. Doubles keep
// a fraction (2.0, not 2), so "must be an integer, got 2.0" is not self-contradictory; values
// that JSON cannot spell (they only come from a Python dict) read NaN / Infinity.
std::string json_text(const Json& value);

class Fields {
 public:
  // Throws ConfigError "<source>: <prefix or 'config'> must be a JSON object, got <type>".
  Fields(const Json& data, std::string prefix, const std::string& source);

  const std::string& prefix() const { return prefix_; }
  const std::string& source() const { return *source_; }
  bool has(std::string_view key) const { return data_->find(key) != nullptr; }
  const Json* get(std::string_view key) const { return data_->find(key); }
  // "prefix.key", or "key" at top level.
  std::string name(std::string_view key) const;

  // "<source>: <name> must be <what>, got <value>".
  [[noreturn]] void fail(std::string_view key, const std::string& what, const Json& value) const;

  // The value; nullptr when absent and optional; throws when absent and required.
  const Json* raw(std::string_view key, bool required) const;

  // Absent -> `def`, or an error when there is no default.
  int64_t int64(std::string_view key, std::optional<int64_t> def = std::nullopt,
                std::optional<int64_t> minimum = std::nullopt,
                int64_t maximum = std::numeric_limits<int64_t>::max()) const;
  int int32(std::string_view key, std::optional<int64_t> def = std::nullopt,
            std::optional<int64_t> minimum = std::nullopt) const;
  double number(std::string_view key, std::optional<double> def = std::nullopt,
                bool positive = false) const;
  bool boolean(std::string_view key, std::optional<bool> def = std::nullopt) const;
  std::string str(std::string_view key, std::optional<std::string> def = std::nullopt) const;
  // A list of integers; absent and not required -> empty.
  std::vector<int64_t> ints64(std::string_view key, bool required = true) const;
  std::vector<int> ints(std::string_view key, bool required = true) const;
  // A nested object; nullopt when absent (and not required) or null.
  std::optional<Fields> sub(std::string_view key, bool required) const;

 private:
  const Json* data_;
  std::string prefix_;
  const std::string* source_;
};

}  // namespace dsv41rt::config
