// structured/structured_test_util.h: a small vocabulary shaped like a real BPE one (every byte, words,
// JSON punctuation runs, tokens spanning a string's end, K3's special markers, an end token) and a
// reference mask: each token tried on its own copy of the matcher.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "structured/ebnf.h"
#include "structured/matcher.h"

namespace k3::structured::testing {

inline const std::vector<std::string>& special_names() {
  static const std::vector<std::string> names = {"<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"};
  return names;
}

// Ids: 0..255 the bytes; then words; then the specials; the last id is the end token
// (<|end_of_msg|>), and one unused id (a hole) before it.
inline std::shared_ptr<const Vocabulary> small_vocabulary(uint64_t seed = 7, int random_tokens = 400) {
  std::vector<std::pair<int32_t, Vocabulary::Token>> tokens;
  int32_t id = 0;
  for (int b = 0; b < 256; ++b) tokens.push_back({id++, {std::string(1, static_cast<char>(b)), -1}});
  const char* words[] = {"{",   "}",    "{\"",  "\"}",  "\":",      "\",",  "\": \"", "\"",   "true", "false", "null",
                         "123", "0.5",  "-1",   "e+10", " ",        "  ",   "\n",     "\n  ", "abc",  "name",  "type",
                         "\"a", "a\"",  "\"\"", "[]",   "[{",       "}]",   "},",     ",\"",  "\\n",  "\\\"",  "\\u00",
                         "é",   "ü\"",  "日本", "\xe6", "\xe6\x97", "call", "tool",   "json", "=\"",  "\">",   "x",
                         "xx",  "xxxx", "yes",  "no",   "1",        "12",   "2026",   "-",    ":",    "T",     "Z"};
  for (const char* w : words) tokens.push_back({id++, {w, -1}});
  core::Rng rng(seed);
  const std::string alphabet = "ab{}[]\":, 0123456789.-e\\ntuflsrx";
  for (int i = 0; i < random_tokens; ++i) {
    std::string t;
    const int len = 1 + static_cast<int>(rng.next_u64() % 6);
    for (int k = 0; k < len; ++k) t += alphabet[rng.next_u64() % alphabet.size()];
    tokens.push_back({id++, {t, -1}});
  }
  for (int s = 0; s < 3; ++s) tokens.push_back({id++, {"", s}});
  ++id;  // a hole: an id with no token
  const int32_t end = id++;
  tokens.push_back({end, {"", 3}});
  return std::make_shared<const Vocabulary>(id, tokens, special_names(), std::vector<int32_t>{end});
}

inline std::shared_ptr<const CompiledGrammar> compile(const std::string& ebnf,
                                                      std::shared_ptr<const Vocabulary> vocab) {
  auto resolver = [vocab](std::string_view name) { return vocab->special(name); };
  return std::make_shared<const CompiledGrammar>(parse_ebnf(ebnf, resolver), vocab);
}

// The id of a special token.
inline int32_t special_token(const Vocabulary& v, std::string_view name) {
  const Symbol s = *v.special(name);
  for (int32_t t = 0; t < v.size(); ++t)
    if (v.symbols(t).size() == 1 && v.symbols(t)[0] == s) return t;
  return -1;
}

// Bit t set when a copy of `m` accepts token t.
inline std::vector<uint32_t> reference_mask(const Matcher& m) {
  const Vocabulary& v = m.grammar().vocabulary();
  std::vector<uint32_t> words(static_cast<size_t>(v.words()), 0);
  for (int32_t t = 0; t < v.size(); ++t) {
    Matcher c = m;
    if (c.accept(t)) words[static_cast<size_t>(t) >> 5] |= 1u << (t & 31);
  }
  return words;
}

inline std::vector<int32_t> allowed(const std::vector<uint32_t>& words) {
  std::vector<int32_t> ids;
  for (size_t w = 0; w < words.size(); ++w)
    for (int b = 0; b < 32; ++b)
      if (words[w] >> b & 1) ids.push_back(static_cast<int32_t>(w * 32 + b));
  return ids;
}

}  // namespace k3::structured::testing
