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
inline constexpr int32_t kMinK3Vocab = 256 + Tokenizer::kReservedSpecialSlots;

struct K3Vocab {
  std::vector<std::pair<std::string, int32_t>> ranks;  // ids 0 .. vocab_size - 257
  std::vector<SpecialToken> specials;                  // the named K3 slots (k3_tokens.h)
  int32_t first_special = 0;                           // = vocab_size - 256
};

// K3's layout over learned tokens (learn_bpe order): ranks 0 .. vocab_size - 257 are the first
// tokens (when there are too few, "token + byte" extensions in rank order fill the rest), the
// top 256 ids are K3's special slots. Throws core::Error if vocab_size < kMinK3Vocab.
K3Vocab k3_vocab(std::vector<std::string> tokens, int32_t vocab_size);

// vocab_size ids: k3_vocab over BPE learned on a built-in English/code/Chinese text.
K3Vocab build_tiny_vocab(int32_t vocab_size);

// Writes DIR/tiktoken.model and DIR/tokenizer_config.json (bos "[BOS]", eos "[EOS]", pad "[PAD]",
// unk "[UNK]", the added tokens; `note` goes to "k3serve_note"), creating DIR.
void write_k3_tokenizer(const K3Vocab& vocab, const std::filesystem::path& dir, std::string_view note);

// write_k3_tokenizer(build_tiny_vocab(vocab_size)). For vocab_size < kMinK3Vocab no tokenizer fits: any tokenizer files
// left in DIR are removed and false is returned (the checkpoint then has no tokenizer).
bool write_tiny_tokenizer(int32_t vocab_size, const std::filesystem::path& dir);

}  // namespace k3::tokenizer
