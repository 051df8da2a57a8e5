// tokenizer/pretokenizer_test.cpp: the tiktoken -> PCRE2 pattern translation and the split
// itself (the Kimi pattern on mixed-script text, very long runs, unmatched input, bad patterns).
#include "tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/split_patterns.h"

namespace k3::tokenizer {
namespace {

using Pieces = std::vector<std::string>;

TEST(PatternTranslation, RewritesOnlyWhatDiffers) {
  const std::string ws =
      R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";
  EXPECT_EQ(translate_pattern_for_pcre2(R"(\s+(?!\S))"), "[" + ws + "]+(?![^" + ws + "])");
  EXPECT_EQ(translate_pattern_for_pcre2(R"([^\s\p{L}\p{N}])"), "[^" + ws + R"(\p{L}\p{N}])");
  EXPECT_EQ(translate_pattern_for_pcre2(R"([\p{Han}]+)"), R"([\p{sc:Han}]+)");
  EXPECT_EQ(translate_pattern_for_pcre2(R"([\p{Lu}\p{M}&&[^\p{Han}]]*)"), R"((?:(?![\p{sc:Han}])[\p{Lu}\p{M}])*)");
  EXPECT_EQ(translate_pattern_for_pcre2(R"('(?i:[sdmt]|ll)|\p{N}{1,3}+)"), R"('(?i:[sdmt]|ll)|\p{N}{1,3}+)");
}

TEST(PatternTranslation, RefusesWhatItCannotTranslate) {
  EXPECT_THROW(translate_pattern_for_pcre2(R"([^\S])"), core::Error);
  EXPECT_THROW(translate_pattern_for_pcre2(R"([a&&b])"), core::Error);
  EXPECT_THROW(translate_pattern_for_pcre2(R"([abc)"), core::Error);
  EXPECT_THROW(Pretokenizer("(unclosed"), core::Error);
  try {
    Pretokenizer bad("a{2,1}");
    FAIL() << "compiled";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not compile"), std::string::npos) << e.what();
  }
}

TEST(KimiSplit, HanRunsAreTheirOwnPieces) {
  const Pretokenizer kimi(patterns::kKimi);
  EXPECT_EQ(kimi.split("中文English混合"), (Pieces{"中文", "English", "混合"}));
  EXPECT_EQ(kimi.split("汉字abc"), (Pieces{"汉字", "abc"}));
  EXPECT_EQ(kimi.split("北京市 Pascal"), (Pieces{"北京市", " Pascal"}));
  // 、 is Script=Common (Script_Extensions includes Han): Rust's \p{Han} does not take it.
  EXPECT_EQ(kimi.split("你好、世界"), (Pieces{"你好", "、", "世界"}));
}

TEST(KimiSplit, WordsNumbersSpacesAndNewlines) {
  const Pretokenizer kimi(patterns::kKimi);
  EXPECT_EQ(kimi.split("I'm 12345 ok\n\n  x"), (Pieces{"I'm", " ", "123", "45", " ok", "\n\n", " ", " x"}));
  EXPECT_EQ(kimi.split("HELLO's world!!\r\n"), (Pieces{"HELLO's", " world", "!!\r\n"}));
  EXPECT_EQ(kimi.split("camelCase JSONData"), (Pieces{"camel", "Case", " JSONData"}));
  EXPECT_EQ(kimi.split(""), Pieces{});
}

TEST(KimiSplit, LongRunsDoNotExhaustTheMatcher) {
  const Pretokenizer kimi(patterns::kKimi);
  const std::string word(100'000, 'a'), spaces(100'000, ' ');
  EXPECT_EQ(kimi.split(word), Pieces{word});
  EXPECT_EQ(kimi.split(spaces), Pieces{spaces});
  const std::string han = [] {
    std::string s;
    for (int i = 0; i < 30'000; ++i) s += "中";
    return s;
  }();
  EXPECT_EQ(kimi.split(han), Pieces{han});
}

TEST(Pretokenizer, SkipsWhatNoAlternativeMatches) {
  const Pretokenizer digits(R"(\p{N}+)");
  EXPECT_EQ(digits.split("ab12cd345"), (Pieces{"12", "345"}));
  size_t b = 0, e = 0;
  EXPECT_FALSE(digits.find("abc", 0, b, e));
}

}  // namespace
}  // namespace k3::tokenizer
