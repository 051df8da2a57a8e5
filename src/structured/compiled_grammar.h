// structured/compiled_grammar.h: a grammar bound to a vocabulary, with the token masks that the
// grammar alone decides, computed once and shared by every request that uses the grammar.
//
// At run time a matcher's state is a set of stacks, and a token is allowed when one of them takes
// it. Cut a stack kGroupDepth frames below its top: what it accepts is mostly decided by those top
// frames (its chain of positions) alone: a token it consumes without returning into the ancestor
// below the chain is accepted whatever lies below, one it cannot consume is rejected whatever lies
// below. Only tokens that return into the ancestor before their last symbol depend on the rest of
// the stack (deep closing runs like "}]}"). One frame is too shallow: a string's characters are one
// rule each, so nearly every token would leave it; four frames hold a string, its key/value pair
// and the object around it. Keys are single chains, not the set of a state's stacks: sets would
// multiply (every combination of optional properties and whitespace a new key). So each distinct
// chain gets, once, by a walk of the sorted vocabulary from it over an unknown ancestor:
//   accepted    the context-independent accepted tokens (a dense bitmask or an id list), and
//   uncertain   (token, symbols consumed before its rule ended) pairs, sorted by what is left,
// and a mask step ORs the accepted sets of its stacks' chains and checks only the uncertain suffixes
// against the real continuation (structured/matcher.h).
//
// A repeat frame in a chain holds a count, and one token completes at most as many iterations as it
// has symbols (a body never matches the empty string), so what a chain accepts depends on a count
// only through min(min - count, H) and min(max - count, H), H = the longest token's symbols + 1.
// The key holds each count canonical for those two (canonical_count): the counts of x{0,300} more
// than H below 300 are one chain, and x{0,500000} costs about 2H chains, not 500,000 positions.
// A chain within H of a repeat's maximum (room r = max - count < H) accepts what the chain of the
// far count does, less some tokens of r symbols or more (a token shorter than r cannot run out of
// room; more room never refuses a token): its masks are that chain's, minus the long tokens a walk
// of only those refuses; when the far chain has no token that long, its masks themselves. So the H
// chains near a maximum cost a walk of the long tokens and a list of ids each, or nothing, not a
// walk of the vocabulary and a dense mask.
#pragma once
#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"
#include "structured/stacks.h"
#include "structured/vocabulary.h"

namespace k3::structured {

struct GroupMask {
  std::vector<uint32_t> dense;  // [vocab words], or empty: the accepted tokens are `ids` or base's
  std::vector<int32_t> ids;
  // Near a repeat's maximum: the accepted tokens are base's (dense) less `removed` (sorted ids).
  std::shared_ptr<const GroupMask> base;
  std::vector<int32_t> removed;
  struct Uncertain {
    int32_t token;
    uint16_t consumed;  // symbols of the token read before the group's rule ended
  };
  std::vector<Uncertain> uncertain;  // sorted by the token's symbols after `consumed`
  std::vector<uint16_t> uncertain_lcp;
  int64_t accepted_count = 0;
  uint32_t longest = 0;  // symbols of the longest accepted or uncertain token (at most that)
};

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary);
  const Grammar& grammar() const { return grammar_; }
  const Vocabulary& vocabulary() const { return *vocabulary_; }
  // Frames per stack that a group's key holds.
  static constexpr int kGroupDepth = 4;
  // A chain's masks, computed on first use; thread-safe. key: a chain_key (the format allows
  // several chains one after another: their union).
  std::shared_ptr<const GroupMask> group_mask(std::span<const uint32_t> key) const;
  size_t cached_groups() const;
  int64_t cached_bytes() const;  // of the chains' masks held
  // The key of stack `s`'s chain in `arena` (what a mask step looks its masks up by): [entries,
  // top position, ..., position of the frame above the ancestor], each repeat frame's position
  // followed by its canonical count. Returns that ancestor (kNoParent: the chain reaches the root).
  StackId chain_key(const StackArena& arena, StackId s, std::vector<uint32_t>& key) const;
  // The count that stands for `count` of repeat `r` in a key: itself within H of a bound; else
  // min - H below the minimum, min above it.
  uint32_t canonical_count(const Repeat& r, uint32_t count) const;
  uint32_t count_horizon() const { return horizon_; }  // H

  // Walks ahead of the requests: computes the masks of the chains reachable from the start, nearest
  // first (a breadth-first search over single stacks up to kWarmMaxDepth frames deep and
  // kWarmMaxStacks stacks, at most max_chains chains, until the grammar holds max_bytes of masks), so a step that reaches a chain for the first time finds its masks made (or waits for
  // the walk in progress) instead of walking the vocabulary itself. Stops early when `stop` is set;
  // returns the chains whose masks it computed or found.
  size_t warm(const std::atomic<bool>& stop, size_t max_chains = kWarmMaxChains,
              int64_t max_bytes = kWarmMaxBytes) const;
  static constexpr int kWarmMaxDepth = 12;
  static constexpr size_t kWarmMaxStacks = size_t{1} << 17;
  static constexpr size_t kWarmMaxChains = size_t{1} << 16;
  static constexpr int64_t kWarmMaxBytes = int64_t{32} << 20;  // 1,600 dense masks of K3's vocabulary

 private:
  GroupMask compute(std::span<const uint32_t> key) const;
  // A chain's masks: walked (compute), or near a repeat's maximum, from the far chain's (shared:
  // they are the far chain's masks themselves).
  std::shared_ptr<const GroupMask> make(std::span<const uint32_t> key, bool& shared) const;
  // The entry of `key` (one chain) holding the count of a frame within H of its repeat's maximum
  // whose far counts (min) have H or more room; 0 when none.
  size_t near_max_entry(std::span<const uint32_t> key) const;
  // The masks of such a chain (`room` iterations left) from the far chain's: only the far chain's
  // tokens of `room` symbols or more are walked again.
  GroupMask derive_near_max(std::span<const uint32_t> key, uint32_t room,
                            const std::shared_ptr<const GroupMask>& far) const;
  // Rebuilds a key's chains in `arena`, each over an unknown ancestor: the walk's start.
  State chains_of(StackArena& arena, std::span<const uint32_t> key) const;
  // Sorts `m.uncertain` by what is left of each token and fills uncertain_lcp.
  void finish_uncertain(GroupMask& m) const;

  Grammar grammar_;
  std::shared_ptr<const Vocabulary> vocabulary_;
  uint32_t horizon_;
  mutable std::mutex mu_;
  // Each chain's mask, or the future of one being computed (the first caller computes it; others
  // wait for it rather than walk twice).
  struct Entry {
    std::shared_ptr<const GroupMask> mask;                         // made
    std::shared_future<std::shared_ptr<const GroupMask>> pending;  // else: being made
  };
  mutable std::unordered_map<std::string, Entry> cache_;
  mutable int64_t cached_bytes_ = 0;
};

