// tokenizer/tiny_tokenizer.h: the small K3-format tokenizer that make-checkpoint writes beside
// the bundled model, so the tiny model serves text end to end. Deterministic: the same
// vocab_size always gives byte-identical files.
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace k3::tokenizer {

// Smallest vocabulary that holds the 256 byte tokens and K3's 256 special slots.
inline constexpr int32_t kMinTinyVocab = 256 + Tokenizer::kReservedSpecialSlots;

struct TinyVocab {
  std::vector<std::pair<std::string, int32_t>> ranks;  // ids 0 .. vocab_size - 257
  std::vector<SpecialToken> specials;                  // the named K3 slots (k3_tokens.h)
  int32_t first_special = 0;                           // = vocab_size - 256
};

// vocab_size ids: 256 single bytes (rank = byte value), then merges learned by byte-pair
// counting over a built-in English/code/Chinese text (most frequent pair first, ties to the
// lowest ranks), then, if the text runs out of pairs, "token + byte" extensions in rank order;
// the top 256 ids are K3's special slots. Throws core::Error if vocab_size < kMinTinyVocab.
TinyVocab build_tiny_vocab(int32_t vocab_size);

// Writes DIR/tiktoken.model and DIR/tokenizer_config.json (bos "[BOS]", eos "[EOS]", pad
// "[PAD]", unk "[UNK]"). For vocab_size < kMinTinyVocab no tokenizer fits: any tokenizer files
// left in DIR are removed and false is returned (the checkpoint then has no tokenizer).
bool write_tiny_tokenizer(int32_t vocab_size, const std::filesystem::path& dir);

}  // namespace k3::tokenizer
