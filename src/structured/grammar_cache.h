// structured/grammar_cache.h: compiled grammars by their text, shared by every request that sends
// the same schema (agents send the same tool schemas every turn), so a grammar's parse and its
// token-mask caches are paid once. Least recently used grammars leave past `capacity`.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "structured/compiled_grammar.h"

namespace k3::structured {

class GrammarCache {
 public:
  GrammarCache(std::shared_ptr<const Vocabulary> vocabulary, size_t capacity = 256);

  // The grammar for GBNF `text` (structured/ebnf.h) starting at rule `root`, compiled on first
  // use. Throws core::Error naming what is wrong with the text. Thread-safe.
  std::shared_ptr<const CompiledGrammar> get(const std::string& text, const std::string& root = "root");
  const Vocabulary& vocabulary() const { return *vocabulary_; }

  struct Stats {
    int64_t hits = 0, misses = 0;
    double compile_seconds = 0;  // summed over misses
  };
  Stats stats() const;

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
};

}  // namespace k3::structured
