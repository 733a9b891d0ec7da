#include <gtest/gtest.h>

#include <string>

#include "core/logging.h"
#include "core/status.h"

namespace dsv41rt {
namespace {

int checked_positive(int x) {
  DSV41RT_CHECK(x > 0, "bad x: ", x);
  return x;
}

TEST(Error, CheckMessageHasFileLineAndArgs) {
  try {
    checked_positive(-3);
    FAIL() << "no throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("test_status.cc:", 0), 0u) << what;  // basename, not full path
    EXPECT_NE(what.find("bad x: -3"), std::string::npos) << what;
    EXPECT_EQ(e.kind(), StatusCode::kInvalidArgument);
    EXPECT_EQ(e.file(), "test_status.cc");
    EXPECT_GT(e.line(), 0);
    EXPECT_EQ(e.message(), "bad x: -3");
  }
  EXPECT_EQ(checked_positive(2), 2);
}

TEST(Error, ThrowCodeAndCheckWithoutMessage) {
  try {
    DSV41RT_THROW_CODE(kNotFound, "no tensor ", std::string("w"), " in ", 3, " files");
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), StatusCode::kNotFound);
    EXPECT_EQ(e.message(), "no tensor w in 3 files");
  }
  try {
    const int y = 0;
    DSV41RT_CHECK(y == 1);
    FAIL();
  } catch (const std::runtime_error& e) {  // Error is a runtime_error
    EXPECT_NE(std::string(e.what()).find("check failed: y == 1"), std::string::npos);
  }
}

TEST(Status, FromCurrentException) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.to_string(), "ok");
  try {
    DSV41RT_THROW_CODE(kIoError, "disk on fire");
  } catch (...) {
    s = Status::FromCurrentException();
  }
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kIoError);
  EXPECT_NE(s.to_string().find("io_error: "), std::string::npos);
  EXPECT_NE(s.message().find("disk on fire"), std::string::npos);
  try {
    throw std::logic_error("plain");
  } catch (...) {
    s = Status::FromCurrentException();
  }
  EXPECT_EQ(s.code(), StatusCode::kInternal);
  EXPECT_EQ(s.message(), "plain");
}

TEST(Logging, LevelsAndParsing) {
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::kDebug);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::kWarning);
  EXPECT_EQ(parse_log_level("Error"), LogLevel::kError);
  EXPECT_FALSE(parse_log_level("loud").has_value());
  set_log_level(LogLevel::kWarning);
  int evaluated = 0;
  auto side_effect = [&] { return ++evaluated; };
  DSV41RT_LOG(INFO) << "hidden " << side_effect();
  EXPECT_EQ(evaluated, 0);  // disabled levels do not evaluate their operands
  testing::internal::CaptureStderr();
  DSV41RT_LOG(ERROR) << "shown " << side_effect();
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(evaluated, 1);
  EXPECT_NE(err.find("[dsv41rt E test_status.cc:"), std::string::npos) << err;
  EXPECT_NE(err.find("shown 1\n"), std::string::npos) << err;
  set_log_level(LogLevel::kInfo);
}

}  // namespace
}  // namespace dsv41rt
