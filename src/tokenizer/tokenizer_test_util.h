// tokenizer/tokenizer_test_util.h: shared test helpers: the tiny K3-format tokenizer built in
// memory, a temporary folder, random text from a mixed-script alphabet.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "core/rng.h"
#include "tokenizer/split_patterns.h"
#include "tokenizer/tiny_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace k3::tokenizer::test {

inline const Tokenizer& tiny() {
  static const Tokenizer tok = [] {
    K3Vocab v = build_tiny_vocab(1024);
    Tokenizer t(std::move(v.ranks), std::move(v.specials), {std::string(patterns::kKimi), true});
    return t;
  }();
  return tok;
}

// A fresh empty folder under the system temp dir, removed on destruction.
class TempDir {
 public:
  explicit TempDir(const std::string& name)
      : path_(std::filesystem::temp_directory_path() / ("k3tok-" + name + "-" + std::to_string(::getpid()))) {
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }
  void write(const std::string& file, const std::string& text) const {
    std::ofstream(path_ / file, std::ios::binary) << text;
  }

 private:
  std::filesystem::path path_;
};

// Random text of `chars` characters drawn from ASCII words, punctuation, whitespace, accented
// Latin, CJK, emoji and K3 marker look-alikes.
inline std::string random_text(core::Rng& rng, size_t chars) {
  static const char* const kAtoms[] = {"a",  "e",  "t",     "the",  " ",     " ",      "\n",     "\t",
                                       "  ", "!",  ",",     ".",    "'s",    "7",      "42",     "é",
                                       "ß",  "Ж",  "中",    "文",   "、",    "🌍",      "👋",      "<|open|>",
                                       "<|", "|>", "[BOS]", "\r\n", "Hello", "\u00a0", "\u3000", "x"};
  std::string s;
  for (size_t i = 0; i < chars; ++i) s += kAtoms[rng.next_u64() % (sizeof kAtoms / sizeof kAtoms[0])];
  return s;
}

}  // namespace k3::tokenizer::test
