// eval/test_util.h: the eval tests' model: k3-tiny seed 0 written once per test process to a
// temporary folder (removed at exit), and the folder of the build's programs. Test-only.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config/k3_config.h"

namespace k3::eval::testing_util {

class TinyModel {
 public:
  // The folder of k3-tiny seed 0 (realistic init), written on first use.
  static const std::filesystem::path& dir() {
    static const TinyModel model;
    return model.dir_;
  }

 private:
  TinyModel() {
    dir_ = std::filesystem::temp_directory_path() / ("k3_eval_tiny_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir_);
    checkpoint::write_random_checkpoint(config::builtin_config("k3-tiny"), {}, dir_);
  }
  ~TinyModel() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  std::filesystem::path dir_;
};

// The build's top folder (where k3serve and k3eval_layer_diff are written): this test program
// lives in <build>/eval/.
inline std::filesystem::path build_dir() {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path().parent_path();
}

}  // namespace k3::eval::testing_util
