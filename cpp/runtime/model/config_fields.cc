#include "runtime/model/config_fields.h"

#include <charconv>
#include <cmath>
#include <utility>

#include "runtime/model/model_config.h"

namespace dsv41rt::config {
namespace {

constexpr int64_t kIntMax = std::numeric_limits<int>::max();

std::string number_text(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), d);
  std::string s(buf, ec == std::errc() ? end : buf);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (char ch : s) {
    if (ch == '"' || ch == '\\') out += '\\';
    out += ch;
  }
  return out + "\"";
}

}  // namespace

std::string json_text(const Json& v) {
  switch (v.type()) {
    case Json::Type::kNull:
      return "null";
    case Json::Type::kBool:
      return v.as_bool() ? "true" : "false";
    case Json::Type::kInt:
      return std::to_string(v.as_int());
    case Json::Type::kDouble:
      return number_text(v.as_double());
    case Json::Type::kString:
      return quoted(v.as_string());
    case Json::Type::kArray: {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + json_text(v.at(i));
      return out + "]";
    }
    case Json::Type::kObject: {
      std::string out = "{";
      for (const auto& [k, x] : v.as_object()) {
        out += (out.size() > 1 ? ", " : "") + quoted(k) + ": " + json_text(x);
      }
      return out + "}";
    }
  }
  return "?";
}

Fields::Fields(const Json& data, std::string prefix, const std::string& source)
    : data_(&data), prefix_(std::move(prefix)), source_(&source) {
  if (!data.is_object()) {
    DSV41RT_CONFIG_ERROR(source, prefix_.empty() ? "config" : prefix_,
                         " must be a JSON object, got ", data.type_name());
  }
}

std::string Fields::name(std::string_view key) const {
  return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key);
}

void Fields::fail(std::string_view key, const std::string& what, const Json& v) const {
  DSV41RT_CONFIG_ERROR(source(), name(key), " must be ", what, ", got ", json_text(v));
}

const Json* Fields::raw(std::string_view key, bool required) const {
  const Json* v = data_->find(key);
  if (v == nullptr && required) {
    DSV41RT_CONFIG_ERROR(source(), "required field ", name(key), " is missing");
  }
  return v;
}

int64_t Fields::int64(std::string_view key, std::optional<int64_t> def,
                      std::optional<int64_t> minimum, int64_t maximum) const {
  const Json* v = raw(key, !def.has_value());
  if (v == nullptr) return *def;
  if (!v->is_int()) fail(key, "an integer", *v);
  const int64_t x = v->as_int();
  if (minimum && x < *minimum) fail(key, "an integer >= " + std::to_string(*minimum), *v);
  if (x > maximum) fail(key, "an integer <= " + std::to_string(maximum), *v);
  return x;
}

int Fields::int32(std::string_view key, std::optional<int64_t> def,
                  std::optional<int64_t> minimum) const {
  const int64_t x = int64(key, def, minimum, kIntMax);
  if (x < -kIntMax) fail(key, "a 32-bit integer", *raw(key, true));
  return static_cast<int>(x);
}

double Fields::number(std::string_view key, std::optional<double> def, bool positive) const {
  const Json* v = raw(key, !def.has_value());
  if (v == nullptr) return *def;
  if (!v->is_number() || !std::isfinite(v->as_double())) fail(key, "a finite number", *v);
  const double x = v->as_double();
  if (positive && x <= 0) fail(key, "a positive number", *v);
  return x;
}

bool Fields::boolean(std::string_view key, std::optional<bool> def) const {
  const Json* v = raw(key, !def.has_value());
  if (v == nullptr) return *def;
  if (!v->is_bool()) fail(key, "true or false", *v);
  return v->as_bool();
}

std::string Fields::str(std::string_view key, std::optional<std::string> def) const {
  const Json* v = raw(key, !def.has_value());
  if (v == nullptr) return *def;
  if (!v->is_string()) fail(key, "a string", *v);
  return v->as_string();
}

std::vector<int64_t> Fields::ints64(std::string_view key, bool required) const {
  const Json* v = raw(key, required);
  if (v == nullptr) return {};
  bool ok = v->is_array();
  if (ok) {
    for (const Json& x : v->as_array()) ok = ok && x.is_int();
  }
  if (!ok) fail(key, "a list of integers", *v);
  std::vector<int64_t> out;
  for (const Json& x : v->as_array()) out.push_back(x.as_int());
  return out;
}

std::vector<int> Fields::ints(std::string_view key, bool required) const {
  std::vector<int> out;
  for (int64_t x : ints64(key, required)) {
    if (x < -kIntMax || x > kIntMax) fail(key, "a list of 32-bit integers", *raw(key, true));
    out.push_back(static_cast<int>(x));
  }
  return out;
}

std::optional<Fields> Fields::sub(std::string_view key, bool required) const {
  const Json* v = raw(key, required);
  if (v == nullptr || v->is_null()) return std::nullopt;
  return Fields(*v, name(key), source());
}

}  // namespace dsv41rt::config
