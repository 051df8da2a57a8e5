// tokenizer/pretokenizer.h: the regex split that runs before BPE, on PCRE2 (UTF + UCP, JIT when
// the library has it). Patterns are given in tiktoken's (Rust regex) syntax and translated.
#pragma once
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace k3::tokenizer {

// Rewrites a tiktoken / Rust-regex pattern into PCRE2 syntax with the same meaning:
//  * `\s` / `\S` become Unicode White_Space classes (Rust's definition; PCRE2's own `\s` also
//    takes U+180E), inside classes too;
//  * a bare script name such as `\p{Han}` becomes `\p{sc:Han}`: Rust reads it as the Script
//    property, PCRE2 >= 10.40 as Script_Extensions (which would add CJK punctuation like 、);
//  * a class intersection `[A&&[^B]]` becomes `(?:(?![B])[A])`.
// Anything else is passed through. Throws core::Error for constructs it cannot translate
// (`\S` inside a class, an intersection of any other shape).
std::string translate_pattern_for_pcre2(std::string_view pattern);

class Pretokenizer {
 public:
  // `pattern` in tiktoken syntax; throws core::Error naming the pattern and PCRE2's message
  // (with the offset) when it does not compile.
  explicit Pretokenizer(std::string_view pattern);
  ~Pretokenizer();
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Finds the leftmost match in `text` at or after byte `from`: true and [begin, end) set, or
  // false when there is none. `text` must be valid UTF-8 (not checked again) and `from` on a
  // character boundary. `$` and lookaheads see the end of `text`, not of any larger string.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end) const;
  // Every match left to right. Like tiktoken's find_iter, characters that no alternative
  // matches are skipped.
  std::vector<std::string> split(std::string_view text) const;

  const std::string& pattern() const { return pattern_; }
  const std::string& pcre2_pattern() const { return pcre2_pattern_; }
  bool jit() const { return jit_; }

 private:
  struct Code;
  std::string pattern_, pcre2_pattern_;
  std::unique_ptr<Code> code_;
  bool jit_ = false;
};

}  // namespace k3::tokenizer
