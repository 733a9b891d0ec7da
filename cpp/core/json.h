// A small strict JSON (RFC 8259) parser for checkpoint headers and configs.
//
// Strict: no comments, no trailing commas, no NaN/Infinity, no leading zeros, no raw control
// characters in strings, no duplicate object keys, nothing but whitespace after the value.
// Strings are decoded to UTF-8 (\uXXXX escapes incl. surrogate pairs; lone surrogates are
// rejected). Numbers written without fraction/exponent that fit in int64 are integers, everything
// else is a double. Nesting is limited to kJsonMaxDepth so hostile input cannot exhaust the stack.
// Parse errors are Error(kInvalidArgument) with "JSON parse error at byte N: ...".
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/export.h"

namespace dsv41rt {

inline constexpr int kJsonMaxDepth = 64;

class DSV41RT_API Json {
 public:
  enum class Type { kNull, kBool, kInt, kDouble, kString, kArray, kObject };
  using Array = std::vector<Json>;
  // Sorted by key (unique keys), so lookups are binary searches.
  using Object = std::vector<std::pair<std::string, Json>>;

  Json() = default;  // null
  static Json make_bool(bool b);
  static Json make_int(int64_t i);
  static Json make_double(double d);
  static Json make_string(std::string s);
  static Json make_array(Array a);
  // Throws Error if two members share a key.
  static Json make_object(Object members);

  Type type() const noexcept { return type_; }
  // "null", "bool", "int", "double", "string", "array", "object".
  const char* type_name() const noexcept;
  static const char* type_name(Type type) noexcept;

  bool is_null() const noexcept { return type_ == Type::kNull; }
  bool is_bool() const noexcept { return type_ == Type::kBool; }
  bool is_int() const noexcept { return type_ == Type::kInt; }
  bool is_number() const noexcept { return type_ == Type::kInt || type_ == Type::kDouble; }
  bool is_string() const noexcept { return type_ == Type::kString; }
  bool is_array() const noexcept { return type_ == Type::kArray; }
  bool is_object() const noexcept { return type_ == Type::kObject; }

  // Accessors throw Error("expected <type>, got <type>") on a type mismatch.
  bool as_bool() const;
  int64_t as_int() const;
  double as_double() const;  // ints convert
  const std::string& as_string() const;
  const Array& as_array() const;
  const Object& as_object() const;

  // Object member lookup: nullptr when absent (throws if this is not an object).
  const Json* find(std::string_view key) const;
  // Throws Error(kNotFound) naming the key when absent.
  const Json& at(std::string_view key) const;
  // Array element; throws Error(kOutOfRange).
  const Json& at(size_t index) const;
  // Elements of an array or members of an object.
  size_t size() const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  int64_t int_ = 0;
  double double_ = 0.0;
  std::string string_;
  Array array_;
  Object object_;
};

// Parses a complete JSON document.
DSV41RT_API Json json_parse(std::string_view text);

}  // namespace dsv41rt
