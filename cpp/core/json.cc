#include "core/json.h"

#include <algorithm>
#include <charconv>
#include <system_error>

#include "core/enum_names.h"
#include "core/status.h"

namespace dsv41rt {

// ---- Json value ---------------------------------------------------------------------------

Json Json::make_bool(bool b) {
  Json j;
  j.type_ = Type::kBool;
  j.bool_ = b;
  return j;
}

Json Json::make_int(int64_t i) {
  Json j;
  j.type_ = Type::kInt;
  j.int_ = i;
  return j;
}

Json Json::make_double(double d) {
  Json j;
  j.type_ = Type::kDouble;
  j.double_ = d;
  return j;
}

Json Json::make_string(std::string s) {
  Json j;
  j.type_ = Type::kString;
  j.string_ = std::move(s);
  return j;
}

Json Json::make_array(Array a) {
  Json j;
  j.type_ = Type::kArray;
  j.array_ = std::move(a);
  return j;
}

Json Json::make_object(Object members) {
  std::stable_sort(members.begin(), members.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 1; i < members.size(); ++i) {
    DSV41RT_CHECK(members[i - 1].first != members[i].first, "duplicate JSON object key '",
                  members[i].first, "'");
  }
  Json j;
  j.type_ = Type::kObject;
  j.object_ = std::move(members);
  return j;
}

const char* Json::type_name(Type type) noexcept {
  static constexpr const char* kNames[] = {"null",   "bool",  "int",   "double",
                                           "string", "array", "object"};
  return enum_name(type, kNames, "?");
}

const char* Json::type_name() const noexcept { return type_name(type_); }

bool Json::as_bool() const {
  DSV41RT_CHECK(is_bool(), "expected JSON bool, got ", type_name());
  return bool_;
}

int64_t Json::as_int() const {
  DSV41RT_CHECK(is_int(), "expected JSON integer, got ", type_name());
  return int_;
}

double Json::as_double() const {
  DSV41RT_CHECK(is_number(), "expected JSON number, got ", type_name());
  return is_int() ? static_cast<double>(int_) : double_;
}

const std::string& Json::as_string() const {
  DSV41RT_CHECK(is_string(), "expected JSON string, got ", type_name());
  return string_;
}

const Json::Array& Json::as_array() const {
  DSV41RT_CHECK(is_array(), "expected JSON array, got ", type_name());
  return array_;
}

const Json::Object& Json::as_object() const {
  DSV41RT_CHECK(is_object(), "expected JSON object, got ", type_name());
  return object_;
}

const Json* Json::find(std::string_view key) const {
  const Object& obj = as_object();
  auto it =
      std::lower_bound(obj.begin(), obj.end(), key,
                       [](const auto& member, std::string_view k) { return member.first < k; });
  if (it == obj.end() || it->first != key) return nullptr;
  return &it->second;
}

const Json& Json::at(std::string_view key) const {
  const Json* v = find(key);
  if (v == nullptr) DSV41RT_THROW_CODE(kNotFound, "JSON object has no key '", key, "'");
  return *v;
}

const Json& Json::at(size_t index) const {
  const Array& arr = as_array();
  DSV41RT_CHECK_CODE(kOutOfRange, index < arr.size(), "JSON array index ", index,
                     " out of range (size ", arr.size(), ")");
  return arr[index];
}

size_t Json::size() const {
  if (is_array()) return array_.size();
  if (is_object()) return object_.size();
  DSV41RT_THROW("JSON size() needs an array or object, got ", type_name());
}

// ---- Parser -------------------------------------------------------------------------------

namespace {

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Json parse_document() {
    skip_ws();
    Json value = parse_value(0);
    skip_ws();
    if (pos_ != text_.size()) fail("unexpected trailing characters after the JSON value");
    return value;
  }

 private:
  [[noreturn]] void fail(std::string_view what) const { fail_at(pos_, what); }
  [[noreturn]] void fail_at(size_t pos, std::string_view what) const {
    DSV41RT_THROW("JSON parse error at byte ", pos, ": ", what);
  }

  bool at_end() const { return pos_ >= text_.size(); }
  char peek() const { return text_[pos_]; }

  void skip_ws() {
    while (!at_end()) {
      const char c = peek();
      if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
      ++pos_;
    }
  }

  void expect_literal(std::string_view lit) {
    if (text_.substr(pos_, lit.size()) != lit) fail("invalid literal");
    pos_ += lit.size();
  }

  Json parse_value(int depth) {
    if (at_end()) fail("unexpected end of input, expected a value");
    switch (peek()) {
      case '{':
        return parse_object(depth + 1);
      case '[':
        return parse_array(depth + 1);
      case '"':
        return Json::make_string(parse_string());
      case 't':
        expect_literal("true");
        return Json::make_bool(true);
      case 'f':
        expect_literal("false");
        return Json::make_bool(false);
      case 'n':
        expect_literal("null");
        return Json();
      default:
        if (peek() == '-' || (peek() >= '0' && peek() <= '9')) return parse_number();
        fail(std::string("unexpected character '") + peek() + "'");
    }
  }

  void check_depth(int depth) const {
    if (depth > kJsonMaxDepth) fail("nesting deeper than " + std::to_string(kJsonMaxDepth));
  }

