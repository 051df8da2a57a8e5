#include "structured/stacks.h"

#include <algorithm>

#include "core/error.h"

namespace k3::structured {

StackArena::StackArena(const Grammar& g) : g_(g) {
  nodes_.push_back({0, 0, 0});  // kComplete
  nodes_.push_back({0, 0, 0});  // kEscaped
}

StackId StackArena::node(uint32_t pos, StackId parent, uint32_t count) {
  auto [at, fresh] = index_.try_emplace(Node{pos, parent, count}, static_cast<StackId>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent, count});
  return at->second;
}

void StackArena::expand(uint32_t pos, StackId parent, uint32_t count, State& out) {
  if (!seen_.insert(Node{pos, parent, count}).second) return;
  const Element& e = g_.element(pos);
  switch (e.kind) {
    case Element::Kind::symbols: out.push_back(node(pos, parent)); return;
    case Element::Kind::rule: {
      const uint32_t ret = pos + 1;
      const StackId p = g_.element(ret).kind == Element::Kind::end ? parent : node(ret, parent);
      for (uint32_t alt : g_.alternatives(e.index)) expand(alt, p, 0, out);
      return;
    }
    case Element::Kind::repeat: {
      const Repeat& r = g_.repeat(e.index);
      if (count < r.max) {  // one more iteration, returning here with the count after it
        const uint32_t next = r.max == kUnbounded && count >= r.min ? count : count + 1;
        const StackId frame = node(pos, parent, next);
        for (uint32_t alt : g_.alternatives(r.body)) expand(alt, frame, 0, out);
      }
      if (count >= r.min) expand(pos + 1, parent, 0, out);  // done: what follows the repeat
      return;
    }
    case Element::Kind::end: expand_return(parent, out); return;
  }
}

void StackArena::expand_return(StackId parent, State& out) {
  if (parent == kNoParent) out.push_back(kComplete);
  else if (parent == kUnknownParent) out.push_back(kEscaped);
  else {
    const Node n = nodes_[parent];
    expand(n.pos, n.parent, n.count, out);
  }
}

void StackArena::finish(State& s) {
  std::sort(s.begin(), s.end());
  s.erase(std::unique(s.begin(), s.end()), s.end());
}

State StackArena::after_return(StackId parent) {
  begin_round();
  State s;
  expand_return(parent, s);
  finish(s);
  return s;
}

State StackArena::initial() {
  begin_round();
  State s;
  for (uint32_t alt : g_.alternatives(g_.root())) expand(alt, kNoParent, 0, s);
  finish(s);
  return s;
}

void StackArena::advance(const State& from, Symbol symbol, State& out) {
  out.clear();
  begin_round();
  for (StackId s : from) {
    if (s <= kEscaped) continue;
    const Node n = nodes_[s];
    if (g_.set(g_.element(n.pos).index).contains(symbol)) expand(n.pos + 1, n.parent, 0, out);
  }
  finish(out);
}

}  // namespace k3::structured
