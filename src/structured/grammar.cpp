#include "structured/grammar.h"

#include <algorithm>
#include <cstdio>
#include <map>

#include "core/error.h"

namespace k3::structured {

bool SymbolSet::contains(Symbol s) const {
  if (s < kFirstSpecial) return (bytes[s >> 6] >> (s & 63)) & 1;
  return std::binary_search(specials.begin(), specials.end(), s);
}

void SymbolSet::add(Symbol s) {
  if (s < kFirstSpecial) {
    bytes[s >> 6] |= uint64_t{1} << (s & 63);
    return;
  }
  auto at = std::lower_bound(specials.begin(), specials.end(), s);
  if (at == specials.end() || *at != s) specials.insert(at, s);
}

void SymbolSet::add_byte_range(uint8_t lo, uint8_t hi) {
  for (int b = lo; b <= hi; ++b) add(static_cast<Symbol>(b));
}

bool SymbolSet::empty() const { return specials.empty() && !(bytes[0] | bytes[1] | bytes[2] | bytes[3]); }

namespace {

std::string describe_set(const SymbolSet& s) {
  std::string out = "[";
  auto put = [&](int b) {
    if (b >= 0x21 && b < 0x7f && b != ']' && b != '\\' && b != '-' && b != '^') out += static_cast<char>(b);
    else {
      char buf[8];
      snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    }
  };
  for (int b = 0; b < 256;) {
    if (!s.contains(static_cast<Symbol>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && s.contains(static_cast<Symbol>(e + 1))) ++e;
    put(b);
    if (e > b) {
      out += '-';
      put(e);
    }
    b = e + 1;
  }
  for (Symbol sp : s.specials) out += "<special " + std::to_string(sp - kFirstSpecial) + ">";
  return out + "]";
}

}  // namespace

std::string Grammar::describe() const {
  std::string out;
  for (uint32_t r = 0; r < rules_.size(); ++r) {
    out += names_[r] + " ::=";
    for (size_t a = 0; a < rules_[r].size(); ++a) {
      if (a) out += " |";
      for (uint32_t p = rules_[r][a]; elements_[p].kind != Element::Kind::end; ++p) {
        const Element& e = elements_[p];
        if (e.kind == Element::Kind::rule) out += " " + names_[e.index];
        else if (e.kind == Element::Kind::symbols) out += " " + describe_set(sets_[e.index]);
        else {
          const Repeat& r = repeats_[e.index];
          out += " " + names_[r.body] + "{" + std::to_string(r.min) + "," +
                 (r.max == kUnbounded ? "" : std::to_string(r.max)) + "}";
        }
      }
      if (elements_[rules_[r][a]].kind == Element::Kind::end) out += " \"\"";
    }
    out += "\n";
  }
  return out;
}

uint32_t GrammarBuilder::rule(const std::string& name) {
  auto [at, fresh] = index_.try_emplace(name, static_cast<uint32_t>(names_.size()));
  if (!fresh) return at->second;
  names_.push_back(name);
  defined_.push_back(false);
  alts_.emplace_back();
  return static_cast<uint32_t>(names_.size() - 1);
}

uint32_t GrammarBuilder::fresh_rule(const std::string& base) {
  const uint32_t id = static_cast<uint32_t>(names_.size());
  names_.push_back(base + "#" + std::to_string(id));  // "#" is never in a written name
  index_.emplace(names_.back(), id);
  defined_.push_back(false);
  alts_.emplace_back();
  return id;
}

void GrammarBuilder::add_alternative(uint32_t rule, const std::vector<Item>& items) {
  K3_CHECK(rule < alts_.size(), "GrammarBuilder: unknown rule");
  items_ += items.size() + 1;
  if (items_ > kMaxElements)
    throw core::Error("grammar too large: more than " + std::to_string(kMaxElements) +
                      " elements (a repetition bound or a schema too big to compile)");
  defined_[rule] = true;
  alts_[rule].push_back(items);
}

GrammarBuilder::Item GrammarBuilder::repeat(const Item& x, int64_t min, int64_t max) {
  if (min > kMaxRepeat || max > kMaxRepeat)
    throw core::Error("grammar: repetition bound above " + std::to_string(kMaxRepeat));
  if (max >= 0 && max < min) throw core::Error("grammar: repetition {m,n} with n < m");
  uint32_t body = x.rule;
  if (x.kind != Element::Kind::rule) {  // the body is a rule: each iteration returns into the count
    body = fresh_rule("rep");
    add_alternative(body, {x});
  }
  Item it{Element::Kind::repeat, {}, body};
  it.min = static_cast<uint32_t>(min);
  it.max = max < 0 ? kUnbounded : static_cast<uint32_t>(max);
  return it;
}

GrammarBuilder::Item GrammarBuilder::star(const Item& x) {
  const uint32_t r = fresh_rule("star");
  add_alternative(r, {x, rule_item(r)});
  add_alternative(r, {});
  return rule_item(r);
}

GrammarBuilder::Item GrammarBuilder::unrolled_exact(const Item& x, int64_t m) {
  const uint32_t r = fresh_rule("exact");
  if (m <= 2 * kBlock) add_alternative(r, std::vector<Item>(static_cast<size_t>(m), x));
  else add_alternative(r, {unrolled_exact(unrolled_exact(x, kBlock), m / kBlock), unrolled_exact(x, m % kBlock)});
  return rule_item(r);
}

// x{0,k} with q = k / kBlock and y = x{kBlock}: y{0,q-1} x{0,kBlock-1} | y{q} x{0,k % kBlock}
// (below q blocks any remainder fits; exactly q blocks leave at most k % kBlock).
GrammarBuilder::Item GrammarBuilder::unrolled_upto(const Item& x, int64_t k) {
  uint32_t r = fresh_rule("upto");
  if (k == 0) {
    add_alternative(r, {});
  } else if (k <= 2 * kBlock) {
    add_alternative(r, {x});
    add_alternative(r, {});
    for (int64_t i = 2; i <= k; ++i) {  // x{0,i} ::= x x{0,i-1} | ""
      const uint32_t t = fresh_rule("upto");
      add_alternative(t, {x, rule_item(r)});
      add_alternative(t, {});
      r = t;
    }
  } else {
    const Item block = unrolled_exact(x, kBlock);
    const int64_t q = k / kBlock;
    add_alternative(r, {unrolled_upto(block, q - 1), unrolled_upto(x, kBlock - 1)});
    add_alternative(r, {unrolled_exact(block, q), unrolled_upto(x, k % kBlock)});
  }
  return rule_item(r);
}

Grammar GrammarBuilder::build(const std::string& root) {
  Grammar g;
  bool found_root = false;
  for (uint32_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == root) {
      g.root_ = i;
      found_root = true;
    }
    if (!defined_[i]) throw core::Error("grammar: rule '" + names_[i] + "' is used but never defined");
    for (const auto& alt : alts_[i])
      for (const Item& it : alt)
        if (it.kind == Element::Kind::symbols && it.set.empty())
          throw core::Error("grammar: rule '" + names_[i] + "' has a character class that matches nothing");
  }
  if (!found_root) throw core::Error("grammar: no '" + root + "' rule");

