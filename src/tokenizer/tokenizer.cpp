// tokenizer/tokenizer.cpp: encode (specials, Kimi chunking, regex split, BPE) and decode.
#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <map>

#include "core/error.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {

namespace {
constexpr uint32_t kAbsent = UINT32_MAX;
constexpr size_t kKimiMaxChunkChars = 400'000;  // tokenization_kimi.py TIKTOKEN_MAX_ENCODE_CHARS
constexpr size_t kKimiMaxRunChars = 25'000;     // tokenization_kimi.py MAX_NO_WHITESPACES_CHARS

std::string hex_byte(unsigned char b) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[b >> 4] + kDigits[b & 15];
}
}  // namespace

Tokenizer::Tokenizer(std::vector<std::pair<std::string, int32_t>> ranks, std::vector<SpecialToken> specials,
                     TokenizerOptions options)
    : options_(std::move(options)), pretokenizer_(std::make_unique<Pretokenizer>(options_.split_pattern)) {
  K3_CHECK(!ranks.empty(), "tokenizer: no ranks");
  int32_t max_id = -1;
  for (const auto& [bytes, rank] : ranks) max_id = std::max(max_id, rank);
  for (const SpecialToken& s : specials) max_id = std::max(max_id, s.id);
  K3_CHECK(max_id < INT32_MAX / 2, "tokenizer: id " + std::to_string(max_id) + " is too large");
  spans_.assign(static_cast<size_t>(max_id) + 1, Span{0, kAbsent});
  token_kind_.assign(static_cast<size_t>(max_id) + 1, 0);
  auto place = [&](int32_t id, std::string_view bytes, uint8_t kind, const std::string& what) {
    K3_CHECK(id >= 0, "tokenizer: " + what + " has a negative id " + std::to_string(id));
    const auto i = static_cast<size_t>(id);
    K3_CHECK(token_kind_[i] == 0, "tokenizer: id " + std::to_string(id) + " is used twice (" + what + ")");
    token_kind_[i] = kind;
    spans_[i] = {static_cast<uint32_t>(token_bytes_.size()), static_cast<uint32_t>(bytes.size())};
    token_bytes_.append(bytes);
  };
  std::fill(std::begin(byte_rank_), std::end(byte_rank_), kNoRank);
  for (const auto& [bytes, rank] : ranks) {
    K3_CHECK(!bytes.empty(), "tokenizer: rank " + std::to_string(rank) + " has empty token bytes");
    place(rank, bytes, 1, "rank " + std::to_string(rank));
    K3_CHECK(table_.add(bytes, rank), "tokenizer: rank " + std::to_string(rank) + " repeats the token bytes of rank " +
                                          std::to_string(table_.find(bytes)));
    if (bytes.size() == 1) byte_rank_[static_cast<unsigned char>(bytes[0])] = rank;
  }
  for (int b = 0; b < 256; ++b)
    K3_CHECK(byte_rank_[b] != kNoRank, "tokenizer: the single byte " + hex_byte(static_cast<unsigned char>(b)) +
                                           " has no rank; byte-level BPE needs all 256");
  std::map<std::string, int32_t> seen;
  for (const SpecialToken& s : specials) {
    K3_CHECK(!s.text.empty(), "tokenizer: special token id " + std::to_string(s.id) + " has empty text");
    K3_CHECK(seen.emplace(s.text, s.id).second, "tokenizer: special token '" + s.text + "' has two ids (" +
                                                    std::to_string(seen[s.text]) + " and " + std::to_string(s.id) +
                                                    ")");
    place(s.id, s.text, s.special ? 3 : 2, "special token '" + s.text + "'");
    special_first_byte_[static_cast<unsigned char>(s.text[0])] = true;
  }
  specials_ = std::move(specials);
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const SpecialToken& a, const SpecialToken& b) { return a.text.size() > b.text.size(); });
}

bool Tokenizer::find_special(std::string_view text, size_t from, size_t& at, size_t& which) const {
  for (size_t i = from; i < text.size(); ++i) {
    if (!special_first_byte_[static_cast<unsigned char>(text[i])]) continue;
    for (size_t s = 0; s < specials_.size(); ++s) {
      if (text.compare(i, specials_[s].text.size(), specials_[s].text) == 0) {
        at = i;
        which = s;
        return true;
      }
    }
  }
  return false;
}

