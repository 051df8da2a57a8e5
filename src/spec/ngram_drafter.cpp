// spec/ngram_drafter.cpp: NgramDrafter.
#include "spec/ngram_drafter.h"

#include <algorithm>

#include "core/error.h"

namespace k3::spec {

namespace {
// Hash of tokens[end - n, end) (FNV-1a over the ids, then a final mix).
uint64_t ngram_hash(std::span<const int32_t> tokens, int64_t end, int32_t n) {
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  for (int64_t i = end - n; i < end; ++i) {
    h ^= static_cast<uint32_t>(tokens[static_cast<size_t>(i)]);
    h *= 1099511628211ull;
  }
  h ^= h >> 29;
  h *= 0xbf58476d1ce4e5b9ull;
  return h ^ (h >> 32);
}

bool same_ngram(std::span<const int32_t> t, int64_t end_a, int64_t end_b, int32_t n) {
  for (int32_t i = 1; i <= n; ++i)
    if (t[static_cast<size_t>(end_a - i)] != t[static_cast<size_t>(end_b - i)]) return false;
  return true;
}

std::vector<int32_t> following(std::span<const int32_t> t, int64_t end, int32_t max_drafts) {
  const int64_t stop = std::min<int64_t>(static_cast<int64_t>(t.size()), end + max_drafts);
  return {t.begin() + end, t.begin() + stop};
}
}  // namespace

NgramDrafter::NgramDrafter(int32_t min_n, int32_t max_n) : min_n_(min_n), max_n_(max_n) {
  K3_CHECK(min_n >= 1 && max_n >= min_n,
           "NgramDrafter: need 1 <= min_n <= max_n, got " + std::to_string(min_n) + ".." + std::to_string(max_n));
}

std::vector<int32_t> NgramDrafter::lookup(std::span<const int32_t> t, int32_t min_n, int32_t max_n,
                                          int32_t max_drafts) {
  const auto N = static_cast<int64_t>(t.size());
  if (max_drafts <= 0) return {};
  // One backward scan: for each earlier end e (e <= N-1, so a token follows it), the length of
  // the common suffix of t[0, e) and t[0, N), capped at max_n. The first e reaching a length
  // beats every later (smaller e) one of the same length: most recent wins.
  int32_t best_len = 0;
  int64_t best_end = -1;
  for (int64_t e = N - 1; e >= min_n; --e) {
    int32_t len = 0;
    while (len < max_n && e - len - 1 >= 0 &&
           t[static_cast<size_t>(e - len - 1)] == t[static_cast<size_t>(N - len - 1)])
      ++len;
    if (len >= min_n && len > best_len) {
      best_len = len;
      best_end = e;
      if (len == max_n) break;
    }
  }
  return best_end < 0 ? std::vector<int32_t>{} : following(t, best_end, max_drafts);
}

void NgramDrafter::extend(Index& ix, std::span<const int32_t> prefix) const {
  // Every n-gram ending at e <= ix.tokens.size() is indexed; index the ends up to prefix.size().
  const bool continues = !ix.latest.empty() && ix.tokens.size() <= prefix.size() &&
                         std::equal(ix.tokens.begin(), ix.tokens.end(), prefix.begin());
  if (!continues) {
    ix.tokens.clear();
    ix.latest.assign(static_cast<size_t>(max_n_ - min_n_ + 1), {});
  }
  const auto old_size = static_cast<int64_t>(ix.tokens.size()), size = static_cast<int64_t>(prefix.size());
  for (int64_t e = old_size + 1; e <= size; ++e)
    for (int32_t n = min_n_; n <= max_n_ && n <= e; ++n)
      ix.latest[static_cast<size_t>(n - min_n_)][ngram_hash(prefix, e, n)] = e;  // later e overwrites: most recent
  ix.tokens.insert(ix.tokens.end(), prefix.begin() + old_size, prefix.end());
}

std::vector<int32_t> NgramDrafter::propose_one(const DraftQuery& q) {
  const std::span<const int32_t> t = q.tokens;
  const auto N = static_cast<int64_t>(t.size());
  if (q.max_drafts <= 0 || N < 2) return {};
  Index& ix = index_[q.id];
  // Earlier occurrences end at e <= N-1 (a token must follow them): index t[0, N-1).
  extend(ix, t.first(static_cast<size_t>(N - 1)));
  for (auto n = static_cast<int32_t>(std::min<int64_t>(max_n_, N - 1)); n >= min_n_; --n) {
    const auto& map = ix.latest[static_cast<size_t>(n - min_n_)];
    const auto it = map.find(ngram_hash(t, N, n));
    if (it == map.end()) continue;
    if (same_ngram(t, it->second, N, n)) return following(t, it->second, q.max_drafts);
    return lookup(t, min_n_, max_n_, q.max_drafts);  // a hash collision: answer exactly by scanning
  }
  return {};
}

void NgramDrafter::propose(std::span<const DraftQuery> batch, std::span<Draft> out) {
  K3_CHECK(out.size() == batch.size(), "NgramDrafter::propose: out has " + std::to_string(out.size()) +
                                           " entries for " + std::to_string(batch.size()) + " queries");
  for (size_t i = 0; i < batch.size(); ++i) {
    out[i].clear();
    out[i].tokens = propose_one(batch[i]);
  }
}

}  // namespace k3::spec