// Walks a sorted list of symbol sequences from one state, sharing the work of common prefixes:
// for each sequence in order, `result(i, consumed, alive_at_end)` where the walk either consumed
// all of it (alive_at_end: the state after it is non-empty) or died after `consumed` symbols. The
// state after each prefix is depth_state(depth) (markers included). States are interned and each
// (state, symbol) transition is computed once, so a loop (a string's characters) costs one lookup
// per symbol; the memo stays valid while the arena lives (its nodes never change). When the walk
// dies after d symbols of sequence i, the following ones sharing those d die too: `skip(i, d)`
// may return where to go on without reporting them (the caller needs nothing of them), or nullopt
// to have each reported.
class PrefixWalk {
 public:
  template <class SymbolsOf, class LcpOf, class Result>
  void run(StackArena& arena, const State& start, size_t n, SymbolsOf symbols_of, LcpOf lcp_of, Result result) {
    run(arena, start, n, symbols_of, lcp_of, result, [](size_t, size_t) { return std::optional<size_t>(); });
  }
  template <class SymbolsOf, class LcpOf, class Result, class Skip>
  void run(StackArena& arena, const State& start, size_t n, SymbolsOf symbols_of, LcpOf lcp_of, Result result,
           Skip skip);
  const State& depth_state(size_t depth) const { return interned_[ids_[depth]]; }

 private:
  uint32_t intern(const State& s);
  uint32_t next(StackArena& arena, uint32_t from, Symbol symbol);
  bool advanceable(uint32_t id) const { return !interned_[id].empty() && interned_[id].back() > kEscaped; }

  std::vector<State> interned_;
  std::unordered_map<std::string, uint32_t> index_;
  std::unordered_map<uint64_t, uint32_t> next_;
  std::vector<uint32_t> ids_;  // per depth: the state after that many symbols of the current sequence
  State scratch_;
};

template <class SymbolsOf, class LcpOf, class Result, class Skip>
void PrefixWalk::run(StackArena& arena, const State& start, size_t n, SymbolsOf symbols_of, LcpOf lcp_of, Result result,
                     Skip skip) {
  if (next_.size() > (size_t{1} << 20)) {  // bound the memo of a long-lived matcher
    interned_.clear();
    index_.clear();
    next_.clear();
  }
  if (ids_.empty()) ids_.resize(1);
  ids_[0] = intern(start);
  size_t valid = 0;  // ids_[0..valid] hold the current sequence's prefix states
  for (size_t i = 0; i < n; ++i) {
    const std::span<const Symbol> sym = symbols_of(i);
    size_t d = std::min<size_t>(lcp_of(i), valid);
    if (ids_.size() < sym.size() + 1) ids_.resize(sym.size() + 1);
    bool dead = d < sym.size() && !advanceable(ids_[d]);
    while (!dead && d < sym.size()) {
      ids_[d + 1] = next(arena, ids_[d], sym[d]);
      valid = ++d;
      dead = d < sym.size() && !advanceable(ids_[d]);
    }
    valid = d;
    result(i, d, !dead && !interned_[ids_[d]].empty());
    if (dead) {  // every following sequence sharing these d symbols dies at d as well
      if (const std::optional<size_t> to = skip(i, d)) {
        i = *to - 1;
        continue;
      }
      while (i + 1 < n && lcp_of(i + 1) >= d && symbols_of(i + 1).size() > d) {
        ++i;
        result(i, d, false);
      }
    }
  }
}

}  // namespace k3::structured
