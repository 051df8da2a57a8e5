// tokenizer/bpe_trainer.h: byte-level BPE training (tiktoken semantics) over pre-token counts.
//
// Used twice: by the tiny tokenizer make-checkpoint writes (a built-in text) and by
// `k3serve train-tokenizer` (a corpus), so a trained tokenizer splits text exactly as the engine
// that serves it (the same Pretokenizer, the same pattern).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pretokenizer.h"

namespace k3::tokenizer {

// Counts of the pre-tokens ("words") of any number of texts.
class WordCounter {
 public:
  explicit WordCounter(std::string_view split_pattern);
  void add(std::string_view text);       // text must be valid UTF-8 (not checked again)
  void merge(const WordCounter& other);  // adds other's counts (same pattern)
  const std::unordered_map<std::string, int64_t>& counts() const { return counts_; }

 private:
  Pretokenizer split_;
  std::unordered_map<std::string, int64_t> counts_;
};

// Token bytes by rank: the 256 single bytes (rank = byte value), then merges in the order BPE
// learns them (the most frequent adjacent pair over all words, weighted by count; ties go to the
// lowest (left rank, right rank); a pair whose bytes already form a token is skipped for good),
// until `num_ranks` tokens exist or no pair is left (the result is then shorter). Incremental:
// each merge touches only the words that hold the pair, so a corpus of millions of distinct
// words trains in seconds.
std::vector<std::string> learn_bpe(const std::unordered_map<std::string, int64_t>& word_counts, size_t num_ranks);

}  // namespace k3::tokenizer
