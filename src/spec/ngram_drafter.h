// spec/ngram_drafter.h: prompt-lookup drafting (vLLM's "ngram" method) over each request's own
// context (prompt ++ output).
//
// For n = max..min, take the last n tokens (the suffix); find the most recent EARLIER occurrence
// of it (ending before the suffix does) and propose the tokens that followed it, up to
// max_drafts (fewer when the context ends first). The longest n with a match wins; among
// matches of that n the most recent wins. No match: no drafts (the step decodes plainly).
//
// Cost: an index per request, per n, from the hash of each n-gram to the end of its latest
// occurrence, updated incrementally as tokens are appended (O(max - min + 1) per new token), so a
// proposal is O(max) lookups plus a check of the candidate's tokens (hash collisions fall back to
// a backward scan, O(context * max)). A context that is not an extension of the indexed one
// (a new request under a reused id) is re-indexed.
#pragma once
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "spec/drafter.h"

namespace k3::spec {

class NgramDrafter final : public Drafter {
 public:
  NgramDrafter(int32_t min_n = 1, int32_t max_n = 4);

  std::string name() const override { return "ngram"; }
  void propose(std::span<const DraftQuery> batch, std::span<Draft> out) override;
  void release(RequestId id) override { index_.erase(id); }

  // The proposal for one context, with no index (the reference the indexed path is tested
  // against): the following tokens of the longest, most recent earlier match.
  static std::vector<int32_t> lookup(std::span<const int32_t> tokens, int32_t min_n, int32_t max_n, int32_t max_drafts);

  size_t num_indexed() const { return index_.size(); }

 private:
  struct Index {
    std::vector<int32_t> tokens;  // the context indexed so far (to detect a changed context)
    // Per n (slot n - min_n): n-gram hash -> end position (exclusive) of its latest occurrence.
    std::vector<std::unordered_map<uint64_t, int64_t>> latest;
  };
  void extend(Index& ix, std::span<const int32_t> tokens) const;
  std::vector<int32_t> propose_one(const DraftQuery& q);

  int32_t min_n_, max_n_;
  std::unordered_map<RequestId, Index> index_;
};

}  // namespace k3::spec
