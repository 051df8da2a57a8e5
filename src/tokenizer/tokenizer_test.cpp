// tokenizer/tokenizer_test.cpp: encode/decode of the tokenizer on the tiny K3-format vocabulary:
// round trips, special tokens allowed or denied, Kimi's 25k-run / 400k-chunk cuts, input
// validation, and every load error of tiktoken.model / tokenizer_config.json.
#include <gtest/gtest.h>

#include "core/error.h"
#include "tokenizer/base64.h"
#include "tokenizer/k3_tokens.h"
#include "tokenizer/tokenizer_test_util.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {
namespace {

using test::tiny;

std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one containing '" << needle << "'";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, RoundTripsRandomMixedText) {
  core::Rng rng(3);
  for (size_t chars : {1, 17, 54, 97, 2000}) {
    const std::string text = test::random_text(rng, chars);
    for (Specials sp : {Specials::deny, Specials::allow}) {
      const std::vector<int32_t> ids = tiny().encode(text, sp);
      EXPECT_EQ(tiny().decode(ids), text);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tiny().vocab_size());
    }
  }
}

TEST(Tokenizer, SpecialTokensOnlyWhenAllowed) {
  const Tokenizer& tok = tiny();
  const int32_t open = tok.special_id_or_throw(k3_tokens::kOpen), sep = tok.special_id_or_throw(k3_tokens::kSep);
  EXPECT_EQ(open, 768 + 3);
  EXPECT_EQ(tok.encode("<|open|>", Specials::allow), std::vector<int32_t>{open});
  const auto denied = tok.encode("<|open|>", Specials::deny);
  EXPECT_GT(denied.size(), 1u);
  for (int32_t id : denied) EXPECT_FALSE(tok.is_special(id));
  const auto mixed = tok.encode("a<|open|>message<|sep|>b", Specials::allow);
  EXPECT_EQ(mixed.front(), tok.encode("a").front());
  EXPECT_EQ(std::count(mixed.begin(), mixed.end(), open), 1);
  EXPECT_EQ(std::count(mixed.begin(), mixed.end(), sep), 1);
  // The text between specials is split on its own: "message" is encoded as if alone.
  EXPECT_EQ(mixed,
            concat(concat(concat(concat(tok.encode("a"), {open}), tok.encode("message")), {sep}), tok.encode("b")));
  EXPECT_EQ(tok.decode(mixed), "a<|open|>message<|sep|>b");
  EXPECT_EQ(tok.decode(mixed, /*skip_special=*/true), "amessageb");
  // Reserved slots have names and ids too.
  EXPECT_EQ(tok.special_id("<|reserved_token_800|>"), std::nullopt);  // not loaded via load_k3
}

TEST(Tokenizer, RejectsInvalidUtf8AndUnknownIds) {
  expect_error([] { tiny().encode("ok\xC3"); }, "not valid UTF-8");
  expect_error([] { tiny().encode("a\xED\xA0\x80z"); }, "byte offset 1");
  expect_error([] { tiny().decode(std::vector<int32_t>{5, 1024}); }, "token id 1024 is not in the vocabulary");
  expect_error([] { tiny().decode(std::vector<int32_t>{-1}); }, "token id -1");
}

TEST(Tokenizer, DecodeReplacesBrokenUtf8) {
  const Tokenizer& tok = tiny();
  const int32_t f0 = 0xF0, x9f = 0x9F;  // byte tokens: rank == byte value in the tiny vocabulary
  EXPECT_EQ(tok.decode(std::vector<int32_t>{'a', f0, x9f}), "a\xEF\xBF\xBD");
  EXPECT_EQ(tok.decode_bytes(std::vector<int32_t>{'a', f0, x9f}), "a\xF0\x9F");
}

