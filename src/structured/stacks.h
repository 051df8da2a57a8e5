// structured/stacks.h: the pushdown automaton behind a grammar: a state is a set of parse stacks,
// advanced one symbol at a time.
//
// A stack is a node of a persistent linked list: its top position (a `symbols` element waiting for
// the next symbol) and its parent (the node to return to when the rule ends, whose position is the
// element after the rule reference). Nodes are hash-consed, so equal stacks are equal ids and a
// state is a sorted vector of ids; a reference in tail position pushes nothing, so a repetition
// (`x*` lowered to `r ::= x r | ""`) runs in constant stack depth and the arena stays small.
// A `repeat` element's frame also holds its count: the iterations its body has completed (the
// frame is the node at the repeat's own position that the body returns to). Past the minimum of
// an unbounded repeat the count stays at the minimum: further iterations change nothing.
//
// Two ids are markers, not nodes: kComplete (the root rule ended: the grammar may stop here) and
// kEscaped (a rule ended whose caller is unknown: the token-mask walks start inside a rule with an
// unknown parent, kUnknownParent, to precompute what holds whatever the context).
#pragma once
#include <cstdint>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "structured/grammar.h"

namespace k3::structured {

using StackId = uint32_t;
inline constexpr StackId kComplete = 0;  // marker in a state; also the parent "none"
inline constexpr StackId kEscaped = 1;   // marker in a state; also the parent "unknown"
inline constexpr StackId kNoParent = kComplete;
inline constexpr StackId kUnknownParent = kEscaped;
using State = std::vector<StackId>;  // sorted, unique

class StackArena {
 public:
  explicit StackArena(const Grammar& g);
  const Grammar& grammar() const { return g_; }

  StackId node(uint32_t pos, StackId parent, uint32_t count = 0);
  uint32_t pos(StackId s) const { return nodes_[s].pos; }
  StackId parent(StackId s) const { return nodes_[s].parent; }
  uint32_t count(StackId s) const { return nodes_[s].count; }  // a repeat frame's iterations
  size_t size() const { return nodes_.size(); }

  State initial();  // the root rule's alternatives
  // The state after `symbol` (empty: rejected).
  void advance(const State& from, Symbol symbol, State& out);
  // The state that continues once the rule of a stack with parent `parent` ends.
  State after_return(StackId parent);

 private:
  struct Node {
    uint32_t pos;
    StackId parent;
    uint32_t count;
    bool operator==(const Node&) const = default;
  };
  struct NodeHash {
    size_t operator()(const Node& n) const {
      uint64_t h = (uint64_t{n.pos} << 32 | n.parent) * 0x9E3779B97F4A7C15ull;
      return static_cast<size_t>(h ^ (h >> 29) ^ (uint64_t{n.count} * 0xBF58476D1CE4E5B9ull));
    }
  };
  // Adds the stacks for continuing at element `pos` with `parent` (expanding rules and repeats
  // (count: the repeat's iterations so far); a rule end returns to the parent) into out,
  // unsorted; each (pos, parent, count) once per round (seen_), so nullable alternatives that meet
  // again are not expanded twice.
  void expand(uint32_t pos, StackId parent, uint32_t count, State& out);
  void expand_return(StackId parent, State& out);
  void begin_round() { seen_.clear(); }
  static void finish(State& s);

  const Grammar& g_;
  std::vector<Node> nodes_;
  std::unordered_set<Node, NodeHash> seen_;
  std::unordered_map<Node, StackId, NodeHash> index_;
};

}  // namespace k3::structured
