#include "structured/utf8_ranges.h"

#include <algorithm>
#include <string>

#include "core/error.h"

namespace k3::structured {

CodepointRanges normalize(CodepointRanges ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges merged;
  for (auto [lo, hi] : ranges) {
    if (lo > hi) continue;
    hi = std::min(hi, kMaxCodepoint);
    if (!merged.empty() && lo <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, hi);
    else merged.push_back({lo, hi});
  }
  if (!negate) return merged;
  CodepointRanges out;
  uint32_t next = 0;
  for (auto [lo, hi] : merged) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.push_back({next, kMaxCodepoint});
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  K3_CHECK(cp <= kMaxCodepoint && (cp < 0xD800 || cp > 0xDFFF), "append_utf8: not a scalar value");
  if (cp < 0x80) out += static_cast<char>(cp);
  else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

int encoded_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

// [lo, hi] of one encoded length, split until every byte position ranges independently.
void split(uint32_t lo, uint32_t hi, std::vector<ByteRangeSeq>& out) {
  const int len = encoded_length(lo);
  for (int i = 1; i < len; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        split(lo, lo | m, out);
        split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        split(lo, (hi & ~m) - 1, out);
        split(hi & ~m, hi, out);
        return;
      }
    }
  }
  std::string a, b;
  append_utf8(lo, a);
  append_utf8(hi, b);
  ByteRangeSeq seq;
  for (size_t k = 0; k < a.size(); ++k) seq.push_back({static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k])});
  out.push_back(std::move(seq));
}

}  // namespace

std::vector<ByteRangeSeq> utf8_sequences(const CodepointRanges& normalized) {
  static constexpr std::pair<uint32_t, uint32_t> kPieces[] = {
      {0, 0x7F}, {0x80, 0x7FF}, {0x800, 0xD7FF}, {0xE000, 0xFFFF}, {0x10000, 0x10FFFF}};
  std::vector<ByteRangeSeq> out;
  for (auto [lo, hi] : normalized)
    for (auto [plo, phi] : kPieces) {
      const uint32_t a = std::max(lo, plo), b = std::min(hi, phi);
      if (a <= b) split(a, b, out);
    }
  return out;
}

}  // namespace k3::structured
