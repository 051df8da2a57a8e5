// structured/utf8_ranges.h: a set of Unicode code points as the UTF-8 byte sequences that encode
// exactly them (each sequence a run of byte ranges), so a byte-level automaton can match a
// character class. Surrogates (U+D800..U+DFFF) are never encoded.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace k3::structured {

using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;  // inclusive [lo, hi]
inline constexpr uint32_t kMaxCodepoint = 0x10FFFF;

// Sorted, merged ranges; `negate` complements them over [0, kMaxCodepoint].
CodepointRanges normalize(CodepointRanges ranges, bool negate);

// One byte sequence: byte i of the encoding lies in [seq[i].first, seq[i].second].
using ByteRangeSeq = std::vector<std::pair<uint8_t, uint8_t>>;
std::vector<ByteRangeSeq> utf8_sequences(const CodepointRanges& normalized);

// The UTF-8 encoding of one code point (no surrogates, <= kMaxCodepoint).
void append_utf8(uint32_t cp, std::string& out);

}  // namespace k3::structured
