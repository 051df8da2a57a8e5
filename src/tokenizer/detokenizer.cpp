// tokenizer/detokenizer.cpp: the incremental detokenizer.
#include "tokenizer/detokenizer.h"

#include "tokenizer/utf8.h"

namespace k3::tokenizer {

std::string IncrementalDetokenizer::push(int32_t id) {
  const std::string_view bytes = tokenizer_->token_bytes(id);
  if (skip_special_ && tokenizer_->is_skippable(id)) return {};
  pending_.append(bytes);
  std::string out;
  const size_t used = utf8::append_replacing(pending_, false, out);
  pending_.erase(0, used);
  return out;
}

std::string IncrementalDetokenizer::finish() {
  std::string out;
  utf8::append_replacing(pending_, true, out);
  pending_.clear();
  return out;
}

}  // namespace k3::tokenizer
