// checkpoint/checkpoint.h: load K3-family weights from a Hugging Face folder, and write
// deterministic random checkpoints in the same layout (spec §4, §9, §14.1).
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>

#include "config/k3_config.h"
#include "config/shard.h"
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
// Progress of a load, reported while the weights are read in (see LoadProgressFn).
struct LoadProgress {
  int64_t bytes_done = 0;   // weight bytes read in so far
  int64_t bytes_total = 0;  // weight bytes of every tensor the model uses
  double seconds = 0;       // since reading began
  bool finished() const { return bytes_done == bytes_total; }
};
// Called on the loading thread, first with bytes_done = 0, then every load_progress_step(total)
// bytes, last with bytes_done = bytes_total. When a callback is given the loader reads every
// weight page in, in file order, before returning (so a slow disk shows as progress here, not
// as a slow first request); without one the tensors stay lazily mapped.
using LoadProgressFn = std::function<void(const LoadProgress&)>;
// 1% of the total, but at least 64 KiB and at most 16 MiB.
inline int64_t load_progress_step(int64_t total_bytes) {
  return std::clamp<int64_t>(total_bytes / 100, int64_t{64} << 10, int64_t{16} << 20);
}

LoadedModel load_checkpoint(const std::filesystem::path& dir, const LoadProgressFn& progress = nullptr);
model::Weights load_weights(const std::filesystem::path& dir, const config::K3Config& config,
                            const LoadProgressFn& progress = nullptr);
// One tensor-parallel rank's weights (spec §11), for the model of config::shard_config(config,
// shard.size). The checkpoint is checked as a whole against the full `config` (the same errors as
// above), then every tensor is cut to the rank's block (checkpoint/shard_slice.h): row blocks stay
// views into the mapping, column blocks (row-parallel weights, MXFP4 codes and scales alike) and
// KDA A_log are copies of the rank's part only. With `progress` only the rank's bytes are read in
// and counted. shard {0, 1} is load_weights above. With shard.expert_parallel (config::shard_config
// with expert_parallel) the rank's routed experts are the whole experts [rank * E / size,
// (rank + 1) * E / size) only, as views (MoeWeights::expert_begin / num_experts say which).
model::Weights load_weights(const std::filesystem::path& dir, const config::K3Config& config, config::TpShard shard,
                            const LoadProgressFn& progress = nullptr);

// Turns LoadProgress reports into log lines: a progress line at most every `interval_seconds`
//   "loading models/k3-tiny: 45% 12.3/27.0 MB 410 MB/s"
// and always the final one
//   "loaded models/k3-tiny: 27.0 MB in 0.07 s (410 MB/s)".
// line() returns "" when nothing is due. Sizes are shown in MB, or GB from 10 GB on.
class LoadProgressLog {
 public:
  explicit LoadProgressLog(std::string what, double interval_seconds = 0.5)
      : what_(std::move(what)), interval_(interval_seconds) {}
  std::string line(const LoadProgress& p);

 private:
  std::string what_;
  double interval_;
  double last_ = 0;  // `seconds` of the last line (or of the start)
};

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
  int threads = 0;              // value-filling threads; 0: one per hardware thread (same bytes for any)
};
// Writes config.json and the safetensors file(s) into `out` (created if missing). The same
// seed and config always give byte-identical files.
void write_random_checkpoint(const config::K3Config& config, const WriteOptions& options,
                             const std::filesystem::path& out);

}  // namespace k3::checkpoint
