// tokenizer/utf8.cpp: UTF-8 well-formedness per Unicode table 3-7 and replacement decoding.
#include "tokenizer/utf8.h"

namespace k3::tokenizer::utf8 {

namespace {

// Expected total length of a sequence from its lead byte (0: not a valid lead byte), and the
// allowed range of the second byte (table 3-7 excludes overlongs, surrogates and > U+10FFFF).
struct Lead {
  int length;
  unsigned char lo, hi;
};

Lead lead_of(unsigned char b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if ((b >= 0xE1 && b <= 0xEC) || b == 0xEE || b == 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

}  // namespace

int sequence_length(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  const Lead lead = lead_of(b0);
  if (lead.length <= 1) return lead.length;
  for (int k = 1; k < lead.length; ++k) {
    if (i + k >= s.size()) return -k;  // well-formed so far, cut off by the end of `s`
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
    if (b < lo || b > hi) return 0;
  }
  return lead.length;
}

size_t first_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {  // ASCII fast path
      ++i;
      continue;
    }
    const int n = sequence_length(s, i);
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return kValid;
}

size_t append_replacing(std::string_view bytes, bool final, std::string& out) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  size_t i = 0;
  size_t run = 0;  // start of the well-formed run not yet appended
  while (i < bytes.size()) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {  // ASCII: extend the run
      ++i;
      continue;
    }
    const int n = sequence_length(bytes, i);
    if (n > 0) {
      i += static_cast<size_t>(n);
      continue;
    }
    out.append(bytes.substr(run, i - run));
    if (n < 0 && !final) {
      return i;  // incomplete tail: wait for more bytes
    } else {
      // Ill-formed: the maximal subpart is the lead plus the continuation bytes that were
      // still acceptable (at least one byte), replaced by a single U+FFFD.
      out.append(kReplacement);
      i += n < 0 ? static_cast<size_t>(-n) : 1;
      if (n == 0) {
        // Skip the acceptable continuation bytes that followed a valid lead.
        const Lead lead = lead_of(static_cast<unsigned char>(bytes[i - 1]));
        for (int k = 1; lead.length > 1 && k < lead.length && i < bytes.size(); ++k) {
          const auto b = static_cast<unsigned char>(bytes[i]);
          const unsigned char lo = k == 1 ? lead.lo : 0x80, hi = k == 1 ? lead.hi : 0xBF;
          if (b < lo || b > hi) break;
          ++i;
        }
      }
    }
    run = i;
  }
  out.append(bytes.substr(run, i - run));
  return i;
}

char32_t decode(std::string_view s, size_t i, int& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return b0;
  }
  len = lead_of(b0).length;
  char32_t cp = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace k3::tokenizer::utf8
