// tokenizer/k3_tokens.h: K3's special tokens: the XTML markers its chat format is built from
// and the layout of the 256 special slots that follow the ranks (K3: ids 163584..163839).
// Sources: K3 tokenizer_config.json as reproduced in public tokenizer ports and fixtures
// (see docs/validation/chat_template.md); spec §10: bos 163584, eos 163586, pad 163839.
#pragma once
#include <string_view>

namespace k3::tokenizer::k3_tokens {

inline constexpr std::string_view kBos = "[BOS]";
inline constexpr std::string_view kEos = "[EOS]";
inline constexpr std::string_view kEndOfMsg = "<|end_of_msg|>";  // config eos_token_id: ends a turn
inline constexpr std::string_view kOpen = "<|open|>";            // <|open|>tag attrs<|sep|>
inline constexpr std::string_view kClose = "<|close|>";          // <|close|>tag<|sep|>
inline constexpr std::string_view kSep = "<|sep|>";
inline constexpr std::string_view kUnk = "[UNK]";
inline constexpr std::string_view kPad = "[PAD]";

struct Slot {
  int offset;  // id - first special id (K3: id - 163584)
  std::string_view text;
};

// Named slots; the others are "<|reserved_token_{id}|>".
inline constexpr Slot kLayout[] = {
    {0, kBos},
    {1, kEos},
    {2, kEndOfMsg},
    {3, kOpen},
    {4, kClose},
    {5, kSep},
    {6, "[start_header_id]"},
    {7, "[end_header_id]"},
    {9, "[EOT]"},
    {18, "<|media_begin|>"},
    {19, "<|media_content|>"},
    {20, "<|media_end|>"},
    {21, "<|media_pad|>"},
    {254, kUnk},
    {255, kPad},
};

}  // namespace k3::tokenizer::k3_tokens
