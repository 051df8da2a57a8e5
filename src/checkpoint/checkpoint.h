// checkpoint/checkpoint.h: load K3-family weights from a Hugging Face folder, and write
// deterministic random checkpoints in the same layout (spec §4, §9, §14.1).
#pragma once
#include <cstdint>
#include <filesystem>
#include <string>

#include "config/k3_config.h"
#include "model/weights.h"

namespace k3::checkpoint {

// Reads DIR/config.json (config::load_config) and the safetensors files of DIR: either
// model.safetensors or the shards listed by model.safetensors.index.json. Tensor names may
// carry the "language_model." prefix; vision_tower.* and mm_projector.* are skipped. Every
// expected tensor must be present with its dtype and shape (param_inventory.h); anything
// missing, extra, mis-shaped, wrongly typed, truncated or corrupt throws core::Error naming
// the file and the tensor. Tensors stay mmap'd (no copy).
struct LoadedModel {
  config::K3Config config;
  model::Weights weights;
};
LoadedModel load_checkpoint(const std::filesystem::path& dir);
model::Weights load_weights(const std::filesystem::path& dir, const config::K3Config& config);

enum class InitStyle : uint8_t {
  realistic,  // spec §14.1: linear N(0, 0.02^2), norms 1 + N(0, 0.01^2), ...
  sensitive,  // spec §14.3: activations O(1), far-from-uniform softmaxes, SiTU clipping bites
};

struct WriteOptions {
  uint64_t seed = 0;
  bool mxfp4 = false;  // routed experts as compressed-tensors MXFP4 (weight_packed + weight_scale)
                      // (decides the written form: config.json states mxfp4 iff this is set)
  InitStyle init = InitStyle::realistic;
  int64_t max_shard_bytes = 0;  // > 0: split into shards with model.safetensors.index.json
};
// Writes config.json and the safetensors file(s) into `out` (created if missing). The same
// seed and config always give byte-identical files.
void write_random_checkpoint(const config::K3Config& config, const WriteOptions& options,
                             const std::filesystem::path& out);

}  // namespace k3::checkpoint
