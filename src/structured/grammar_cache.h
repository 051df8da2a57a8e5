// structured/grammar_cache.h: compiled grammars by their text, shared by every request that sends
// the same schema (agents send the same tool schemas every turn), so a grammar's parse and its
// token-mask caches are paid once. Least recently used grammars leave past `capacity`. Each newly
// compiled grammar is warmed on a background thread of the cache (CompiledGrammar::warm: the masks
// of its reachable chains, nearest first), so the requests' steps find them made instead of walking
// the vocabulary on the step.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "structured/compiled_grammar.h"

namespace k3::structured {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 256);
  ~GrammarCache();  // stops the warming (within one chain's walk)
  GrammarCache(const GrammarCache&) = delete;
  GrammarCache& operator=(const GrammarCache&) = delete;

  // The grammar for GBNF `text` (structured/ebnf.h) starting at rule `root`, compiled on first
  // use. Throws core::Error naming what is wrong with the text. Thread-safe.
  std::shared_ptr<const CompiledGrammar> get(const std::string& text, const std::string& root = "root");
  const Vocabulary& vocabulary() const { return *vocabulary_; }

  struct Stats {
    int64_t hits = 0, misses = 0;
    double compile_seconds = 0;  // summed over misses
    int64_t warmed_grammars = 0, warmed_chains = 0;
    int64_t unwarmed_grammars = 0;  // left cold: the cache's grammars held kMaxWarmBytes of masks
    double warm_seconds = 0;        // the background thread's, summed
  };
  Stats stats() const;
  // Waits until every grammar compiled so far is warmed, or `max_seconds` pass; true when warm.
  bool wait_warm(double max_seconds) const;
  // A new grammar is warmed only while the cached grammars' masks (CompiledGrammar::cached_bytes)
  // sum to less than this (their requests still compute the chains they reach).
  static constexpr int64_t kMaxWarmBytes = int64_t{1} << 30;

 private:
  std::shared_ptr<const Vocabulary> vocabulary_;
  size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> lru_;  // most recent first
  struct Entry {
    std::shared_ptr<const CompiledGrammar> grammar;
    std::list<std::string>::iterator at;
  };
  std::unordered_map<std::string, Entry> entries_;
  Stats stats_;
  // Warming: grammars waiting (a grammar evicted and unused meanwhile is skipped), the one in hand.
  void warm_loop();
  std::deque<std::weak_ptr<const CompiledGrammar>> to_warm_;
  bool warming_ = false;
  std::atomic<bool> stop_{false};
  mutable std::condition_variable cv_;  // work queued, or the queue drained
  std::thread warmer_;                  // started at the first compile
};

}  // namespace k3::structured
