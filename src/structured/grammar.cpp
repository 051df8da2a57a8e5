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
        out += " " + (e.kind == Element::Kind::rule ? names_[e.index] : describe_set(sets_[e.index]));
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

  const size_t n = names_.size();
  // Nullable and productive rules, to a fixpoint.
  std::vector<bool> nullable(n, false), productive(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r)
      for (const auto& alt : alts_[r]) {
        bool all_null = true, all_prod = true;
        for (const Item& it : alt) {
          if (it.kind == Element::Kind::symbols) all_null = false;
          else {
            all_null = all_null && nullable[it.rule];
            all_prod = all_prod && productive[it.rule];
          }
        }
        if (all_null && !nullable[r]) nullable[r] = changed = true;
        if (all_prod && !productive[r]) productive[r] = changed = true;
      }
  }
  for (size_t r = 0; r < n; ++r)
    if (!productive[r]) throw core::Error("grammar: rule '" + names_[r] + "' can never be completed");
  // Left recursion: a cycle in "r can start with s" (through nullable prefixes).
  std::vector<std::vector<uint32_t>> starts(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : alts_[r])
      for (const Item& it : alt) {
        if (it.kind == Element::Kind::symbols) break;
        starts[r].push_back(it.rule);
        if (!nullable[it.rule]) break;
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
        else {
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
