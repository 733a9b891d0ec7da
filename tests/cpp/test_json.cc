#include <gtest/gtest.h>

#include <string>

#include "core/json.h"
#include "core/status.h"

namespace dsv41rt {
namespace {

// Returns the error text of parsing `text`, or "" if it parsed.
std::string parse_error(const std::string& text) {
  try {
    json_parse(text);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Json, ParsesAllTypes) {
  const Json j = json_parse(
      R"( {"a": 1, "b": -2.5e1, "c": "x\ty", "d": [true, false, null], "e": {}, "f": [],
           "big": 9223372036854775807, "bigger": 9223372036854775808, "neg0": -0} )");
  EXPECT_TRUE(j.is_object());
  EXPECT_EQ(j.size(), 9u);
  EXPECT_EQ(j.at("a").as_int(), 1);
  EXPECT_EQ(j.at("b").as_double(), -25.0);
  EXPECT_FALSE(j.at("b").is_int());
  EXPECT_EQ(j.at("c").as_string(), "x\ty");
  EXPECT_TRUE(j.at("d").at(0).as_bool());
  EXPECT_FALSE(j.at("d").at(1).as_bool());
  EXPECT_TRUE(j.at("d").at(2).is_null());
  EXPECT_EQ(j.at("e").size(), 0u);
  EXPECT_EQ(j.at("big").as_int(), INT64_MAX);
  EXPECT_TRUE(j.at("bigger").is_number());
  EXPECT_FALSE(j.at("bigger").is_int());
  EXPECT_EQ(j.at("a").as_double(), 1.0);
  EXPECT_EQ(j.find("zzz"), nullptr);
  EXPECT_TRUE(json_parse("3").is_int());
  EXPECT_EQ(json_parse("\"\"").as_string(), "");
}

TEST(Json, UnicodeEscapes) {
  EXPECT_EQ(json_parse(R"("\u0041\u00e9\u20AC")").as_string(), "A\xC3\xA9\xE2\x82\xAC");
  EXPECT_EQ(json_parse(R"("\ud83d\ude00")").as_string(), "\xF0\x9F\x98\x80");  // U+1F600
  EXPECT_EQ(json_parse(R"("\"\\\/\b\f\n\r")").as_string(), "\"\\/\b\f\n\r");
  EXPECT_EQ(json_parse("\"caf\xC3\xA9\"").as_string(), "caf\xC3\xA9");  // raw UTF-8 passes
}

TEST(Json, AccessorErrorsAreClear) {
  const Json j = json_parse(R"({"a": "s"})");
  try {
    j.at("a").as_int();
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expected JSON integer, got string"), std::string::npos);
  }
  try {
    j.at("missing");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
    EXPECT_NE(std::string(e.what()).find("'missing'"), std::string::npos);
  }
  EXPECT_THROW(j.at(size_t{0}), Error);
}

TEST(Json, MalformedInputsReportOffsets) {
  struct Case {
    const char* text;
    const char* expect;  // substring of the message, including the byte offset
  };
  const Case cases[] = {
      {"", "at byte 0: unexpected end of input"},
      {"{\"a\":1,}", "at byte 7: expected a string key"},
      {"[1,2,]", "at byte 5: unexpected character ']'"},
      {"[1 2]", "at byte 3: expected ',' or ']'"},
      {"{\"a\" 1}", "at byte 5: expected ':'"},
      {"01", "at byte 0: leading zero"},
      {"1.", "at byte 2: expected digit after decimal point"},
      {"1e+", "at byte 3: expected digit in exponent"},
      {"-", "at byte 0: invalid number"},
      {"NaN", "at byte 0: unexpected character 'N'"},
      {"tru", "at byte 0: invalid literal"},
      {"\"abc", "at byte 0: unterminated string"},
      {"\"a\x01\"", "at byte 2: raw control character"},
      {"\"\\x\"", "at byte 1: invalid escape"},
      {"\"\\u12G4\"", "at byte 5: invalid hex digit"},
      {"\"\\ud83d\"", "at byte 1: high surrogate not followed"},
      {"\"\\ude00\"", "at byte 1: lone low surrogate"},
      {"{\"a\":1,\"a\":2}", "at byte 7: duplicate object key 'a'"},
      {"{} x", "at byte 3: unexpected trailing characters"},
      {"[1", "at byte 2: unterminated array"},
      {"1e999", "at byte 0: number out of double range"},
  };
  for (const Case& c : cases) {
    const std::string err = parse_error(c.text);
    EXPECT_NE(err.find("JSON parse error"), std::string::npos) << "input: " << c.text;
    EXPECT_NE(err.find(c.expect), std::string::npos)
        << "input: " << c.text << "\n  got: " << err << "\n  want: " << c.expect;
  }
}

TEST(Json, DepthLimit) {
  const std::string ok = std::string(kJsonMaxDepth, '[') + std::string(kJsonMaxDepth, ']');
  EXPECT_NO_THROW(json_parse(ok));
  const std::string deep =
      std::string(kJsonMaxDepth + 1, '[') + std::string(kJsonMaxDepth + 1, ']');
  EXPECT_NE(parse_error(deep).find("nesting deeper than 64"), std::string::npos);
  // Hostile input far beyond the limit fails fast instead of overflowing the stack.
  EXPECT_NE(parse_error(std::string(1000000, '[')).find("nesting deeper"), std::string::npos);
  EXPECT_NE(parse_error(std::string(1000000, '{')).find("JSON parse error"), std::string::npos);
}

}  // namespace
}  // namespace dsv41rt
