// tokenizer/base64.cpp: strict base64 decode and encode.
#include "tokenizer/base64.h"

#include <array>
#include <cstdint>

namespace k3::tokenizer {

namespace {

constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

constexpr std::array<int8_t, 256> make_table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  for (size_t i = 0; i < kAlphabet.size(); ++i) t[static_cast<unsigned char>(kAlphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kValue = make_table();

}  // namespace

std::optional<std::string> base64_decode(std::string_view text) {
  if (text.size() % 4 != 0) return std::nullopt;
  size_t pad = 0;
  if (!text.empty() && text.back() == '=') pad = text.size() >= 2 && text[text.size() - 2] == '=' ? 2 : 1;
  std::string out;
  out.reserve(text.size() / 4 * 3);
  uint32_t acc = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const bool is_pad = i >= text.size() - pad;
    const int8_t v = kValue[static_cast<unsigned char>(text[i])];
    if (!is_pad && v < 0) return std::nullopt;  // also catches a stray '=' before the end
    acc = (acc << 6) | static_cast<uint32_t>(is_pad ? 0 : v);
    if (i % 4 == 3) {
      out.push_back(static_cast<char>((acc >> 16) & 0xFF));
      out.push_back(static_cast<char>((acc >> 8) & 0xFF));
      out.push_back(static_cast<char>(acc & 0xFF));
      acc = 0;
    }
  }
  out.resize(out.size() - pad);
  return out;
}

std::string base64_encode(std::string_view bytes) {
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const size_t n = bytes.size() - i < 3 ? bytes.size() - i : 3;
    uint32_t acc = 0;
    for (size_t k = 0; k < 3; ++k) acc = (acc << 8) | (k < n ? static_cast<unsigned char>(bytes[i + k]) : 0u);
    for (size_t k = 0; k < 4; ++k) out.push_back(k <= n ? kAlphabet[(acc >> (18 - 6 * k)) & 0x3F] : '=');
  }
  return out;
}

}  // namespace k3::tokenizer