void Tokenizer::encode_ordinary(std::string_view text, std::vector<int32_t>& out) const {
  size_t pos = 0, begin = 0, end = 0;
  while (pos < text.size() && pretokenizer_->find(text, pos, begin, end)) {
    if (end == begin) {  // empty match: skip a character, as find_iter does
      int len = 1;
      utf8::decode(text, begin, len);
      pos = begin + static_cast<size_t>(len);
      continue;
    }
    const std::string_view piece = text.substr(begin, end - begin);
    const int32_t whole = table_.find(piece);
    if (whole != kNoRank) {
      out.push_back(whole);
    } else {
      byte_pair_encode(table_, byte_rank_, piece, out);
    }
    pos = end;
  }
}

// tiktoken's core encode: the text between special tokens is split and BPE'd on its own.
void Tokenizer::encode_chunk(std::string_view text, Specials specials, std::vector<int32_t>& out) const {
  size_t start = 0;
  while (true) {
    size_t at = text.size(), which = 0;
    const bool found = specials == Specials::allow && find_special(text, start, at, which);
    encode_ordinary(text.substr(start, at - start), out);
    if (!found) return;
    out.push_back(specials_[which].id);
    start = at + specials_[which].text.size();
  }
}

void Tokenizer::encode_append(std::string_view text, Specials specials, std::vector<int32_t>& out) const {
  const size_t bad = utf8::first_invalid(text);
  if (bad != utf8::kValid)
    throw core::Error("tokenizer: input text is not valid UTF-8 (ill-formed byte " +
                      hex_byte(static_cast<unsigned char>(text[bad])) + " at byte offset " + std::to_string(bad) + ")");
  if (!options_.kimi_chunking) return encode_chunk(text, specials, out);
  // Kimi: 400k-character chunks; inside each, a slice is cut where a run of same-class
  // (whitespace or not) characters would exceed 25k characters. Slices are encoded apart.
  size_t chars_in_chunk = 0;
  size_t slice_start = 0, run_length = 0;
  bool run_is_space = false;
  for (size_t i = 0; i <= text.size();) {
    if (i == text.size() || chars_in_chunk == kKimiMaxChunkChars) {
      encode_chunk(text.substr(slice_start, i - slice_start), specials, out);
      if (i == text.size()) break;
      slice_start = i;
      chars_in_chunk = run_length = 0;
    }
    int len = 1;
    const bool space = utf8::is_python_space(utf8::decode(text, i, len));
    if (chars_in_chunk == 0 || space != run_is_space) {
      run_is_space = space;
      run_length = 1;
    } else if (++run_length > kKimiMaxRunChars) {
      encode_chunk(text.substr(slice_start, i - slice_start), specials, out);
      slice_start = i;
      run_length = 1;
    }
    ++chars_in_chunk;
    i += static_cast<size_t>(len);
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, Specials specials) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 4);
  encode_append(text, specials, out);
  return out;
}

std::string_view Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size() || spans_[static_cast<size_t>(id)].length == kAbsent)
    throw core::Error("tokenizer: token id " + std::to_string(id) + " is not in the vocabulary (" +
                      std::to_string(vocab_size()) + " ids)");
  const Span sp = spans_[static_cast<size_t>(id)];
  return std::string_view(token_bytes_).substr(sp.offset, sp.length);
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_kind_[static_cast<size_t>(id)] >= 2;
}
bool Tokenizer::is_skippable(int32_t id) const {
  return id >= 0 && id < vocab_size() && token_kind_[static_cast<size_t>(id)] == 3;
}

std::optional<int32_t> Tokenizer::special_id(std::string_view text) const {
  for (const SpecialToken& s : specials_)
    if (s.text == text) return s.id;
  return std::nullopt;
}

int32_t Tokenizer::special_id_or_throw(std::string_view text) const {
  const auto id = special_id(text);
  K3_CHECK(id.has_value(), "tokenizer: no special token '" + std::string(text) + "' in the vocabulary");
  return *id;
}

std::string Tokenizer::decode_bytes(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  out.reserve(ids.size() * 4);
  for (int32_t id : ids) {
    const auto i = static_cast<size_t>(id);
    if (id < 0 || i >= spans_.size() || spans_[i].length == kAbsent) token_bytes(id);  // throws
    if (skip_special && token_kind_[i] == 3) continue;
    out.append(token_bytes_, spans_[i].offset, spans_[i].length);
  }
  return out;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  const std::string bytes = decode_bytes(ids, skip_special);
  std::string out;
  out.reserve(bytes.size());
  utf8::append_replacing(bytes, true, out);
  return out;
}

}  // namespace k3::tokenizer
