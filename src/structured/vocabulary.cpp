#include "structured/vocabulary.h"

#include <algorithm>

#include "core/error.h"

namespace k3::structured {

Vocabulary::Vocabulary(int32_t size, const std::vector<std::pair<int32_t, Token>>& tokens,
                       std::vector<std::string> special_names, std::vector<int32_t> end_tokens)
    : size_(size), special_names_(std::move(special_names)), end_tokens_(std::move(end_tokens)) {
  K3_CHECK(size > 0, "Vocabulary: empty");
  K3_CHECK(special_names_.size() < 0xFFFF - kFirstSpecial, "Vocabulary: too many special tokens");
  for (size_t i = 0; i < special_names_.size(); ++i)
    special_index_.emplace(special_names_[i], static_cast<Symbol>(kFirstSpecial + i));
  std::vector<std::vector<Symbol>> per_id(static_cast<size_t>(size));
  for (const auto& [id, t] : tokens) {
    K3_CHECK(id >= 0 && id < size, "Vocabulary: token id " + std::to_string(id) + " outside the vocabulary");
    std::vector<Symbol>& s = per_id[static_cast<size_t>(id)];
    if (t.special >= 0) {
      K3_CHECK(static_cast<size_t>(t.special) < special_names_.size(), "Vocabulary: unknown special index");
      s = {static_cast<Symbol>(kFirstSpecial + t.special)};
    } else {
      K3_CHECK(t.bytes.size() < 0xFFFF, "Vocabulary: token longer than 65535 bytes");
      for (char c : t.bytes) s.push_back(static_cast<uint8_t>(c));
    }
  }
  for (int32_t e : end_tokens_) K3_CHECK(e >= 0 && e < size, "Vocabulary: end token outside the vocabulary");
  offsets_.reserve(static_cast<size_t>(size) + 1);
  offsets_.push_back(0);
  for (int32_t id = 0; id < size; ++id) {
    const auto& s = per_id[static_cast<size_t>(id)];
    // End tokens are allowed by the grammar's end, never as text; a token that is one of them
    // carries no symbols.
    if (!s.empty() && std::find(end_tokens_.begin(), end_tokens_.end(), id) == end_tokens_.end()) {
      symbols_.insert(symbols_.end(), s.begin(), s.end());
      order_.push_back(id);
      max_symbols_ = std::max(max_symbols_, s.size());
    }
    offsets_.push_back(static_cast<uint32_t>(symbols_.size()));
  }
  std::sort(order_.begin(), order_.end(), [&](int32_t a, int32_t b) {
    const auto x = symbols(a), y = symbols(b);
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end());
  });
  lcp_.assign(order_.size(), 0);
  for (size_t i = 1; i < order_.size(); ++i) {
    const auto x = symbols(order_[i - 1]), y = symbols(order_[i]);
    size_t k = 0;
    while (k < x.size() && k < y.size() && x[k] == y[k]) ++k;
    lcp_[i] = static_cast<uint16_t>(k);
  }
  // lcp_min_[k][p]: the least lcp over [p, p + 2^k), for next_sharing_less.
  lcp_min_.push_back(lcp_);
  for (size_t w = 1; 2 * w <= lcp_.size(); w *= 2) {
    const std::vector<uint16_t>& prev = lcp_min_.back();
    std::vector<uint16_t> level(lcp_.size() - 2 * w + 1);
    for (size_t p = 0; p < level.size(); ++p) level[p] = std::min(prev[p], prev[p + w]);
    lcp_min_.push_back(std::move(level));
  }
}

size_t Vocabulary::next_sharing_less(size_t i, size_t depth) const {
  size_t p = i + 1;
  for (size_t k = lcp_min_.size(); k-- > 0;)  // skip the longest runs of lcp >= depth first
    if (p < lcp_min_[k].size() && lcp_min_[k][p] >= depth) p += size_t{1} << k;
  return std::min(p, lcp_.size());
}

std::span<const Symbol> Vocabulary::symbols(int32_t id) const {
  if (id < 0 || id >= size_) return {};
  return std::span(symbols_).subspan(offsets_[static_cast<size_t>(id)],
                                     offsets_[static_cast<size_t>(id) + 1] - offsets_[static_cast<size_t>(id)]);
}

std::optional<Symbol> Vocabulary::special(std::string_view name) const {
  const auto at = special_index_.find(std::string(name));
  if (at == special_index_.end()) return std::nullopt;
  return at->second;
}

}  // namespace k3::structured
