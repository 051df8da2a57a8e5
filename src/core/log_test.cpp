// core/log_test.cpp: the log's levels, its text and JSON lines, and its option errors.
#include "core/log.h"

#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace k3::log {
namespace {

std::string logged(Level level, Format format, Level at, const std::string& message) {
  configure(level, format);
  testing::internal::CaptureStderr();
  write(at, message);
  std::string out = testing::internal::GetCapturedStderr();
  configure(Level::info, Format::text);
  return out;
}

TEST(Log, TextLineHasUtcTimeLevelAndMessage) {
  const std::string line = logged(Level::info, Format::text, Level::warn, "disk almost full");
  // 2026-12-02T00:10:00.123Z warning disk almost full
  ASSERT_GE(line.size(), 25u) << line;
  EXPECT_EQ(line[4], '-');
  EXPECT_EQ(line[10], 'T');
  EXPECT_EQ(line[23], 'Z');
  EXPECT_NE(line.find(" warning "), std::string::npos) << line;
  EXPECT_EQ(line.substr(line.size() - 17), "disk almost full\n");
}

TEST(Log, LinesBelowTheLevelAreDropped) {
  EXPECT_EQ(logged(Level::warn, Format::text, Level::info, "hidden"), "");
  EXPECT_EQ(logged(Level::off, Format::text, Level::error, "hidden"), "");
  EXPECT_NE(logged(Level::debug, Format::text, Level::debug, "shown"), "");
  configure(Level::warn, Format::text);
  EXPECT_FALSE(enabled(Level::info));
  EXPECT_TRUE(enabled(Level::error));
  EXPECT_FALSE(enabled(Level::off));
  configure(Level::info, Format::text);
}

TEST(Log, JsonLineIsOneObjectWithTheMessageEscaped) {
  const std::string message = "a \"quoted\" path C:\\tmp\nsecond line\x01 and UTF-8 \xc3\xa9";
  const std::string line = logged(Level::info, Format::json, Level::error, message);
  ASSERT_FALSE(line.empty());
  EXPECT_EQ(line.back(), '\n');
  EXPECT_EQ(line.find('\n'), line.size() - 1) << "one line per message: " << line;
  const nlohmann::json j = nlohmann::json::parse(line);
  EXPECT_EQ(j.at("msg"), message);
  EXPECT_EQ(j.at("level"), "error");
  EXPECT_EQ(j.at("logger"), "k3serve");
  EXPECT_EQ(j.at("ts").get<std::string>().size(), 24u);
}

TEST(Log, BadNamesAreErrorsListingTheChoices) {
  EXPECT_EQ(parse_level("warning"), Level::warn);
  EXPECT_EQ(parse_level("debug"), Level::debug);
  EXPECT_EQ(parse_format("json"), Format::json);
  try {
    parse_level("verbose");
    FAIL();
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("--log-level must be one of trace, debug, info"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'verbose'"), std::string::npos);
  }
  EXPECT_THROW(parse_format("xml"), core::Error);
}

}  // namespace
}  // namespace k3::log
