// tokenizer/tiny_tokenizer_test.cpp: the tokenizer make-checkpoint writes: K3 layout (ranks,
// then 256 special slots with K3's names at K3's offsets), determinism, useful merges, the
// files load back through load_k3, and vocabularies too small for it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "config/k3_config.h"
#include "core/error.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/tokenizer_test_util.h"

namespace k3::tokenizer {
namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TEST(TinyTokenizer, K3LayoutAtTheTopOfTheVocabulary) {
  const K3Vocab v = build_tiny_vocab(1024);
  EXPECT_EQ(v.first_special, 768);
  ASSERT_EQ(v.ranks.size(), 768u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(v.ranks[static_cast<size_t>(b)].first, std::string(1, static_cast<char>(b)));
  for (size_t r = 0; r < v.ranks.size(); ++r) EXPECT_EQ(v.ranks[r].second, static_cast<int32_t>(r));
  const Tokenizer& tok = test::tiny();
  // Same offsets as K3 (163584 + offset): bos 0, eos 1, end_of_msg 2 (config eos), pad 255.
  EXPECT_EQ(tok.special_id(k3_tokens::kBos), 768);
  EXPECT_EQ(tok.special_id(k3_tokens::kEos), 769);
  EXPECT_EQ(tok.special_id(k3_tokens::kEndOfMsg), 770);
  EXPECT_EQ(tok.special_id(k3_tokens::kOpen), 771);
  EXPECT_EQ(tok.special_id(k3_tokens::kClose), 772);
  EXPECT_EQ(tok.special_id(k3_tokens::kSep), 773);
  EXPECT_EQ(tok.special_id(k3_tokens::kPad), 1023);
}

TEST(TinyTokenizer, MergesCompressChatText) {
  const std::string text = "Hello! How can I help you today? The user asks, and the assistant answers.";
  const auto ids = test::tiny().encode(text);
  EXPECT_LT(ids.size() * 3, text.size()) << "fewer than 3 bytes per token: the merges are not useful";
  EXPECT_EQ(test::tiny().decode(ids), text);
}

TEST(TinyTokenizer, WritesFilesThatLoadBackIdentically) {
  test::TempDir a("tiny-a"), b("tiny-b");
  ASSERT_TRUE(write_tiny_tokenizer(1024, a.path()));
  ASSERT_TRUE(write_tiny_tokenizer(1024, b.path()));
  EXPECT_EQ(slurp(a.path() / "tiktoken.model"), slurp(b.path() / "tiktoken.model"));
  EXPECT_EQ(slurp(a.path() / "tokenizer_config.json"), slurp(b.path() / "tokenizer_config.json"));
  const Tokenizer tok = Tokenizer::load_k3(a.path());
  EXPECT_EQ(tok.vocab_size(), 1024);
  EXPECT_EQ(tok.bos_id, 768);
  EXPECT_EQ(tok.eos_id, 769);
  EXPECT_EQ(tok.pad_id, 1023);
  EXPECT_EQ(tok.unk_id, 1022);
  EXPECT_EQ(tok.special_id("<|reserved_token_800|>"), 800);
  core::Rng rng(1);
  const std::string text = test::random_text(rng, 300);
  EXPECT_EQ(tok.encode(text, Specials::allow), test::tiny().encode(text, Specials::allow));
}

TEST(TinyTokenizer, OtherSizes) {
  const K3Vocab smallest = build_tiny_vocab(kMinK3Vocab);
  EXPECT_EQ(smallest.ranks.size(), 256u);
  EXPECT_EQ(smallest.first_special, 256);
  const K3Vocab big = build_tiny_vocab(8192);  // past what the text teaches: byte extensions
  EXPECT_EQ(big.ranks.size(), 8192u - 256u);
  std::set<std::string> unique;
  for (const auto& [bytes, rank] : big.ranks) unique.insert(bytes);
  EXPECT_EQ(unique.size(), big.ranks.size());
  EXPECT_THROW(build_tiny_vocab(511), core::Error);
}

TEST(TinyTokenizer, TooSmallAVocabularyGetsNoTokenizer) {
  test::TempDir dir("tiny-small");
  ASSERT_TRUE(write_tiny_tokenizer(1024, dir.path()));
  EXPECT_FALSE(write_tiny_tokenizer(300, dir.path()));  // removes the stale files
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "tiktoken.model"));
  EXPECT_FALSE(std::filesystem::exists(dir.path() / "tokenizer_config.json"));
}

}  // namespace
}  // namespace k3::tokenizer

namespace k3::tokenizer {
namespace {

// The built-in k3-tiny config names the bundled tokenizer's bos / end_of_msg / pad ids.
TEST(TinyTokenizer, BuiltinConfigIdsMatchTheTokenizer) {
  const config::K3Config c = config::builtin_config("k3-tiny");
  const Tokenizer& tok = test::tiny();
  EXPECT_EQ(c.bos_token_id, tok.special_id(k3_tokens::kBos));
  EXPECT_EQ(c.eos_token_id, tok.special_id(k3_tokens::kEndOfMsg));
  EXPECT_EQ(c.pad_token_id, tok.special_id(k3_tokens::kPad));
}

}  // namespace
}  // namespace k3::tokenizer
