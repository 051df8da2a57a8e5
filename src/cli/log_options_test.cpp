// cli/log_options_test.cpp: --log-level / --log-format reach the log, and bad values are errors
// naming the option.
#include "cli/log_options.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/log.h"

namespace k3::cli {
namespace {

Args parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return Args("test", log_option_specs(), argv);
}

TEST(LogOptions, DefaultsAreInfoAndText) {
  configure_log(parse({}));
  EXPECT_TRUE(log::enabled(log::Level::info));
  EXPECT_FALSE(log::enabled(log::Level::debug));
}

TEST(LogOptions, LevelAndFormatAreApplied) {
  configure_log(parse({"--log-level", "error", "--log-format", "json"}));
  EXPECT_FALSE(log::enabled(log::Level::warn));
  testing::internal::CaptureStderr();
  log::error("boom");
  const std::string line = testing::internal::GetCapturedStderr();
  EXPECT_EQ(line.rfind("{\"ts\":", 0), 0u) << line;
  EXPECT_NE(line.find("\"msg\":\"boom\""), std::string::npos) << line;
  configure_log(parse({}));
}

TEST(LogOptions, BadValuesNameTheOption) {
  for (const auto& words : std::vector<std::vector<std::string>>{{"--log-level", "loud"}, {"--log-format", "xml"}}) {
    try {
      configure_log(parse(words));
      FAIL() << words[0];
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find(words[0]), std::string::npos) << e.what();
    }
  }
  configure_log(parse({}));
}

}  // namespace
}  // namespace k3::cli
