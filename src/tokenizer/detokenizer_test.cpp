// tokenizer/detokenizer_test.cpp: the incremental detokenizer never emits broken UTF-8, holds at
// most an incomplete character, and its output joined equals the one-shot decode.
#include "tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {
namespace {

using test::tiny;

TEST(IncrementalDetokenizer, EmojiSplitIntoByteTokensComesOutWhole) {
  IncrementalDetokenizer d(tiny());
  // 🌍 = F0 9F 8C 8D; in the tiny vocabulary byte b has rank b.
  EXPECT_EQ(d.push('a'), "a");
  EXPECT_EQ(d.push(0xF0), "");
  EXPECT_EQ(d.push(0x9F), "");
  EXPECT_EQ(d.push(0x8C), "");
  EXPECT_EQ(d.pending_bytes(), 3u);
  EXPECT_EQ(d.push(0x8D), "🌍");
  EXPECT_EQ(d.finish(), "");
}

TEST(IncrementalDetokenizer, BrokenBytesBecomeReplacementCharacters) {
  IncrementalDetokenizer d(tiny());
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push('x'), "\xEF\xBF\xBDx");  // E4 can never complete once 'x' follows
  EXPECT_EQ(d.push(0xE4), "");
  EXPECT_EQ(d.push(0xB8), "");
  EXPECT_EQ(d.finish(), "\xEF\xBF\xBD");  // incomplete at the end of the stream
}

TEST(IncrementalDetokenizer, RandomStreamsMatchOneShotDecode) {
  core::Rng rng(5);
  const Tokenizer& tok = tiny();
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int32_t> ids;
    const size_t n = 1 + rng.next_u64() % 97;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t r = rng.next_u64();
      // Mostly single bytes (>= 0x80 half the time, to split characters), some merges and specials.
      ids.push_back(r % 4 == 0    ? static_cast<int32_t>(256 + r % 512)
                    : r % 4 == 1  ? static_cast<int32_t>(0x80 + r % 0x80)
                    : r % 16 == 2 ? tok.special_id_or_throw(k3_tokens::kSep)
                                  : static_cast<int32_t>(r % 256));
    }
    for (bool skip : {false, true}) {
      IncrementalDetokenizer d(tok, skip);
      std::string joined;
      for (int32_t id : ids) {
        const std::string piece = d.push(id);
        ASSERT_TRUE(utf8::is_valid(piece)) << "trial " << trial;
        ASSERT_LE(d.pending_bytes(), 3u);
        joined += piece;
      }
      const std::string tail = d.finish();
      ASSERT_TRUE(utf8::is_valid(tail));
      joined += tail;
      ASSERT_EQ(joined, tok.decode(ids, skip)) << "trial " << trial;
    }
  }
}

TEST(IncrementalDetokenizer, RealTextStreamsBackExactly) {
  core::Rng rng(9);
  const std::string text = test::random_text(rng, 500);
  IncrementalDetokenizer d(tiny());
  std::string out;
  for (int32_t id : tiny().encode(text, Specials::allow)) out += d.push(id);
  out += d.finish();
  EXPECT_EQ(out, text);
}

TEST(IncrementalDetokenizer, SkipsSpecialTokensWhenAsked) {
  IncrementalDetokenizer keep(tiny()), skip(tiny(), true);
  const int32_t eom = tiny().special_id_or_throw(k3_tokens::kEndOfMsg);
  EXPECT_EQ(keep.push(eom), "<|end_of_msg|>");
  EXPECT_EQ(skip.push(eom), "");
  EXPECT_THROW(keep.push(5000), core::Error);
}

}  // namespace
}  // namespace k3::tokenizer