TEST(Tokenizer, KimiCutsRunsOver25kCharacters) {
  const Tokenizer& kimi = tiny();
  K3Vocab v = build_tiny_vocab(1024);
  const Tokenizer plain(std::move(v.ranks), std::move(v.specials), {std::string(patterns::kKimi), false});
  // 30,000 letters: Kimi encodes the first 25,000 and the remaining 5,000 separately.
  std::string word;
  for (int i = 0; i < 30'000; ++i) word += "abc"[i % 3];
  EXPECT_EQ(kimi.encode(word), concat(plain.encode(word.substr(0, 25'000)), plain.encode(word.substr(25'000))));
  EXPECT_NE(kimi.encode(word), plain.encode(word));
  // Counted in characters, not bytes: 26,000 two-byte letters are cut after 25,000 of them.
  std::string cyr;
  for (int i = 0; i < 26'000; ++i) cyr += "Ж";
  EXPECT_EQ(kimi.encode(cyr), concat(plain.encode(cyr.substr(0, 50'000)), plain.encode(cyr.substr(50'000))));
  // Whitespace runs too; a run of exactly 25,000 is not cut.
  const std::string spaces(25'000, ' ');
  EXPECT_EQ(kimi.encode(spaces + "x"), plain.encode(spaces + "x"));
  EXPECT_EQ(kimi.encode(spaces + " x"), concat(plain.encode(spaces), plain.encode(" x")));
}

TEST(Tokenizer, KimiCutsTextIntoChunksOf400kCharacters) {
  const Tokenizer& kimi = tiny();
  K3Vocab v = build_tiny_vocab(1024);
  const Tokenizer plain(std::move(v.ranks), std::move(v.specials), {std::string(patterns::kKimi), false});
  std::string text;
  while (text.size() < 400'010) text += "the cat reads ";
  text.resize(400'010);
  EXPECT_EQ(kimi.encode(text), concat(plain.encode(text.substr(0, 400'000)), plain.encode(text.substr(400'000))));
}

// ---- loading K3's tokenizer folder -----------------------------------------------------------

std::string tiny_model_file() {
  std::string model;
  for (const auto& [bytes, rank] : build_tiny_vocab(1024).ranks)
    model += base64_encode(bytes) + " " + std::to_string(rank) + "\n";
  return model;
}

const char* kConfig = R"({"added_tokens_decoder": {"768": {"content": "[BOS]", "special": true},
  "769": {"content": "[EOS]"}, "770": {"content": "<|end_of_msg|>"}, "771": {"content": "<|open|>", "special": false}},
  "bos_token": "[BOS]", "eos_token": {"content": "[EOS]"}, "pad_token": null})";

TEST(LoadK3, ReadsRanksSpecialsAndReservedSlots) {
  test::TempDir dir("load");
  dir.write("tiktoken.model", tiny_model_file());
  dir.write("tokenizer_config.json", kConfig);
  const Tokenizer tok = Tokenizer::load_k3(dir.path());
  EXPECT_EQ(tok.num_ranks(), 768);
  EXPECT_EQ(tok.vocab_size(), 1024);
  EXPECT_EQ(tok.bos_id, 768);
  EXPECT_EQ(tok.eos_id, 769);
  EXPECT_EQ(tok.pad_id, std::nullopt);
  EXPECT_EQ(tok.special_id("<|reserved_token_1023|>"), 1023);
  EXPECT_EQ(tok.special_id("<|end_of_msg|>"), 770);
  EXPECT_TRUE(tok.is_special(771));
  EXPECT_FALSE(tok.is_skippable(771));  // "special": false
  EXPECT_EQ(tok.decode(std::vector<int32_t>{768, 771, 'h', 'i'}, true), "<|open|>hi");
  EXPECT_EQ(tok.encode("Hello!"), tiny().encode("Hello!"));
}

struct BadFolder {
  std::string name, model, config, needle;
};

class LoadK3Errors : public ::testing::TestWithParam<BadFolder> {};

TEST_P(LoadK3Errors, NameTheProblem) {
  const BadFolder& c = GetParam();
  test::TempDir dir("bad-" + c.name);
  if (!c.model.empty()) dir.write("tiktoken.model", c.model);
  if (!c.config.empty()) dir.write("tokenizer_config.json", c.config);
  expect_error([&] { Tokenizer::load_k3(dir.path()); }, c.needle);
}

std::vector<BadFolder> bad_folders() {
  const std::string good = tiny_model_file(), cfg = kConfig;
  std::string missing_byte = good.substr(good.find('\n') + 1);  // drop byte 0
  return {
      {"no_model", "", cfg, "cannot open rank file"},
      {"no_config", good, "", "cannot open tokenizer config"},
      {"bad_base64", good + "@@@@ 768\n", cfg, "line 769: '@@@@' is not valid base64"},
      {"bad_rank", good + "YWJjZGVm x1\n", cfg, "line 769: rank 'x1' is not a non-negative integer"},
      {"three_fields", good + "YWJj 1 2\n", cfg, "expected 'base64 rank'"},
      {"dup_rank", good + "YWJjZGVmZw== 5\n", cfg, "duplicate rank 5 (first on line 6)"},
      {"dup_bytes", good + "QQ== 768\n", cfg, "token bytes duplicate those of line 66"},
      {"missing_byte", missing_byte, cfg, "rank 767 is outside 0..766"},
      {"sparse_ranks", good + "YWJjZGVmZw== 5000\n", cfg, "ranks must be dense"},
      {"config_not_json", good, "{\"added_tokens_decoder\": ", "is not valid JSON"},
      {"id_not_number", good, R"({"added_tokens_decoder": {"x": {"content": "a"}}})", "the key must be a token id"},
      {"id_in_ranks", good, R"({"added_tokens_decoder": {"5": {"content": "a"}}})",
       "outside the special range 768..1023"},
      {"id_past_slots", good, R"({"added_tokens_decoder": {"1024": {"content": "a"}}})", "outside the special range"},
      {"no_content", good, R"({"added_tokens_decoder": {"770": {"special": true}}})", "non-empty string \"content\""},
      {"bad_special", good, R"({"added_tokens_decoder": {"770": {"content": "a", "special": 1}}})",
       "special must be true or false"},
      {"dup_content", good, R"({"added_tokens_decoder": {"770": {"content": "a"}, "771": {"content": "a"}}})",
       "has two ids"},
      {"bos_unknown", good, R"({"bos_token": "[NOPE]"})", "bos_token '[NOPE]' is not one of the added tokens"},
      {"bos_type", good, R"({"bos_token": 5})", "\"bos_token\" must be a string"},
  };
}

INSTANTIATE_TEST_SUITE_P(Files, LoadK3Errors, ::testing::ValuesIn(bad_folders()),
                         [](const auto& info) { return info.param.name; });

TEST(Tokenizer, ConstructorValidatesRanksAndSpecials) {
  std::vector<std::pair<std::string, int32_t>> ranks;
  for (int b = 0; b < 256; ++b) ranks.emplace_back(std::string(1, static_cast<char>(b)), b);
  const TokenizerOptions opt{std::string(patterns::kKimi), false};
  expect_error([&] { Tokenizer(ranks, {{"<x>", 10}}, opt); }, "id 10 is used twice");
  expect_error([&] { Tokenizer(ranks, {{"", 300}}, opt); }, "empty text");
  auto missing = ranks;
  missing.pop_back();
  expect_error([&] { Tokenizer(missing, {}, opt); }, "single byte 0xff has no rank");
  auto dup = ranks;
  dup.emplace_back("a", 256);
  expect_error([&] { Tokenizer(dup, {}, opt); }, "repeats the token bytes of rank 97");
  expect_error([&] { Tokenizer(ranks, {}, {"(", false}); }, "does not compile");
}

}  // namespace
}  // namespace k3::tokenizer
