// tokenizer/detokenizer.h: streaming token ids -> text that never emits broken UTF-8: bytes of
// a character split across tokens are held until the character completes.
#pragma once
#include <cstdint>
#include <string>

#include "tokenizer/tokenizer.h"

namespace k3::tokenizer {

// One per generated sequence. push() returns the text that became final with this token:
// every complete character so far, with ill-formed bytes (which no later byte can repair)
// replaced by U+FFFD; an incomplete trailing character (at most 3 bytes) is held back.
// finish() flushes the held bytes (an incomplete tail becomes one U+FFFD). The concatenation
// of all outputs equals Tokenizer::decode of all ids. Special tokens contribute their text,
// or nothing when skip_special is set and their "special" flag is true.
class IncrementalDetokenizer {
 public:
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}

  std::string push(int32_t id);  // throws core::Error for an id outside the vocabulary
  std::string finish();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // incomplete UTF-8 tail, < 4 bytes
};

}  // namespace k3::tokenizer
