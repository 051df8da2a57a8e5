// tokenizer/utf8.h: UTF-8 validation, replacement-character decoding and the few Unicode facts
// the tokenizer needs (Python's str.isspace, for Kimi's input chunking).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace k3::tokenizer::utf8 {

inline constexpr size_t kValid = static_cast<size_t>(-1);

// Byte offset of the first ill-formed byte of `s` (overlong forms, surrogates, code points above
// U+10FFFF and truncated sequences are ill-formed), or kValid when all of `s` is well-formed.
size_t first_invalid(std::string_view s);
inline bool is_valid(std::string_view s) { return first_invalid(s) == kValid; }

// Length in bytes of the well-formed sequence starting at s[i], 0 when it is ill-formed, or
// -n when it is a well-formed but incomplete prefix of n bytes that ends at the end of `s`.
int sequence_length(std::string_view s, size_t i);

// Appends `bytes` to `out` as well-formed UTF-8: each maximal ill-formed subpart becomes one
// U+FFFD (the Unicode "substitution of maximal subparts" practice, as Python's 'replace').
// With final == false a well-formed but incomplete sequence at the end is not consumed, so a
// stream can wait for the rest of a character. Returns the number of bytes consumed.
size_t append_replacing(std::string_view bytes, bool final, std::string& out);

// Decodes the code point at s[i] of well-formed `s`; sets `len` to its byte length.
char32_t decode(std::string_view s, size_t i, int& len);

// Python's str.isspace() for one code point (bidi class WS/B/S or category Zs).
bool is_python_space(char32_t cp);

}  // namespace k3::tokenizer::utf8
