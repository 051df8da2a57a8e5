// tokenizer/pretokenizer.cpp: tiktoken-syntax -> PCRE2 pattern translation and the PCRE2 matcher.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pretokenizer.h"

#include <pcre2.h>

#include <array>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {

namespace {

// Unicode White_Space (what Rust's `\s` means), as PCRE2 class items.
constexpr std::string_view kWhiteSpace =
    R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

constexpr std::array<std::string_view, 38> kGeneralCategories = {
    "L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",  "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe",
    "Pi", "Pf", "Po", "S",  "Sm", "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp", "C",  "Cc", "Cf", "Cs", "Co", "Cn", "Any"};

[[noreturn]] void unsupported(std::string_view pattern, size_t at, std::string_view what) {
  throw core::Error("split pattern: " + std::string(what) + " at offset " + std::to_string(at) +
                    " cannot be translated for PCRE2 (pattern: " + std::string(pattern) + ")");
}

// Translates the escape at p[i] ('\\'), appending to `out`; returns the index after it.
size_t translate_escape(std::string_view p, size_t i, bool in_class, std::string& out) {
  if (i + 1 >= p.size()) unsupported(p, i, "a trailing backslash");
  const char c = p[i + 1];
  if (c == 's') {
    out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
    return i + 2;
  }
  if (c == 'S') {
    if (in_class) unsupported(p, i, "\\S inside a character class");
    out += "[^" + std::string(kWhiteSpace) + "]";
    return i + 2;
  }
  if ((c == 'p' || c == 'P') && i + 2 < p.size() && p[i + 2] == '{') {
    const size_t close = p.find('}', i + 3);
    if (close == std::string_view::npos) unsupported(p, i, "an unterminated \\p{");
    const std::string_view name = p.substr(i + 3, close - i - 3);
    bool is_category = name.find_first_of(":=") != std::string_view::npos;
    for (std::string_view gc : kGeneralCategories) is_category = is_category || name == gc;
    out += std::string("\\") + c + "{" + (is_category ? "" : "sc:") + std::string(name) + "}";
    return close + 1;
  }
  out += p.substr(i, 2);
  return i + 2;
}

// Index of the ']' that closes the class opened at p[open] (Rust syntax: nested classes nest,
// a ']' first in the class is literal).
size_t class_end(std::string_view p, size_t open) {
  size_t k = open + 1;
  if (k < p.size() && p[k] == '^') ++k;
  if (k < p.size() && p[k] == ']') ++k;
  int depth = 1;
  for (; k < p.size(); ++k) {
    if (p[k] == '\\') {
      ++k;
    } else if (p[k] == '[') {
      ++depth;
    } else if (p[k] == ']' && --depth == 0) {
      return k;
    }
  }
  unsupported(p, open, "an unterminated character class");
}

// Body of a class without nested classes: escapes translated, the rest copied.
std::string class_body(std::string_view p, size_t begin, size_t end) {
  std::string out;
  for (size_t k = begin; k < end;) {
    if (p[k] == '\\') {
      k = translate_escape(p, k, true, out);
    } else {
      if (p[k] == '[') unsupported(p, k, "a nested character class");
      out += p[k++];
    }
  }
  return out;
}

// Translates the class p[open..close]; handles the intersection form [A&&[^B]].
std::string translate_class(std::string_view p, size_t open, size_t close) {
  for (size_t k = open + 1; k + 1 < close; ++k) {
    if (p[k] == '\\') {
      ++k;
      continue;
    }
    if (p[k] != '&' || p[k + 1] != '&') continue;
    const size_t inner = k + 2;
    if (p[open + 1] == '^' || inner + 1 >= close || p[inner] != '[' || p[inner + 1] != '^' ||
        class_end(p, inner) != close - 1)
      unsupported(p, k, "a class intersection other than [A&&[^B]]");
    std::string out = "(?:(?![";
    out += class_body(p, inner + 2, close - 1);
    out += "])[";
    out += class_body(p, open + 1, k);
    out += "])";
    return out;
  }
  std::string out = "[";
  out += class_body(p, open + 1, close);
  out += ']';
  return out;
}

}  // namespace

std::string translate_pattern_for_pcre2(std::string_view p) {
  std::string out;
  for (size_t i = 0; i < p.size();) {
    if (p[i] == '\\') {
      i = translate_escape(p, i, false, out);
    } else if (p[i] == '[') {
      const size_t close = class_end(p, i);
      out += translate_class(p, i, close);
      i = close + 1;
    } else {
      out += p[i++];
    }
  }
  return out;
}

struct Pretokenizer::Code {
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

namespace {

// Per-thread match state: match data for one pair (no captures are used), a match context
// with a JIT stack big enough for long runs (a 25k-character word recurses per character in
// the lookahead form of the Kimi pattern) and a generous heap limit for the interpreter.
struct Scratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr);
  Scratch() {
    if (stack) pcre2_jit_stack_assign(context, nullptr, stack);
    pcre2_set_heap_limit(context, 1024 * 1024);  // KiB: 1 GiB
  }
  ~Scratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return reinterpret_cast<const char*>(buf.data());
}

}  // namespace

Pretokenizer::Pretokenizer(std::string_view pattern)
    : pattern_(pattern), pcre2_pattern_(translate_pattern_for_pcre2(pattern)), code_(std::make_unique<Code>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pcre2_pattern_.data()), pcre2_pattern_.size(),
                              PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (!code_->code)
    throw core::Error("split pattern does not compile: " + pcre2_message(error) + " at offset " +
                      std::to_string(offset) + " of the PCRE2 form '" + pcre2_pattern_ + "' (published form: '" +
                      pattern_ + "')");
  jit_ = pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() = default;
Pretokenizer::Pretokenizer(Pretokenizer&&) noexcept = default;
Pretokenizer& Pretokenizer::operator=(Pretokenizer&&) noexcept = default;

bool Pretokenizer::find(std::string_view text, size_t from, size_t& begin, size_t& end) const {
  thread_local Scratch scratch;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit_ ? pcre2_jit_match(code_->code, subject, text.size(), from, 0, scratch.data, scratch.context)
                : PCRE2_ERROR_JIT_STACKLIMIT;
  if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // no JIT, or a run too long for its stack
    rc = pcre2_match(code_->code, subject, text.size(), from, PCRE2_NO_UTF_CHECK, scratch.data, scratch.context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    throw core::Error("split pattern: matching a text of " + std::to_string(text.size()) +
                      " bytes failed: " + pcre2_message(rc));
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
  begin = ov[0];
  end = ov[1];
  return true;
}

std::vector<std::string> Pretokenizer::split(std::string_view text) const {
  std::vector<std::string> pieces;
  size_t pos = 0, begin = 0, end = 0;
  while (pos < text.size() && find(text, pos, begin, end)) {
    if (end == begin) {  // an empty match: step over one character
      int len = 1;
      utf8::decode(text, begin, len);
      pos = begin + static_cast<size_t>(len);
      continue;
    }
    pieces.emplace_back(text.substr(begin, end - begin));
    pos = end;
  }
  return pieces;
}

}  // namespace k3::tokenizer
