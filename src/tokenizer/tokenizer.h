// tokenizer/tokenizer.h: a tiktoken-format byte-level BPE tokenizer: rank file ("base64(token
// bytes) rank" per line), a pre-tokenizer split pattern, and special tokens; K3's shipping form
// (tiktoken.model + tokenizer_config.json) and OpenAI's rank files load through the same code.
#pragma once
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/bpe.h"
#include "tokenizer/pretokenizer.h"

namespace k3::tokenizer {

struct SpecialToken {
  std::string text;
  int32_t id = 0;
  bool special = true;  // tokenizer_config "special": decode(skip_special = true) drops it
};

// Whether special-token text inside the input becomes the special token (allow) or is encoded
// as ordinary text (deny: tiktoken's disallowed_special=(), e.g. for user content).
enum class Specials : uint8_t { allow, deny };

struct TokenizerOptions {
  std::string split_pattern;  // tiktoken (Rust regex) syntax, see split_patterns.h
  // Kimi's encode(): the text is cut into 400,000-character chunks, and a run of more than
  // 25,000 consecutive whitespace or non-whitespace characters (Python str.isspace) is cut;
  // each piece is encoded on its own (this changes the ids of such long runs).
  bool kimi_chunking = false;
};

class Tokenizer {
 public:
  // Number of special-token slots K3 reserves after the ranks; unnamed ones are called
  // "<|reserved_token_{id}|>" (K3: ids 163584..163839).
  static constexpr int32_t kReservedSpecialSlots = 256;

  // `ranks`: token bytes and rank; every single byte must be present, bytes and ranks unique.
  // `specials`: ids unique, not colliding with a rank, texts unique and non-empty.
  Tokenizer(std::vector<std::pair<std::string, int32_t>> ranks, std::vector<SpecialToken> specials,
            TokenizerOptions options);

  // Reads a tiktoken rank file; errors name the file and line (bad base64, a bad or duplicate
  // rank, duplicate token bytes).
  static std::vector<std::pair<std::string, int32_t>> read_tiktoken_file(const std::filesystem::path& file);
  // K3 / Kimi folder: DIR/tiktoken.model, DIR/tokenizer_config.json ("added_tokens_decoder":
  // {id: {content, special}}, bos/eos/pad/unk_token), the Kimi split pattern and chunking.
  static Tokenizer load_k3(const std::filesystem::path& dir);

  // Throws core::Error when `text` is not valid UTF-8 (naming the byte offset).
  std::vector<int32_t> encode(std::string_view text, Specials specials = Specials::deny) const;
  void encode_append(std::string_view text, Specials specials, std::vector<int32_t>& out) const;

  // Token bytes joined; ill-formed UTF-8 becomes U+FFFD (like Python's errors="replace").
  // Unknown ids throw core::Error.
  std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string decode_bytes(std::span<const int32_t> ids, bool skip_special = false) const;
  std::string_view token_bytes(int32_t id) const;  // throws for an unknown id

  bool is_special(int32_t id) const;    // any special-token id (flag or not)
  bool is_skippable(int32_t id) const;  // special with special == true
  std::optional<int32_t> special_id(std::string_view text) const;
  int32_t special_id_or_throw(std::string_view text) const;
  const std::vector<SpecialToken>& specials() const { return specials_; }

  int32_t vocab_size() const { return static_cast<int32_t>(spans_.size()); }  // max id + 1
  int32_t num_ranks() const { return static_cast<int32_t>(table_.size()); }
  std::optional<int32_t> bos_id, eos_id, pad_id, unk_id;  // from tokenizer_config.json

  const Pretokenizer& pretokenizer() const { return *pretokenizer_; }
  const TokenizerOptions& options() const { return options_; }

 private:
  void encode_chunk(std::string_view text, Specials specials, std::vector<int32_t>& out) const;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;
  // Leftmost special token in text[from..) (longest at that position): start and index.
  bool find_special(std::string_view text, size_t from, size_t& at, size_t& which) const;

  TokenizerOptions options_;
  std::unique_ptr<Pretokenizer> pretokenizer_;
  RankTable table_;
  int32_t byte_rank_[256];
  std::vector<SpecialToken> specials_;  // sorted longest text first (for find_special)
  bool special_first_byte_[256] = {};
  struct Span {
    uint32_t offset, length;  // in token_bytes_; length UINT32_MAX: unused id
  };
  std::string token_bytes_;          // all tokens' bytes
  std::vector<Span> spans_;          // [vocab_size]
  std::vector<uint8_t> token_kind_;  // [vocab_size] 0 unused, 1 rank, 2 special, 3 skippable special
};

}  // namespace k3::tokenizer
