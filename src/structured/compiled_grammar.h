// structured/compiled_grammar.h: a grammar bound to a vocabulary, with the token masks that the
// grammar alone decides, computed once and shared by every request that uses the grammar.
//
// At run time a matcher's state is a set of stacks. Stacks with the same parent differ only in
// their top positions; together they form a group, and what a group accepts is mostly decided by
// those positions alone: a token that the group consumes without finishing its rule is accepted
// whatever the caller, one it cannot consume is rejected whatever the caller. Only tokens in which
// the group's rule ends before their last symbol depend on the context (a string's closing quote
// followed by ",": the "," belongs to the caller). So each distinct group gets, once, by a walk of
// the sorted vocabulary from the group's positions with an unknown parent:
//   accepted    the context-independent accepted tokens (a dense bitmask or an id list), and
//   uncertain   (token, symbols consumed before its rule ended) pairs, sorted by what is left,
// and a mask step ORs the accepted sets of its groups and checks only the uncertain suffixes
// against the real continuation (structured/matcher.h).
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"
#include "structured/stacks.h"
#include "structured/vocabulary.h"

namespace k3::structured {

struct GroupMask {
  std::vector<uint32_t> dense;  // [vocab words], or empty: the accepted tokens are `ids`
  std::vector<int32_t> ids;
  struct Uncertain {
    int32_t token;
    uint16_t consumed;  // symbols of the token read before the group's rule ended
  };
  std::vector<Uncertain> uncertain;  // sorted by the token's symbols after `consumed`
  std::vector<uint16_t> uncertain_lcp;
  int64_t accepted_count = 0;
};

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary);
  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  // The group's masks (positions: sorted top positions of stacks sharing one parent), computed on
  // first use; thread-safe.
  std::shared_ptr<const GroupMask> group_mask(std::span<const uint32_t> positions) const;
  size_t cached_groups() const;

 private:
  GroupMask compute(std::span<const uint32_t> positions) const;

  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  mutable std::mutex mu_;
  mutable std::unordered_map<std::string, std::shared_ptr<const GroupMask>> cache_;
};

// Walks a sorted list of symbol sequences from one state, sharing the work of common prefixes:
// for each sequence in order, `result(i, consumed, alive_at_end)` where the walk either consumed
// all of it (alive_at_end: the state after it is non-empty) or died after `consumed` symbols. The
// states per depth are kept in `depth_states()` for the caller to look at (markers included).
class PrefixWalk {
 public:
  template <class SymbolsOf, class LcpOf, class Result>
  void run(StackArena& arena, const State& start, size_t n, SymbolsOf symbols_of, LcpOf lcp_of, Result result);
  const std::vector<State>& depth_states() const { return states_; }

 private:
  std::vector<State> states_;
};

template <class SymbolsOf, class LcpOf, class Result>
void PrefixWalk::run(StackArena& arena, const State& start, size_t n, SymbolsOf symbols_of, LcpOf lcp_of,
                     Result result) {
  if (states_.empty()) states_.resize(1);
  states_[0] = start;
  size_t valid = 0;  // states_[0..valid] hold the current sequence's prefix states
  auto advanceable = [](const State& s) { return !s.empty() && s.back() > kEscaped; };
  for (size_t i = 0; i < n; ++i) {
    const std::span<const Symbol> sym = symbols_of(i);
    size_t d = std::min<size_t>(lcp_of(i), valid);
    if (states_.size() < sym.size() + 1) states_.resize(sym.size() + 1);
    bool dead = d < sym.size() && !advanceable(states_[d]);
    while (!dead && d < sym.size()) {
      arena.advance(states_[d], sym[d], states_[d + 1]);
      valid = ++d;
      dead = d < sym.size() && !advanceable(states_[d]);
    }
    valid = d;
    result(i, d, !dead && !states_[d].empty());
    if (dead) {  // every following sequence sharing these d symbols dies at d as well
      while (i + 1 < n && lcp_of(i + 1) >= d && symbols_of(i + 1).size() > d) {
        ++i;
        result(i, d, false);
      }
    }
  }
}

}  // namespace k3::structured
