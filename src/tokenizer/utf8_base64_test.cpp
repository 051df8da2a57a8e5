// tokenizer/utf8_base64_test.cpp: UTF-8 well-formedness and U+FFFD substitution (checked against
// what Python's bytes.decode("utf-8", "replace") gives), Python's isspace, strict base64.
#include <gtest/gtest.h>

#include "core/rng.h"
#include "tokenizer/base64.h"
#include "tokenizer/utf8.h"

namespace k3::tokenizer {
namespace {

std::string replaced(std::string_view bytes) {
  std::string out;
  EXPECT_EQ(utf8::append_replacing(bytes, true, out), bytes.size());
  return out;
}

const std::string kFFFD = "\xEF\xBF\xBD";

TEST(Utf8, WellFormedness) {
  EXPECT_TRUE(utf8::is_valid(""));
  EXPECT_TRUE(utf8::is_valid("plain ascii"));
  EXPECT_TRUE(utf8::is_valid("é中🌍\xF4\x8F\xBF\xBF"));     // up to U+10FFFF
  EXPECT_EQ(utf8::first_invalid("ab\xC0\xAF"), 2u);        // overlong '/'
  EXPECT_EQ(utf8::first_invalid("\xE0\x80\xAF"), 0u);      // overlong 3-byte
  EXPECT_EQ(utf8::first_invalid("x\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(utf8::first_invalid("\xF4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8::first_invalid("ok\xE4\xB8"), 2u);        // truncated
  EXPECT_EQ(utf8::first_invalid("\x80"), 0u);              // lone continuation
  EXPECT_EQ(utf8::first_invalid("\xFF"), 0u);
}

TEST(Utf8, ReplacementFollowsMaximalSubparts) {
  // Expected strings are Python 3's b"...".decode("utf-8", "replace").
  EXPECT_EQ(replaced("\xE1\x80"
                     "A"),
            kFFFD + "A");                                      // lead + good continuation, then A
  EXPECT_EQ(replaced("\xF0\x80\x80"), kFFFD + kFFFD + kFFFD);  // F0 needs 90..BF next
  EXPECT_EQ(replaced("\xED\xA0\x80"), kFFFD + kFFFD + kFFFD);  // surrogate
  EXPECT_EQ(replaced("\xC0\xAF"), kFFFD + kFFFD);
  EXPECT_EQ(replaced("a\xE2\x82"), "a" + kFFFD);  // truncated at the end: one
  EXPECT_EQ(replaced("\xF0\x9F\x8C"
                     "x\xF0\x9F\x8C\x8D"),
            kFFFD + "x🌍");
}

TEST(Utf8, IncompleteTailWaitsUnlessFinal) {
  std::string out;
  EXPECT_EQ(utf8::append_replacing("ab\xF0\x9F\x8C", false, out), 2u);
  EXPECT_EQ(out, "ab");
  out.clear();
  EXPECT_EQ(utf8::append_replacing("ab\xF0\x9F\x8C", true, out), 5u);
  EXPECT_EQ(out, "ab" + kFFFD);
}

TEST(Utf8, PythonIsSpace) {
  for (char32_t c : {U'\t', U'\n', U'\v', U'\f', U'\r', U'\x1c', U'\x1f', U' ', U'\x85', U'\xa0', U'\u1680', U'\u2000',
                     U'\u200a', U'\u2028', U'\u2029', U'\u202f', U'\u205f', U'\u3000'})
    EXPECT_TRUE(utf8::is_python_space(c)) << static_cast<uint32_t>(c);
  for (char32_t c : {U'a', U'0', U'\u200b', U'\u180e', U'\ufeff', U'_', U'\x1b'})
    EXPECT_FALSE(utf8::is_python_space(c)) << static_cast<uint32_t>(c);
}

TEST(Base64, RoundTripsRandomBytes) {
  core::Rng rng(7);
  for (size_t len : {0, 1, 2, 3, 17, 54, 97}) {
    std::string bytes;
    for (size_t i = 0; i < len; ++i) bytes.push_back(static_cast<char>(rng.next_u64() & 0xFF));
    const std::string enc = base64_encode(bytes);
    EXPECT_EQ(enc.size() % 4, 0u);
    const auto dec = base64_decode(enc);
    ASSERT_TRUE(dec.has_value()) << enc;
    EXPECT_EQ(*dec, bytes);
  }
  EXPECT_EQ(base64_encode("hello"), "aGVsbG8=");
  EXPECT_EQ(*base64_decode("IQ=="), "!");
}

TEST(Base64, RejectsMalformedInput) {
  for (const char* bad : {"aGVsbG8", "aGVs bG8=", "aGV=bG8=", "a===", "====", "aGVsbG8*", "aGVsbG8=\n", "Zg="})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
}

}  // namespace
}  // namespace k3::tokenizer
