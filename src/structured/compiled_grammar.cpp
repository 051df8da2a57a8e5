#include "structured/compiled_grammar.h"

#include <algorithm>
#include <deque>
#include <future>
#include <unordered_set>

#include "core/error.h"

namespace k3::structured {

namespace {

// A walk's state returned past the chain into its unknown ancestor (markers sort first: kComplete,
// then kEscaped).
bool escaped(const State& s) { return (!s.empty() && s[0] == kEscaped) || (s.size() > 1 && s[1] == kEscaped); }

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar grammar, std::shared_ptr<const Vocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  K3_CHECK(vocabulary_ != nullptr, "CompiledGrammar: no vocabulary");
  horizon_ = static_cast<uint32_t>(vocabulary_->max_symbols()) + 1;
}

uint32_t CompiledGrammar::canonical_count(const Repeat& r, uint32_t count) const {
  if (count < r.min) return r.min - count >= horizon_ ? r.min - horizon_ : count;
  if (r.max == kUnbounded || r.max - count >= horizon_) return r.min;
  return count;
}

std::shared_ptr<const GroupMask> CompiledGrammar::group_mask(std::span<const uint32_t> key) const {
  const std::string k(reinterpret_cast<const char*>(key.data()), key.size_bytes());
  std::optional<std::promise<std::shared_ptr<const GroupMask>>> mine;  // made only on a miss
  std::shared_future<std::shared_ptr<const GroupMask>> theirs;
  {
    std::lock_guard lock(mu_);
    auto [at, fresh] = cache_.try_emplace(k);
    if (!fresh) {
      if (at->second.mask) return at->second.mask;  // made
      theirs = at->second.pending;                  // being made by another row: wait for it
    } else {
      mine.emplace();
      at->second.pending = mine->get_future().share();
    }
  }
  if (theirs.valid()) return theirs.get();
  // The walk runs outside the lock, so rows of a batch that reach different new chains compute
  // them at once (the engine fills a step's masks on several threads).
  try {
    bool shared = false;  // the far chain's masks themselves: held (and counted) already
    std::shared_ptr<const GroupMask> mask = make(key, shared);
    const int64_t bytes = shared ? 0
                                 : static_cast<int64_t>(mask->dense.size() * sizeof(uint32_t) +
                                                        (mask->ids.size() + mask->removed.size()) * sizeof(int32_t) +
                                                        mask->uncertain.size() *
                                                            (sizeof(GroupMask::Uncertain) + sizeof(uint16_t)));
    {
      std::lock_guard lock(mu_);
      cached_bytes_ += bytes;
      Entry& e = cache_.at(k);
      e.mask = mask;
      e.pending = {};  // waiters hold their own copies
    }
    mine->set_value(mask);
    return mask;
  } catch (...) {
    mine->set_exception(std::current_exception());  // whoever waits sees the error too
    std::lock_guard lock(mu_);
    cache_.erase(k);  // a later call tries again
    throw;
  }
}

size_t CompiledGrammar::cached_groups() const {
  std::lock_guard lock(mu_);
  return cache_.size();
}

int64_t CompiledGrammar::cached_bytes() const {
  std::lock_guard lock(mu_);
  return cached_bytes_;
}

StackId CompiledGrammar::chain_key(const StackArena& arena, StackId s, std::vector<uint32_t>& key) const {
  key.clear();
  key.push_back(0);
  StackId n = s, ancestor = kNoParent;
  for (int d = 0; d < kGroupDepth; ++d) {
    const uint32_t pos = arena.pos(n);
    key.push_back(pos);
    const Element& e = grammar_.element(pos);
    if (e.kind == Element::Kind::repeat) key.push_back(canonical_count(grammar_.repeat(e.index), arena.count(n)));
    key[0] = static_cast<uint32_t>(key.size() - 1);
    ancestor = arena.parent(n);
    if (ancestor == kNoParent) break;
    n = ancestor;
  }
  return ancestor;
}

size_t CompiledGrammar::warm(const std::atomic<bool>& stop, size_t max_chains, int64_t max_bytes) const {
  StackArena arena(grammar_);
  const auto depth_of = [&](StackId s) {
    int d = 0;
    for (; s > kEscaped && d <= kWarmMaxDepth; s = arena.parent(s)) ++d;
    return d;
  };
  std::deque<StackId> queue;
  std::unordered_set<StackId> seen;
  std::unordered_set<std::string> chains;
  const auto visit = [&](const State& state) {
    for (StackId s : state)
      if (s > kEscaped && seen.size() < kWarmMaxStacks && depth_of(s) <= kWarmMaxDepth && seen.insert(s).second)
        queue.push_back(s);
  };
  visit(arena.initial());
  std::vector<uint32_t> key;
  State one(1), next;
  while (!queue.empty() && chains.size() < max_chains && !stop.load(std::memory_order_relaxed) &&
         cached_bytes() < max_bytes) {
    const StackId s = queue.front();
    queue.pop_front();
    chain_key(arena, s, key);
    if (chains.insert(std::string(reinterpret_cast<const char*>(key.data()), key.size() * sizeof(uint32_t))).second)
      group_mask(key);  // computed now, or found made
    // Its successors: one advance per symbol its top element takes.
    const SymbolSet& set = grammar_.set(grammar_.element(arena.pos(s)).index);
    one[0] = s;
    for (int b = 0; b < 256; ++b)
      if (set.bytes[static_cast<size_t>(b) >> 6] >> (b & 63) & 1) {
        arena.advance(one, static_cast<Symbol>(b), next);
        visit(next);
      }
    for (Symbol sp : set.specials) {
      arena.advance(one, sp, next);
      visit(next);
    }
  }
  return chains.size();
}

State CompiledGrammar::chains_of(StackArena& arena, std::span<const uint32_t> key) const {
  State start;
  std::vector<std::pair<uint32_t, uint32_t>> frames;     // (position, count), top first
  for (size_t i = 0; i < key.size(); i += key[i] + 1) {  // each chain rebuilt over an unknown ancestor
    frames.clear();
    for (size_t j = i + 1; j <= i + key[i]; ++j) {
      const bool counted = grammar_.element(key[j]).kind == Element::Kind::repeat;
      frames.push_back({key[j], counted ? key[j + 1] : 0});
      if (counted) ++j;
    }
    StackId s = kUnknownParent;
    for (auto f = frames.rbegin(); f != frames.rend(); ++f) s = arena.node(f->first, s, f->second);
    start.push_back(s);
  }
  std::sort(start.begin(), start.end());
  start.erase(std::unique(start.begin(), start.end()), start.end());
  return start;
}

size_t CompiledGrammar::near_max_entry(std::span<const uint32_t> key) const {
  if (key.empty() || key[0] + 1 != key.size()) return 0;
  for (size_t j = 1; j < key.size(); ++j) {
    const Element& e = grammar_.element(key[j]);
    if (e.kind != Element::Kind::repeat) continue;
    const Repeat& r = grammar_.repeat(e.index);
    const uint32_t count = key[++j];
    if (r.max != kUnbounded && count >= r.min && r.max - count < horizon_ && r.max - r.min >= horizon_) return j;
  }
  return 0;
}

std::shared_ptr<const GroupMask> CompiledGrammar::make(std::span<const uint32_t> key, bool& shared) const {
  const size_t entry = near_max_entry(key);
  if (!entry) return std::make_shared<const GroupMask>(compute(key));
  const Repeat& r = grammar_.repeat(grammar_.element(key[entry - 1]).index);
  const uint32_t room = r.max - key[entry];
  std::vector<uint32_t> far_key(key.begin(), key.end());
  far_key[entry] = r.min;  // canonical for every count with H or more room
  std::shared_ptr<const GroupMask> far = group_mask(far_key);
  shared = room > far->longest;  // none of its tokens is long enough to run out of room
  if (shared) return far;
  return std::make_shared<const GroupMask>(derive_near_max(key, room, far));
}

GroupMask CompiledGrammar::derive_near_max(std::span<const uint32_t> key, uint32_t room,
                                           const std::shared_ptr<const GroupMask>& far) const {
  const Vocabulary& v = *vocabulary_;
  const auto is_long = [&](int32_t t) { return v.symbols(t).size() >= room; };
  std::vector<int32_t> far_ids;  // sorted, when the far chain's are an id list
  if (far->dense.empty()) {
    far_ids = far->ids;
    std::sort(far_ids.begin(), far_ids.end());
  }
  const auto accepted_far = [&](int32_t t) {
    if (!far->dense.empty()) return (far->dense[static_cast<size_t>(t) >> 5] >> (t & 31) & 1) != 0;
    return std::binary_search(far_ids.begin(), far_ids.end(), t);
  };
  // The far chain's long tokens (accepted or uncertain: this chain's are among them), in walk order.
  std::vector<int32_t> longs;
  if (!far->dense.empty()) {
    for (int32_t t : v.order())
      if (is_long(t) && accepted_far(t)) longs.push_back(t);
  } else {
    for (int32_t t : far->ids)
      if (is_long(t)) longs.push_back(t);
  }
  for (const auto& u : far->uncertain)
    if (is_long(u.token)) longs.push_back(u.token);
  const auto before = [&](int32_t a, int32_t b) {
    const auto x = v.symbols(a), y = v.symbols(b);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  };
  std::sort(longs.begin(), longs.end(), before);
  longs.erase(std::unique(longs.begin(), longs.end()), longs.end());
  std::vector<uint16_t> longs_lcp(longs.size(), 0);
  for (size_t i = 1; i < longs.size(); ++i) {
    const auto x = v.symbols(longs[i - 1]), y = v.symbols(longs[i]);
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
    longs_lcp[i] = static_cast<uint16_t>(k);
  }

  GroupMask m;
  m.longest = far->longest;
  for (const auto& u : far->uncertain)
    if (!is_long(u.token)) m.uncertain.push_back(u);
  StackArena arena(grammar_);
  PrefixWalk walk;
  walk.run(
      arena, chains_of(arena, key), longs.size(), [&](size_t i) { return v.symbols(longs[i]); },
      [&](size_t i) { return longs_lcp[i]; },
      [&](size_t i, size_t consumed, bool alive) {
        const int32_t id = longs[i];
        if (alive) return;
        if (accepted_far(id)) m.removed.push_back(id);
        const size_t len = v.symbols(id).size();
        for (size_t e = 1; e <= consumed && e < len; ++e) {
          if (escaped(walk.depth_state(e))) m.uncertain.push_back({id, static_cast<uint16_t>(e)});
        }
      });
  std::sort(m.removed.begin(), m.removed.end());
  m.accepted_count = far->accepted_count - static_cast<int64_t>(m.removed.size());
  if (!far->dense.empty()) m.base = far;
  else {  // an id list: the far one's less the refused
    for (int32_t t : far->ids)
      if (!std::binary_search(m.removed.begin(), m.removed.end(), t)) m.ids.push_back(t);
    m.removed.clear();
  }
  finish_uncertain(m);
  return m;
}

GroupMask CompiledGrammar::compute(std::span<const uint32_t> key) const {
  const Vocabulary& v = *vocabulary_;
  StackArena arena(grammar_);
  const State start = chains_of(arena, key);

  GroupMask m;
  std::vector<int32_t> accepted;
  const auto& order = v.order();
  const auto& lcp = v.lcp();
  PrefixWalk walk;
  auto escaped_at = [&](size_t depth) { return escaped(walk.depth_state(depth)); };
  walk.run(
      arena, start, order.size(), [&](size_t i) { return v.symbols(order[i]); }, [&](size_t i) { return lcp[i]; },
      [&](size_t i, size_t consumed, bool alive) {
        const int32_t id = order[i];
        if (alive) {
          accepted.push_back(id);
          return;
        }
        const size_t len = v.symbols(id).size();
        for (size_t e = 1; e <= consumed && e < len; ++e)
          if (escaped_at(e)) m.uncertain.push_back({id, static_cast<uint16_t>(e)});
      },
      [&](size_t i, size_t dead_at) -> std::optional<size_t> {
        // The tokens sharing the dead prefix are refused, and uncertain only where the prefix
        // escaped the chain: without an escape there is nothing to record, so jump past them.
        for (size_t e = 1; e <= dead_at; ++e)
          if (escaped_at(e)) return std::nullopt;
        return v.next_sharing_less(i, dead_at);
      });

  m.accepted_count = static_cast<int64_t>(accepted.size());
  for (int32_t id : accepted) m.longest = std::max(m.longest, static_cast<uint32_t>(v.symbols(id).size()));
  for (const auto& u : m.uncertain) m.longest = std::max(m.longest, static_cast<uint32_t>(v.symbols(u.token).size()));
  if (accepted.size() * 64 > static_cast<size_t>(v.size())) {
    m.dense.assign(static_cast<size_t>(v.words()), 0);
    for (int32_t id : accepted) m.dense[static_cast<size_t>(id) >> 5] |= 1u << (id & 31);
  } else {
    m.ids = std::move(accepted);
  }
  finish_uncertain(m);
  return m;
}

void CompiledGrammar::finish_uncertain(GroupMask& m) const {
  const Vocabulary& v = *vocabulary_;
  auto suffix = [&](const GroupMask::Uncertain& u) { return v.symbols(u.token).subspan(u.consumed); };
  std::sort(m.uncertain.begin(), m.uncertain.end(), [&](const auto& a, const auto& b) {
    const auto x = suffix(a), y = suffix(b);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  });
  m.uncertain_lcp.assign(m.uncertain.size(), 0);
  for (size_t i = 1; i < m.uncertain.size(); ++i) {
    const auto x = suffix(m.uncertain[i - 1]), y = suffix(m.uncertain[i]);
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
    m.uncertain_lcp[i] = static_cast<uint16_t>(k);
  }
}

uint32_t PrefixWalk::intern(const State& s) {
  std::string key(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(StackId));
  auto [at, fresh] = index_.try_emplace(std::move(key), static_cast<uint32_t>(interned_.size()));
  if (fresh) interned_.push_back(s);
  return at->second;
}

uint32_t PrefixWalk::next(StackArena& arena, uint32_t from, Symbol symbol) {
  const uint64_t key = (uint64_t{from} << 16) | symbol;
  if (auto at = next_.find(key); at != next_.end()) return at->second;
  arena.advance(interned_[from], symbol, scratch_);
  const uint32_t to = intern(scratch_);
  next_.emplace(key, to);
  return to;
}

}  // namespace k3::structured
