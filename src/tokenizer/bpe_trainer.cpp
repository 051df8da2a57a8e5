// tokenizer/bpe_trainer.cpp: incremental BPE merges: pair counts, the words holding each pair,
// and a max-heap with lazy deletion (an entry whose count is stale is dropped when popped).
#include "tokenizer/bpe_trainer.h"

#include <queue>
#include <unordered_set>

namespace k3::tokenizer {

WordCounter::WordCounter(std::string_view split_pattern) : split_(split_pattern) {}

void WordCounter::add(std::string_view text) {
  for (std::string& piece : split_.split(text)) ++counts_[std::move(piece)];
}

void WordCounter::merge(const WordCounter& other) {
  for (const auto& [word, count] : other.counts_) counts_[word] += count;
}

namespace {

using PairKey = uint64_t;  // (left << 32) | right: ascending keys are ascending (left, right)

PairKey key_of(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct HeapEntry {
  int64_t count;
  PairKey key;
  // std::priority_queue pops the "largest": the highest count, then the lowest key.
  bool operator<(const HeapEntry& o) const { return count != o.count ? count < o.count : key > o.key; }
};

class Merger {
 public:
  explicit Merger(const std::unordered_map<std::string, int64_t>& word_counts) {
    words_.reserve(word_counts.size());
    for (const auto& [word, count] : word_counts) {
      if (word.size() < 2 || count <= 0) continue;
      std::vector<int32_t> ids(word.begin(), word.end());
      for (int32_t& id : ids) id = static_cast<unsigned char>(id);
      words_.push_back({std::move(ids), count});
    }
    for (uint32_t w = 0; w < words_.size(); ++w) {
      const Word& word = words_[w];
      for (size_t i = 0; i + 1 < word.ids.size(); ++i) {
        const PairKey k = key_of(word.ids[i], word.ids[i + 1]);
        pair_count_[k] += word.count;
        holders_[k].push_back(w);
      }
    }
    for (const auto& [k, count] : pair_count_) heap_.push({count, k});
    seen_.assign(words_.size(), 0);
  }

  // The best pair not yet banned, or false when none is left.
  bool best(PairKey& key) {
    while (!heap_.empty()) {
      const HeapEntry top = heap_.top();
      const auto it = pair_count_.find(top.key);
      if (it == pair_count_.end() || it->second != top.count || top.count <= 0 || banned_.count(top.key)) {
        heap_.pop();
        continue;
      }
      key = top.key;
      return true;
    }
    return false;
  }

  void ban(PairKey key) {
    banned_.insert(key);
    heap_.pop();
  }

  // Replaces every non-overlapping occurrence (left to right) of `key` by `id` in the words
  // that hold it, and updates the counts of every pair those words gain or lose.
  void merge(PairKey key, int32_t id) {
    heap_.pop();
    const auto left = static_cast<int32_t>(key >> 32), right = static_cast<int32_t>(key & 0xffffffffu);
    ++stamp_;
    changed_.clear();
    std::vector<uint32_t> holders = std::move(holders_[key]);
    holders_.erase(key);
    std::vector<int32_t> next;
    for (uint32_t w : holders) {
      if (seen_[w] == stamp_) continue;
      seen_[w] = stamp_;
      Word& word = words_[w];
      next.clear();
      for (size_t i = 0; i < word.ids.size(); ++i) {
        if (i + 1 < word.ids.size() && word.ids[i] == left && word.ids[i + 1] == right) {
          next.push_back(id);
          ++i;
        } else {
          next.push_back(word.ids[i]);
        }
      }
      if (next.size() == word.ids.size()) continue;  // a stale holder
      for (size_t i = 0; i + 1 < word.ids.size(); ++i) add_count(key_of(word.ids[i], word.ids[i + 1]), -word.count);
      for (size_t i = 0; i + 1 < next.size(); ++i) {
        const PairKey k = key_of(next[i], next[i + 1]);
        add_count(k, word.count);
        if (next[i] == id || next[i + 1] == id) holders_[k].push_back(w);
      }
      word.ids.swap(next);
    }
    pair_count_.erase(key);
    for (PairKey k : changed_) {
      const auto it = pair_count_.find(k);
      if (it == pair_count_.end()) continue;
      if (it->second <= 0) {
        pair_count_.erase(it);
        continue;
      }
      heap_.push({it->second, k});
    }
  }

 private:
  struct Word {
    std::vector<int32_t> ids;
    int64_t count;
  };

  void add_count(PairKey k, int64_t delta) {
    pair_count_[k] += delta;
    changed_.insert(k);
  }

  std::vector<Word> words_;
  std::unordered_map<PairKey, int64_t> pair_count_;
  std::unordered_map<PairKey, std::vector<uint32_t>> holders_;  // may hold stale or repeated words
  std::priority_queue<HeapEntry> heap_;
  std::unordered_set<PairKey> banned_, changed_;
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
};

}  // namespace

std::vector<std::string> learn_bpe(const std::unordered_map<std::string, int64_t>& word_counts, size_t num_ranks) {
  std::vector<std::string> tokens;
  std::unordered_set<std::string> present;
  for (int b = 0; b < 256; ++b) {
    tokens.emplace_back(1, static_cast<char>(b));
    present.insert(tokens.back());
  }
  Merger merger(word_counts);
  PairKey key = 0;
  while (tokens.size() < num_ranks && merger.best(key)) {
    std::string merged = tokens[key >> 32] + tokens[key & 0xffffffffu];
    if (!present.insert(merged).second) {
      merger.ban(key);
      continue;
    }
    tokens.push_back(std::move(merged));
    merger.merge(key, static_cast<int32_t>(tokens.size() - 1));
  }
  return tokens;
}

}  // namespace k3::tokenizer
