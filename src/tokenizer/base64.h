// tokenizer/base64.h: strict standard base64 (RFC 4648 §4, '=' padding), as tiktoken files use.
#pragma once
#include <optional>
#include <string>
#include <string_view>

namespace k3::tokenizer {

// Decodes `text`; nullopt when it is not canonical-length standard base64: a length that is
// not a multiple of 4, a character outside A-Z a-z 0-9 + /, or '=' anywhere but the last one
// or two places. (Python's b64decode silently drops such characters; a rank file with them is
// corrupt, so here it is refused.)
std::optional<std::string> base64_decode(std::string_view text);
std::string base64_encode(std::string_view bytes);

}  // namespace k3::tokenizer
