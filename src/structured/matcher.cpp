#include "structured/matcher.h"

#include <algorithm>

#include "core/error.h"

namespace k3::structured {

Matcher::Matcher(std::shared_ptr<const CompiledGrammar> grammar, int max_rollback)
    : grammar_(std::move(grammar)), arena_(grammar_->grammar()), max_rollback_(max_rollback) {
  K3_CHECK(max_rollback >= 0, "Matcher: max_rollback must be >= 0");
  push(arena_.initial(), false);
}

void Matcher::push(State s, bool terminated) {
  history_.push_back({std::move(s), terminated});
  while (static_cast<int>(history_.size()) > max_rollback_ + 1) history_.pop_front();
}

bool Matcher::can_end() const { return !terminated() && !state().empty() && state()[0] == kComplete; }

bool Matcher::accept_symbols(std::span<const Symbol> symbols) {
  if (terminated() || symbols.empty()) return false;
  arena_.advance(state(), symbols[0], scratch_[0]);
  int cur = 0;
  for (size_t i = 1; i < symbols.size() && !scratch_[cur].empty(); ++i) {
    arena_.advance(scratch_[cur], symbols[i], scratch_[cur ^ 1]);
    cur ^= 1;
  }
  if (scratch_[cur].empty()) return false;
  push(scratch_[cur], false);
  return true;
}

bool Matcher::accept_text(std::string_view bytes) {
  std::vector<Symbol> s(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) s[i] = static_cast<uint8_t>(bytes[i]);
  return accept_symbols(s);
}

bool Matcher::accept(int32_t token) {
  const Vocabulary& v = grammar_->vocabulary();
  if (terminated()) return false;
  const auto& ends = v.end_tokens();
  if (std::find(ends.begin(), ends.end(), token) != ends.end()) {
    if (!can_end()) return false;
    push(state(), true);
    return true;
  }
  return accept_symbols(v.symbols(token));
}

void Matcher::rollback(int tokens) {
  if (tokens < 0 || tokens > rollback_depth())
    throw core::Error("Matcher: cannot roll back " + std::to_string(tokens) + " tokens (history holds " +
                      std::to_string(rollback_depth()) + ")");
  for (int i = 0; i < tokens; ++i) history_.pop_back();
}

const GroupMask& Matcher::group_mask(const std::vector<uint32_t>& key) {
  LocalKey k;
  K3_CHECK(key.size() <= k.words.size(), "Matcher: a chain key longer than its frames allow");
  std::copy(key.begin(), key.end(), k.words.begin());
  auto [at, fresh] = masks_.try_emplace(k);
  if (fresh) at->second = grammar_->group_mask(key);  // the shared cache (thread-safe)
  return *at->second;
}

void Matcher::fill_mask(std::span<uint32_t> words) {
  const Vocabulary& v = grammar_->vocabulary();
  K3_CHECK(static_cast<int32_t>(words.size()) == v.words(), "Matcher::fill_mask: mask row has the wrong width");
  std::fill(words.begin(), words.end(), 0u);
  if (terminated()) return;
  auto set = [&](int32_t id) { words[static_cast<size_t>(id) >> 5] |= 1u << (id & 31); };
  // Each stack's chain of its top kGroupDepth frames decides its tokens, but for those that
  // return into the ancestor below the chain: those are checked against what really follows it.
  for (StackId id : state()) {
    if (id <= kEscaped) continue;
    const StackId ancestor = grammar_->chain_key(arena_, id, key_);
    const GroupMask& m = group_mask(key_);
    if (!m.dense.empty())
      for (size_t w = 0; w < words.size(); ++w) words[w] |= m.dense[w];
    else if (m.base) {  // the far chain's tokens less those that run out of room
      const std::vector<uint32_t>& base = m.base->dense;
      size_t k = 0;
      for (size_t w = 0; w < words.size(); ++w) {
        uint32_t x = base[w];
        for (; k < m.removed.size() && static_cast<size_t>(m.removed[k]) >> 5 == w; ++k)
          x &= ~(1u << (m.removed[k] & 31));
        words[w] |= x;
      }
    } else
      for (int32_t t : m.ids) set(t);
    if (m.uncertain.empty() || ancestor == kNoParent) continue;  // after the root nothing may follow
    const State after = arena_.after_return(ancestor);
    walk_.run(
        arena_, after, m.uncertain.size(),
        [&](size_t i) { return v.symbols(m.uncertain[i].token).subspan(m.uncertain[i].consumed); },
        [&](size_t i) { return m.uncertain_lcp[i]; },
        [&](size_t i, size_t, bool alive) {
          if (alive) set(m.uncertain[i].token);
        });
  }
  if (can_end())
    for (int32_t id : v.end_tokens()) set(id);
}

}  // namespace k3::structured
