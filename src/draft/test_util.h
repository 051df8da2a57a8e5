// draft/test_util.h: helpers for the draft tests: a temp folder, a random target embedding and a
// ready DraftModel over random in-memory weights.
#pragma once
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/bf16.h"
#include "core/rng.h"
#include "draft/draft_model.h"
#include "kernels/registry.h"

namespace k3::draft::testing {

// A fresh folder under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir() {
    static std::atomic<int> counter{0};
    path_ = std::filesystem::temp_directory_path() /
            ("k3serve-draft-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// bf16 [rows, cols] with N(0, std^2) values (a stand-in for the target's embed_tokens).
inline core::Tensor random_bf16(int64_t rows, int64_t cols, uint64_t seed, double std = 1.0) {
  core::Tensor t = core::Tensor::zeros(core::DType::bf16, {rows, cols});
  core::Rng rng(seed);
  for (auto& v : t.span<uint16_t>()) v = core::f32_to_bf16_bits(static_cast<float>(rng.normal(0.0, std)));
  return t;
}

// f32 [rows, cols] with N(0, std^2) values, bf16-representable (as stored activations are).
inline core::Tensor random_act(int64_t rows, int64_t cols, uint64_t seed, double std = 1.0) {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, {rows, cols});
  core::Rng rng(seed);
  for (auto& v : t.span<float>()) v = core::bf16_round(static_cast<float>(rng.normal(0.0, std)));
  return t;
}

inline const kernels::Registry& reference_ops() {
  static const kernels::Registry* r = [] {
    auto* reg = new kernels::Registry;
    kernels::register_reference_ops(*reg);
    return reg;
  }();
  return *r;
}

// A draft model over random weights, owning everything it references.
struct RandomDraft {
  DraftConfig config;
  core::Tensor embed;
  DraftWeights weights;
  std::unique_ptr<DraftModel> model;
  RandomDraft(DraftConfig c, uint64_t seed, DraftOptions options = {}) : config(std::move(c)) {
    embed = random_bf16(config.vocab_size, config.hidden_size, seed ^ 0xe3b0);
    weights = random_draft_weights(config, seed, embed);
    model = std::make_unique<DraftModel>(config, weights, reference_ops(), options);
  }
};

// A small draft with odd sizes (non-multiples of any tile) and every optional part on.
inline DraftConfig odd_config() {
  DraftConfig c;
  c.num_layers = 2;
  c.hidden_size = 54;
  c.vocab_size = 97;
  c.draft_vocab_size = 97;
  c.num_heads = 3;
  c.q_lora_rank = 17;
  c.kv_lora_rank = 13;
  c.qk_nope_head_dim = 7;
  c.qk_rope_head_dim = 6;
  c.v_head_dim = 5;
  c.rope_theta = 500.0f;
  c.intermediate_size = 23;
  c.block_size = 5;
  c.target_layer_ids = {1, 4};
  c.markov_rank = 11;
  c.use_confidence_head = true;
  c.mask_token_id = 96;
  return c;
}

// Double-precision building blocks of the reference transcriptions (draft_reference_test.cpp,
// eagle3_model_test.cpp): y = W x over the weight's stored values, and RMSNorm with weight w.
inline std::vector<double> ref_matvec(const kernels::LinearWeight& lw, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(lw.out_features()));
  std::vector<float> row(static_cast<size_t>(lw.in_features()));
  for (int64_t o = 0; o < lw.out_features(); ++o) {
    lw.load_row(o, row.data());
    double s = 0;
    for (size_t i = 0; i < row.size(); ++i) s += double(row[i]) * x[i];
    y[static_cast<size_t>(o)] = s;
  }
  return y;
}
inline std::vector<double> ref_rmsnorm(const std::vector<double>& x, const core::Tensor& w, double eps) {
  double ms = 0;
  for (double v : x) ms += v * v;
  const double inv = 1.0 / std::sqrt(ms / double(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = kernels::load_f32(w.view(), int64_t(i)) * x[i] * inv;
  return y;
}

// Every tensor of a single-file checkpoint folder, copied (so the folder can be rewritten), and
// the rewrite; tensors equal byte for byte.
inline std::map<std::string, core::Tensor> read_all(const std::filesystem::path& dir) {
  const auto f = checkpoint::SafetensorsFile::open(dir / checkpoint::kSingleFileName);
  std::map<std::string, core::Tensor> out;
  for (const auto& info : f.tensors()) out[info.name] = core::Tensor::copy_of(f.tensor(info).view());
  return out;
}
inline void write_all(const std::filesystem::path& dir, const std::map<std::string, core::Tensor>& t) {
  std::map<std::string, core::TensorView> views;
  for (const auto& [n, v] : t) views[n] = v.view();
  checkpoint::write_safetensors(dir / checkpoint::kSingleFileName, views);
}
inline bool same_bytes(const core::Tensor& a, const core::Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.data<void>(), b.data<void>(), size_t(a.nbytes())) == 0;
}

inline bool all_finite(const core::Tensor& t) {
  for (float v : t.span<const float>())
    if (!std::isfinite(v)) return false;
  return true;
}

}  // namespace k3::draft::testing