  // Nullable and productive rules, to a fixpoint; then a repeat whose body is nullable becomes
  // rules (its iterations could read nothing, which the stack's count does not allow), and again.
  std::vector<bool> nullable, productive;
  const auto item_nullable = [&](const Item& it) {
    if (it.kind == Element::Kind::symbols) return false;
    return (it.kind == Element::Kind::repeat && it.min == 0) || nullable[it.rule];
  };
  const auto item_productive = [&](const Item& it) {
    if (it.kind == Element::Kind::symbols) return true;
    return (it.kind == Element::Kind::repeat && it.min == 0) || productive[it.rule];
  };
  for (bool rewritten = true; rewritten;) {
    const size_t rules = names_.size();
    nullable.assign(rules, false);
    productive.assign(rules, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < rules; ++r)
        for (const auto& alt : alts_[r]) {
          bool all_null = true, all_prod = true;
          for (const Item& it : alt) {
            all_null = all_null && item_nullable(it);
            all_prod = all_prod && item_productive(it);
          }
          if (all_null && !nullable[r]) nullable[r] = changed = true;
          if (all_prod && !productive[r]) productive[r] = changed = true;
        }
    }
    rewritten = false;
    for (size_t r = 0; r < rules; ++r)
      for (size_t a = 0; a < alts_[r].size(); ++a)
        for (size_t i = 0; i < alts_[r][a].size(); ++i) {
          const Item it = alts_[r][a][i];
          if (it.kind != Element::Kind::repeat || !nullable[it.rule]) continue;
          const Item body = rule_item(it.rule);  // x{m,n} = x{0,n} when x may be empty
          alts_[r][a][i] = it.max == kUnbounded ? star(body) : unrolled_upto(body, it.max);
          rewritten = true;
        }
  }
  const size_t n = names_.size();
  for (size_t r = 0; r < n; ++r)
    if (!productive[r]) throw core::Error("grammar: rule '" + names_[r] + "' can never be completed");
  // Left recursion: a cycle in "r can start with s" (through nullable prefixes).
  std::vector<std::vector<uint32_t>> starts(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : alts_[r])
      for (const Item& it : alt) {
        if (it.kind == Element::Kind::symbols) break;
        starts[r].push_back(it.rule);
        if (!item_nullable(it)) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<uint32_t, size_t>> path;
  for (uint32_t s = 0; s < n; ++s) {
    if (color[s]) continue;
    path.push_back({s, 0});
    color[s] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == starts[r].size()) {
        color[r] = 2;
        path.pop_back();
        continue;
      }
      const uint32_t t = starts[r][next++];
      if (color[t] == 1) throw core::Error("grammar: rule '" + names_[t] + "' is left-recursive");
      if (!color[t]) {
        color[t] = 1;
        path.push_back({t, 0});
      }
    }
  }

  std::map<std::pair<std::array<uint64_t, 4>, std::vector<Symbol>>, uint32_t> set_ids;
  g.names_ = names_;
  g.rules_.resize(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : alts_[r]) {
      g.rules_[r].push_back(static_cast<uint32_t>(g.elements_.size()));
      for (const Item& it : alt) {
        Element e;
        e.kind = it.kind;
        if (it.kind == Element::Kind::rule) e.index = it.rule;
        else if (it.kind == Element::Kind::repeat) {
          e.index = static_cast<uint32_t>(g.repeats_.size());
          g.repeats_.push_back({it.rule, it.min, it.max});
        } else {
          auto [at, fresh] = set_ids.try_emplace({it.set.bytes, it.set.specials},
                                                 static_cast<uint32_t>(g.sets_.size()));
          if (fresh) g.sets_.push_back(it.set);
          e.index = at->second;
        }
        g.elements_.push_back(e);
      }
      g.elements_.push_back(Element{});
    }
  return g;
}

}  // namespace k3::structured
