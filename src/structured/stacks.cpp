#include "structured/stacks.h"

#include <algorithm>

#include "core/error.h"

namespace k3::structured {

StackArena::StackArena(const Grammar& g) : g_(g) {
  nodes_.push_back({0, 0});  // kComplete
  nodes_.push_back({0, 0});  // kEscaped
}

StackId StackArena::node(uint32_t pos, StackId parent) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  auto [at, fresh] = index_.try_emplace(key, static_cast<StackId>(nodes_.size()));
  if (fresh) nodes_.push_back({pos, parent});
  return at->second;
}

void StackArena::expand(uint32_t pos, StackId parent, State& out) {
  if (!seen_.insert((uint64_t{pos} << 32) | parent).second) return;
  const Element& e = g_.element(pos);
  switch (e.kind) {
    case Element::Kind::symbols: out.push_back(node(pos, parent)); return;
    case Element::Kind::rule: {
      const uint32_t ret = pos + 1;
      const StackId p = g_.element(ret).kind == Element::Kind::end ? parent : node(ret, parent);
      for (uint32_t alt : g_.alternatives(e.index)) expand(alt, p, out);
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
    expand(n.pos, n.parent, out);
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
  for (uint32_t alt : g_.alternatives(g_.root())) expand(alt, kNoParent, s);
  finish(s);
  return s;
}

void StackArena::advance(const State& from, Symbol symbol, State& out) {
  out.clear();
  begin_round();
  for (StackId s : from) {
    if (s <= kEscaped) continue;
    const Node n = nodes_[s];
    if (g_.set(g_.element(n.pos).index).contains(symbol)) expand(n.pos + 1, n.parent, out);
  }
  finish(out);
}

}  // namespace k3::structured
