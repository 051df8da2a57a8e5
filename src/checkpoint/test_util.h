// checkpoint/test_util.h: helpers shared by the checkpoint tests (temporary folders, raw
// safetensors bytes, message checks). Test-only; header-only so the library does not carry it.
#pragma once
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "core/error.h"

namespace k3::checkpoint::testing {

namespace fs = std::filesystem;

// A fresh folder under the system temp dir, named after the running test; removed on exit.
class TempDir {
 public:
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    static int counter = 0;  // several folders per test must not collide
    std::string name = "k3_ckpt_" + std::to_string(::getpid()) + "_" + std::to_string(counter++);
    if (info != nullptr) name += std::string("_") + info->test_suite_name() + "_" + info->name();
    for (char& ch : name)
      if (ch == '/') ch = '_';
    path_ = fs::temp_directory_path() / name;
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& s) const { return path_ / s; }

 private:
  fs::path path_;
};

inline std::vector<char> read_bytes(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

inline void write_bytes(const fs::path& p, const std::vector<char>& bytes) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A safetensors file from raw parts: u64 length (header.size() unless overridden), header
// text, data bytes.
inline void write_raw_safetensors(const fs::path& p, const std::string& header, const std::vector<char>& data,
                                  int64_t header_len_override = -1) {
  std::vector<char> bytes(8);
  const uint64_t len = header_len_override >= 0 ? static_cast<uint64_t>(header_len_override) : header.size();
  std::memcpy(bytes.data(), &len, 8);
  bytes.insert(bytes.end(), header.begin(), header.end());
  bytes.insert(bytes.end(), data.begin(), data.end());
  write_bytes(p, bytes);
}

// Runs `fn`, expects a core::Error whose message contains every string of `needles`.
template <class Fn>
void expect_error_naming(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
  } catch (const core::Error& e) {
    const std::string msg = e.what();
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' not in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a core::Error naming " << (needles.empty() ? "" : needles[0]);
}

}  // namespace k3::checkpoint::testing
