// structured/matcher.h: one request's position in its grammar: which tokens may come next (a
// bitmask over the vocabulary), advancing on each accepted token, rolling back for speculative
// decoding (a verify step checks its draft rows against the grammar, then keeps only the accepted
// prefix).
//
//   Matcher m(compiled);
//   m.fill_mask(words);   // bit t of words[t / 32] set: token t allowed (end tokens where it may end)
//   m.accept(token);      // false, and no change, when the grammar refuses the token
//   m.rollback(n);        // undo the last n accepted tokens (n <= max_rollback)
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "structured/compiled_grammar.h"
#include "structured/stacks.h"

namespace k3::structured {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const CompiledGrammar> grammar, int max_rollback = 16);

  // Advances on a token (an end token: accepted when the grammar may end here, and then the
  // matcher is terminated). False when refused; the state is then unchanged.
  bool accept(int32_t token);
  // Advances on raw symbols (bytes, or special symbols); for tests and the reference acceptor.
  bool accept_symbols(std::span<const Symbol> symbols);
  bool accept_text(std::string_view bytes);
  void rollback(int tokens);
  int rollback_depth() const { return static_cast<int>(history_.size()) - 1; }

  // The grammar may end here (an end token is allowed).
  bool can_end() const;
  // An end token was accepted: nothing more may follow.
  bool terminated() const { return history_.back().terminated; }
  // Writes the allowed tokens into words ([vocabulary().words()]).
  void fill_mask(std::span<uint32_t> words);

  const CompiledGrammar& grammar() const { return *grammar_; }

 private:
  struct Entry {
    State state;
    bool terminated = false;
  };
  const State& state() const { return history_.back().state; }
  void push(State s, bool terminated);

  std::shared_ptr<const CompiledGrammar> grammar_;
  StackArena arena_;
  int max_rollback_;
  std::deque<Entry> history_;  // history_.back(): the current state
  State scratch_[2];
  PrefixWalk walk_;
  // A stack's masks by its chain (CompiledGrammar::group_mask), remembered here to skip the lock.
  const GroupMask& group_mask(const std::vector<uint32_t>& key);
  std::vector<uint32_t> key_;
  // A chain key held inline (at most 1 + 2 * kGroupDepth words): a step's lookups allocate nothing.
  struct LocalKey {
    std::array<uint32_t, 1 + 2 * CompiledGrammar::kGroupDepth> words{};
    bool operator==(const LocalKey&) const = default;
  };
  struct LocalKeyHash {
    size_t operator()(const LocalKey& k) const {
      uint64_t h = 0x9E3779B97F4A7C15ull;
      for (size_t i = 0; i <= k.words[0]; ++i) h = (h ^ k.words[i]) * 0xBF58476D1CE4E5B9ull;
      return static_cast<size_t>(h ^ (h >> 31));
    }
  };
  std::unordered_map<LocalKey, std::shared_ptr<const GroupMask>, LocalKeyHash> masks_;
};

}  // namespace k3::structured
