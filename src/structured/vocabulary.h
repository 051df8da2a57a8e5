// structured/vocabulary.h: the model's tokens as grammar symbols, sorted once so a token mask is a
// walk over shared prefixes (structured/token_mask.h).
//
// A normal token is its bytes; a special token is one symbol (kFirstSpecial + its index among
// `special_names`). Ids with no symbols (holes, padding beyond the tokenizer) are never allowed
// under a grammar. `end_tokens` are allowed exactly where the grammar may end (the model's eos and
// end-of-turn ids). Built once per served model and shared by every request.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "structured/grammar.h"

namespace k3::structured {

class Vocabulary {
 public:
  struct Token {
    std::string bytes;  // a normal token's bytes
    int special = -1;   // >= 0: a special token, index into special_names (bytes unused)
  };
  // tokens[id] for id in [0, size); size may exceed the tokenizer's (the model's padded vocab).
  Vocabulary(int32_t size, const std::vector<std::pair<int32_t, Token>>& tokens, std::vector<std::string> special_names,
             std::vector<int32_t> end_tokens);

  int32_t size() const { return size_; }
  int32_t words() const { return (size_ + 31) / 32; }  // one mask row: [words] uint32, bit i%32 of word i/32
  std::span<const Symbol> symbols(int32_t id) const;
  std::optional<Symbol> special(std::string_view name) const;
  const std::vector<int32_t>& end_tokens() const { return end_tokens_; }
  size_t max_symbols() const { return max_symbols_; }  // of the longest token
  // Ids with symbols in lexicographic order of their symbols, and lcp[i]: how many leading
  // symbols order[i] shares with order[i - 1] (lcp[0] = 0).
  const std::vector<int32_t>& order() const { return order_; }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  // The first position after i in order() that shares fewer than `depth` leading symbols with
  // order()[i] (order().size() when none): a walk that dies after `depth` symbols of order()[i]
  // skips to it. O(log size).
  size_t next_sharing_less(size_t i, size_t depth) const;

 private:
  int32_t size_;
  std::vector<Symbol> symbols_;
  std::vector<uint32_t> offsets_;  // [size + 1] into symbols_
  std::vector<std::string> special_names_;
  std::unordered_map<std::string, Symbol> special_index_;
  std::vector<int32_t> end_tokens_;
  std::vector<int32_t> order_;
  std::vector<uint16_t> lcp_;
  std::vector<std::vector<uint16_t>> lcp_min_;  // [log2 size][size - 2^k + 1]: ranges' least lcp
  size_t max_symbols_ = 0;
};

}  // namespace k3::structured
