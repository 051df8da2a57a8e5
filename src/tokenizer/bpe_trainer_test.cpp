// tokenizer/bpe_trainer_test.cpp: the incremental BPE trainer against a naive one (recount every
// pair after every merge), and a trained tokenizer loaded and used like a shipped one.
#include "tokenizer/bpe_trainer.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

#include "tokenizer/split_patterns.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace k3::tokenizer {
namespace {

// The textbook algorithm with the same rules (most frequent pair; ties to the lowest (left,
// right); a pair whose bytes already form a token is banned).
std::vector<std::string> naive_bpe(const std::unordered_map<std::string, int64_t>& counts, size_t num_ranks) {
  std::vector<std::string> tokens;
  std::set<std::string> present;
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b)), present.insert(tokens.back());
  std::vector<std::pair<std::vector<int32_t>, int64_t>> words;
  for (const auto& [w, c] : counts) {
    std::vector<int32_t> ids;
    for (unsigned char ch : w) ids.push_back(ch);
    words.emplace_back(ids, c);
  }
  std::set<std::pair<int32_t, int32_t>> banned;
  while (tokens.size() < num_ranks) {
    std::map<std::pair<int32_t, int32_t>, int64_t> pairs;
    for (const auto& [ids, c] : words)
      for (size_t i = 0; i + 1 < ids.size(); ++i) pairs[{ids[i], ids[i + 1]}] += c;
    std::pair<int32_t, int32_t> best{-1, -1};
    int64_t best_count = 0;
    for (const auto& [p, c] : pairs)
      if (c > best_count && !banned.count(p)) best = p, best_count = c;
    if (best_count == 0) break;
    std::string merged = tokens[static_cast<size_t>(best.first)] + tokens[static_cast<size_t>(best.second)];
    if (!present.insert(merged).second) {
      banned.insert(best);
      continue;
    }
    const auto id = static_cast<int32_t>(tokens.size());
    tokens.push_back(merged);
    for (auto& [ids, c] : words) {
      std::vector<int32_t> next;
      for (size_t i = 0; i < ids.size(); ++i) {
        if (i + 1 < ids.size() && ids[i] == best.first && ids[i + 1] == best.second) next.push_back(id), ++i;
        else next.push_back(ids[i]);
      }
      ids = next;
    }
  }
  return tokens;
}

// Words over a 3-letter alphabet (runs like "aaaa" exercise overlapping pairs, short alphabets
// make many ties and many banned pairs: "ab"+"a" and "a"+"ba" give the same bytes).
TEST(BpeTrainer, LearnsTheSameMergesAsTheNaiveAlgorithm) {
  for (uint32_t seed : {1u, 2u, 3u, 4u}) {
    std::mt19937 rng(seed);
    std::unordered_map<std::string, int64_t> counts;
    for (int w = 0; w < 300; ++w) {
      std::string word;
      const int len = 1 + static_cast<int>(rng() % 9);
      for (int i = 0; i < len; ++i) word += static_cast<char>('a' + rng() % 3);
      counts[word] += 1 + static_cast<int64_t>(rng() % 20);
    }
    const std::vector<std::string> fast = learn_bpe(counts, 256 + 400), slow = naive_bpe(counts, 256 + 400);
    EXPECT_EQ(fast, slow) << "seed " << seed;
    EXPECT_GT(fast.size(), 256u + 50);
  }
}

TEST(BpeTrainer, StopsWhenNoPairIsLeftAndSkipsEmptyCounts) {
  const std::vector<std::string> t = learn_bpe({{"ab", 3}, {"x", 5}, {"cd", 0}}, 1000);
  ASSERT_EQ(t.size(), 257u);
  EXPECT_EQ(t[256], "ab");
  EXPECT_EQ(learn_bpe({}, 1000).size(), 256u);
}

TEST(BpeTrainer, WordCounterSplitsWithThePatternAndMerges) {
  WordCounter a(patterns::kKimi), b(patterns::kKimi);
  a.add("def f(x):\n    return x");
  b.add("return x");
  a.merge(b);
  EXPECT_EQ(a.counts().at("def"), 1);
  EXPECT_EQ(a.counts().at(" return"), 1);
  EXPECT_EQ(a.counts().at("return"), 1);
  EXPECT_EQ(a.counts().at(" x"), 2);
}

// A tokenizer trained on a corpus loads like the shipped K3 one: frequent words become single
// tokens, any text round-trips, and the special slots sit on top.
TEST(BpeTrainer, TrainedTokenizerLoadsAndRoundTrips) {
  WordCounter words(patterns::kKimi);
  for (int i = 0; i < 50; ++i) words.add("import numpy as np\ndef transform(values):\n    return np.sum(values)\n");
  const K3Vocab vocab = k3_vocab(learn_bpe(words.counts(), 1024 - 256), 1024);
  test::TempDir dir("trained");
  write_k3_tokenizer(vocab, dir.path(), "test");
  const Tokenizer tok = Tokenizer::load_k3(dir.path());
  EXPECT_EQ(tok.vocab_size(), 1024);
  EXPECT_EQ(tok.encode(" transform").size(), 1u);
  EXPECT_EQ(tok.encode("import").size(), 1u);
  for (const std::string text : {"def transform(values): return 42 # 你好", "αβγ\n\n\tzz"})
    EXPECT_EQ(tok.decode(tok.encode(text)), text);
  ASSERT_TRUE(tok.eos_id.has_value());
  EXPECT_EQ(*tok.eos_id, 1024 - 256 + 1);  // K3 layout: [BOS] at +0, [EOS] at +1
}

}  // namespace
}  // namespace k3::tokenizer