  Json parse_object(int depth) {
    check_depth(depth);
    const size_t start = pos_;
    ++pos_;  // '{'
    Json::Object members;
    skip_ws();
    if (!at_end() && peek() == '}') {
      ++pos_;
      return Json::make_object(std::move(members));
    }
    std::vector<size_t> key_offsets;
    while (true) {
      skip_ws();
      if (at_end() || peek() != '"') fail("expected a string key in object");
      key_offsets.push_back(pos_);
      std::string key = parse_string();
      skip_ws();
      if (at_end() || peek() != ':') fail("expected ':' after object key");
      ++pos_;
      skip_ws();
      Json value = parse_value(depth);
      members.emplace_back(std::move(key), std::move(value));
      skip_ws();
      if (at_end()) fail("unterminated object (started at byte " + std::to_string(start) + ")");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == '}') {
        ++pos_;
        break;
      }
      fail("expected ',' or '}' in object");
    }
    // Detect duplicates here (rather than in make_object) to report the offending key's offset.
    std::vector<size_t> order(members.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return members[a].first < members[b].first; });
    for (size_t i = 1; i < order.size(); ++i) {
      if (members[order[i - 1]].first == members[order[i]].first) {
        fail_at(key_offsets[order[i]], "duplicate object key '" + members[order[i]].first + "'");
      }
    }
    return Json::make_object(std::move(members));
  }

  Json parse_array(int depth) {
    check_depth(depth);
    const size_t start = pos_;
    ++pos_;  // '['
    Json::Array items;
    skip_ws();
    if (!at_end() && peek() == ']') {
      ++pos_;
      return Json::make_array(std::move(items));
    }
    while (true) {
      skip_ws();
      items.push_back(parse_value(depth));
      skip_ws();
      if (at_end()) fail("unterminated array (started at byte " + std::to_string(start) + ")");
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() == ']') {
        ++pos_;
        break;
      }
      fail("expected ',' or ']' in array");
    }
    return Json::make_array(std::move(items));
  }

  uint32_t parse_hex4() {
    if (text_.size() - pos_ < 4) fail("truncated \\u escape");
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = text_[pos_];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<uint32_t>(c - 'A' + 10);
      } else {
        fail("invalid hex digit in \\u escape");
      }
      ++pos_;
    }
    return v;
  }

  static void append_utf8(std::string& out, uint32_t cp) {
    if (cp < 0x80) {
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xC0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xE0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    } else {
      out += static_cast<char>(0xF0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
      out += static_cast<char>(0x80 | (cp & 0x3F));
    }
  }

  std::string parse_string() {
    const size_t start = pos_;
    ++pos_;  // opening quote
    std::string out;
    while (true) {
      if (at_end()) fail_at(start, "unterminated string");
      const char c = peek();
      if (c == '"') {
        ++pos_;
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) fail("raw control character in string");
      if (c != '\\') {
        out += c;
        ++pos_;
        continue;
      }
      const size_t escape_pos = pos_;
      ++pos_;
      if (at_end()) fail_at(start, "unterminated string");
      const char e = peek();
      ++pos_;
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xDC00 && cp <= 0xDFFF) fail_at(escape_pos, "lone low surrogate in \\u escape");
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") {
              fail_at(escape_pos, "high surrogate not followed by a \\u low surrogate");
            }
            pos_ += 2;
            const uint32_t lo = parse_hex4();
            if (lo < 0xDC00 || lo > 0xDFFF) {
              fail_at(escape_pos, "high surrogate not followed by a low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail_at(escape_pos, std::string("invalid escape '\\") + e + "'");
      }
    }
  }

  Json parse_number() {
    const size_t start = pos_;
    bool integral = true;
    if (peek() == '-') ++pos_;
    if (at_end()) fail_at(start, "invalid number");
    if (peek() == '0') {
      ++pos_;
      if (!at_end() && peek() >= '0' && peek() <= '9') fail_at(start, "leading zero in number");
    } else if (peek() >= '1' && peek() <= '9') {
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    } else {
      fail_at(start, "invalid number");
    }
    if (!at_end() && peek() == '.') {
      integral = false;
      ++pos_;
      if (at_end() || peek() < '0' || peek() > '9') fail("expected digit after decimal point");
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    if (!at_end() && (peek() == 'e' || peek() == 'E')) {
      integral = false;
      ++pos_;
      if (!at_end() && (peek() == '+' || peek() == '-')) ++pos_;
      if (at_end() || peek() < '0' || peek() > '9') fail("expected digit in exponent");
      while (!at_end() && peek() >= '0' && peek() <= '9') ++pos_;
    }
    // from_chars is locale-independent (strtod would honour a host app's LC_NUMERIC).
    const char* first = text_.data() + start;
    const char* last = text_.data() + pos_;
    if (integral) {
      int64_t v = 0;
      auto [ptr, ec] = std::from_chars(first, last, v);
      if (ec == std::errc() && ptr == last) return Json::make_int(v);
      // Out of int64 range: fall through to double, as most JSON libraries do.
    }
    double d = 0.0;
    auto [ptr, ec] = std::from_chars(first, last, d);
    if (ec == std::errc::result_out_of_range) fail_at(start, "number out of double range");
    if (ec != std::errc() || ptr != last) fail_at(start, "invalid number");
    return Json::make_double(d);
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace

Json json_parse(std::string_view text) { return Parser(text).parse_document(); }

}  // namespace dsv41rt
