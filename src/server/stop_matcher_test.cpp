// server/stop_matcher_test.cpp: stop strings over streamed text: a match spanning any split of
// the text, held-back prefixes released when they turn out not to match, the earliest match
// winning, nothing after a match, and UTF-8 never split by what is held.
#include "server/stop_matcher.h"

#include <gtest/gtest.h>

#include "core/rng.h"

namespace k3::server {
namespace {

// Feeds `text` cut at the given sizes (cycled) and returns what was released.
std::string run(StopMatcher& m, const std::string& text, const std::vector<size_t>& sizes) {
  std::string out;
  for (size_t pos = 0, k = 0; pos < text.size(); ++k) {
    const size_t n = std::min(sizes[k % sizes.size()], text.size() - pos);
    out += m.feed(text.substr(pos, n));
    pos += n;
  }
  return out + m.finish();
}

TEST(StopMatcher, MatchesAcrossEveryChunking) {
  const std::string text = "The quick brown fox jumps over the lazy dog";
  for (const std::vector<size_t>& sizes :
       std::vector<std::vector<size_t>>{{1}, {2}, {3}, {5, 1}, {7, 2, 1}, {17}, {54}, {97}}) {
    StopMatcher m({"fox jumps"});
    EXPECT_EQ(run(m, text, sizes), "The quick brown ");
    EXPECT_TRUE(m.stopped());
    EXPECT_EQ(m.matched(), "fox jumps");
  }
}

TEST(StopMatcher, HeldPrefixIsReleasedWhenItDoesNotMatch) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(m.feed("abc ST"), "abc ");  // "ST" could start STOP
  EXPECT_EQ(m.held_bytes(), 2u);
  EXPECT_EQ(m.feed("O"), "");
  EXPECT_EQ(m.feed("P"), "");
  EXPECT_TRUE(m.stopped());

  StopMatcher n({"STOP"});
  EXPECT_EQ(n.feed("abc ST"), "abc ");
  EXPECT_EQ(n.feed("OX"), "STOX");  // not a match after all
  EXPECT_EQ(n.feed("S"), "");
  EXPECT_EQ(n.finish(), "S");  // end of text: the held tail is released
  EXPECT_FALSE(n.stopped());
}

TEST(StopMatcher, EarliestMatchWinsAndLongestAtTheSameStart) {
  StopMatcher a({"world", "lo w"});
  EXPECT_EQ(run(a, "hello world", {1}), "hel");
  EXPECT_EQ(a.matched(), "lo w");
  StopMatcher b({"ab", "abc"});
  EXPECT_EQ(run(b, "xxabcd", {6}), "xx");
  EXPECT_EQ(b.matched(), "abc");
}

TEST(StopMatcher, NothingAfterAMatch) {
  StopMatcher m({"\n\n"});
  EXPECT_EQ(m.feed("line one\n"), "line one");
  EXPECT_EQ(m.feed("\nline two"), "");
  EXPECT_EQ(m.feed("more"), "");
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, NoStopsPassesEverythingThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.feed("abc"), "abc");
  EXPECT_EQ(m.held_bytes(), 0u);
  EXPECT_EQ(m.finish(), "");
}

TEST(StopMatcher, MultibyteStopAndTextNeverSplitACharacter) {
  const std::string text = "東京は晴れ、大阪は雨🌧です";
  StopMatcher m({"大阪"});
  std::string out;
  // Feed whole characters (as the detokenizer does); every release must be valid UTF-8.
  for (size_t i = 0; i < text.size();) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    const size_t len = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    const std::string piece = m.feed(text.substr(i, len));
    if (!piece.empty()) {
      EXPECT_NE(static_cast<unsigned char>(piece[0]) & 0xC0, 0x80) << "split character";
    }
    out += piece;
    i += len;
  }
  EXPECT_EQ(out, "東京は晴れ、");
}

TEST(StopMatcher, RandomTextsAgreeWithTheOneShotSearch) {
  core::Rng rng(7);
  const std::string alphabet = "ab c";
  for (int trial = 0; trial < 300; ++trial) {
    std::string text, stop;
    const int len = 1 + static_cast<int>(rng.next_u64() % 40);
    for (int i = 0; i < len; ++i) text += alphabet[rng.next_u64() % alphabet.size()];
    const int slen = 1 + static_cast<int>(rng.next_u64() % 4);
    for (int i = 0; i < slen; ++i) stop += alphabet[rng.next_u64() % alphabet.size()];
    const size_t at = text.find(stop);
    const std::string expected = at == std::string::npos ? text : text.substr(0, at);
    std::vector<size_t> sizes = {1 + rng.next_u64() % 5, 1 + rng.next_u64() % 3};
    StopMatcher m({stop});
    EXPECT_EQ(run(m, text, sizes), expected) << "text '" << text << "' stop '" << stop << "'";
    EXPECT_EQ(m.stopped(), at != std::string::npos);
  }
}

}  // namespace
}  // namespace k3::server
