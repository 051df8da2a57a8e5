// draft/eagle3_model.cpp: the EAGLE-3 draft forward (see eagle3_model.h for the math and layout).
#include "draft/eagle3_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace k3::draft {

namespace {

void expect_shape(const core::Tensor& t, const core::Shape& s, const std::string& name) {
  K3_CHECK(t.defined(), "Eagle3Model: weight " + name + " is missing");
  K3_CHECK(t.shape() == s, "Eagle3Model: weight " + name + " is " + t.shape().str() + ", expected " + s.str());
  K3_CHECK(t.view().device == core::Device::cpu, "Eagle3Model runs on the CPU: " + name + " is not a host tensor");
}

}  // namespace

int64_t Eagle3Cache::bytes() const { return static_cast<int64_t>((k.capacity() + v.capacity()) * sizeof(float)); }

Eagle3Model::Eagle3Model(const Eagle3Config& config, const Eagle3Weights& weights, const kernels::Registry& ops,
                         Eagle3Options options)
    : config_(config),
      weights_(weights),
      ops_(ops),
      options_(options),
      rope_(config.head_dim, config.rope_theta, config.rope_scaling.factor, config.rope_scaling.low_freq_factor,
            config.rope_scaling.high_freq_factor, config.rope_scaling.original_max_position_embeddings) {
  validate(config_, "Eagle3Model");
  const Eagle3Config& c = config_;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  expect_shape(weights_.embed, {c.vocab_size, H}, "embed_tokens.weight");
  expect_shape(weights_.fc.weight, {H, int64_t{c.num_taps()} * c.target_hidden_size}, "fc.weight");
  expect_shape(weights_.hidden_norm, {H}, "hidden_norm.weight");
  expect_shape(weights_.input_norm, {H}, "input_layernorm.weight");
  expect_shape(weights_.q_proj.weight, {c.q_width(), 2 * H}, "q_proj.weight");
  expect_shape(weights_.k_proj.weight, {c.kv_width(), 2 * H}, "k_proj.weight");
  expect_shape(weights_.v_proj.weight, {c.kv_width(), 2 * H}, "v_proj.weight");
  expect_shape(weights_.o_proj.weight, {H, c.q_width()}, "o_proj.weight");
  expect_shape(weights_.post_attn_norm, {H}, "post_attention_layernorm.weight");
  expect_shape(weights_.gate_proj.weight, {I, H}, "gate_proj.weight");
  expect_shape(weights_.up_proj.weight, {I, H}, "up_proj.weight");
  expect_shape(weights_.down_proj.weight, {H, I}, "down_proj.weight");
  expect_shape(weights_.final_norm, {H}, "norm.weight");
  expect_shape(weights_.lm_head.weight, {c.draft_vocab_size, H}, "lm_head.weight");
  if (c.has_d2t()) {
    expect_shape(weights_.d2t, {c.draft_vocab_size}, "d2t");
    K3_CHECK(weights_.d2t.dtype() == core::DType::i64, "Eagle3Model: d2t must be I64");
  }
}

core::Tensor Eagle3Model::alloc(int64_t rows, int64_t cols) const {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, {rows, cols});
  if (options_.poison_buffers)
    for (float& v : t.span<float>()) v = std::numeric_limits<float>::quiet_NaN();
  return t;
}

core::Tensor Eagle3Model::linear(const core::Tensor& x, const kernels::LinearWeight& w, bool round_output) const {
  core::Tensor y = alloc(x.dim(0), w.out_features());
  ops_.linear.run({x.view(), &w, y.view(), round_output, options_.precision}, core::Device::cpu);
  return y;
}

core::Tensor Eagle3Model::rmsnorm(const core::Tensor& x, const core::Tensor& w) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops_.rmsnorm.run({x.view(), w.view(), y.view(), config_.rms_norm_eps, options_.rmsnorm_style, options_.precision},
                   core::Device::cpu);
  return y;
}

core::Tensor Eagle3Model::add(const core::Tensor& a, const core::Tensor& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops_.add.run({a.view(), b.view(), y.view(), options_.precision}, core::Device::cpu);
  return y;
}

core::Tensor Eagle3Model::fuse_taps(const core::TensorView& taps) const {
  const int64_t width = int64_t{config_.num_taps()} * config_.target_hidden_size;
  K3_CHECK(taps.device == core::Device::cpu && taps.dtype == core::DType::f32,
           "Eagle3Model::fuse_taps: taps must be a CPU f32 tensor");
  K3_CHECK(taps.rank() == 2 && taps.dim(1) == width && taps.strides[1] == 1,
           "Eagle3Model::fuse_taps: taps must be [rows, " + std::to_string(width) + "] (" +
               std::to_string(config_.num_taps()) + " taps x " + std::to_string(config_.target_hidden_size) +
               "), got " + taps.shape.str());
  core::Tensor x = core::Tensor::zeros(core::DType::f32, {taps.dim(0), width});
  for (int64_t r = 0; r < taps.dim(0); ++r)
    std::memcpy(x.data<float>() + r * width, static_cast<const float*>(taps.data) + r * taps.strides[0],
                sizeof(float) * static_cast<size_t>(width));
  return linear(x, weights_.fc);
}

core::Tensor Eagle3Model::attention(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows,
                                    const core::Tensor& q, const core::Tensor& k, const core::Tensor& v) const {
  const Eagle3Config& c = config_;
  const int64_t hd = c.head_dim, kvw = c.kv_width(), group = c.num_heads / c.num_kv_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  core::Tensor out = alloc(q.dim(0), c.q_width());
  std::vector<float> p;
  int64_t row0 = 0;
  for (size_t b = 0; b < caches.size(); ++b) {
    Eagle3Cache& cache = *caches[b];
    const int64_t n = rows[b], before = cache.rows;
    cache.k.insert(cache.k.end(), k.data<const float>() + row0 * kvw, k.data<const float>() + (row0 + n) * kvw);
    cache.v.insert(cache.v.end(), v.data<const float>() + row0 * kvw, v.data<const float>() + (row0 + n) * kvw);
    cache.rows += n;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t keys = before + i + 1;  // causal: every cached row up to this one
      p.resize(static_cast<size_t>(keys));
      for (int h = 0; h < c.num_heads; ++h) {
        const float* qh = q.data<const float>() + (row0 + i) * c.q_width() + int64_t{h} * hd;
        const int64_t kv_off = (h / group) * hd;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < keys; ++j) {
          const float* kj = cache.k.data() + j * kvw + kv_off;
          float dot = 0.0f;
          for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kj[d];
          p[static_cast<size_t>(j)] = dot * scale;
          max = std::max(max, p[static_cast<size_t>(j)]);
        }
        float sum = 0.0f;
        for (float& s : p) sum += (s = std::exp(s - max));
        float* o = out.data<float>() + (row0 + i) * c.q_width() + int64_t{h} * hd;
        for (int64_t d = 0; d < hd; ++d) {
          float acc = 0.0f;
          for (int64_t j = 0; j < keys; ++j) acc += p[static_cast<size_t>(j)] * cache.v[j * kvw + kv_off + d];
          o[d] = kernels::round_act(acc / sum, options_.precision);
        }
      }
    }
    row0 += n;
  }
  return out;
}

Eagle3Output Eagle3Model::forward(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows,
                                  std::span<const int32_t> tokens, const core::Tensor& hidden) const {
  const Eagle3Config& c = config_;
  const int64_t H = c.hidden_size, N = static_cast<int64_t>(tokens.size());
  K3_CHECK(caches.size() == rows.size(), "Eagle3Model::forward: " + std::to_string(caches.size()) + " caches for " +
                                             std::to_string(rows.size()) + " row counts");
  int64_t total = 0;
  for (int64_t n : rows) {
    K3_CHECK(n >= 0, "Eagle3Model::forward: negative row count");
    total += n;
  }
  K3_CHECK(total == N, "Eagle3Model::forward: " + std::to_string(N) + " tokens for " + std::to_string(total) + " rows");
  K3_CHECK(hidden.view().device == core::Device::cpu && hidden.dtype() == core::DType::f32 &&
               hidden.shape() == core::Shape({N, H}),
           "Eagle3Model::forward: hidden must be CPU f32 [" + std::to_string(N) + ", " + std::to_string(H) + "], got " +
               hidden.shape().str());
  for (int32_t t : tokens)
    K3_CHECK(t >= 0 && t < c.vocab_size,
             "Eagle3Model::forward: token " + std::to_string(t) + " outside [0, " + std::to_string(c.vocab_size) + ")");
  Eagle3Output out;
  if (N == 0) {
    out.normed = alloc(0, H);
    out.prenorm = alloc(0, H);
    return out;
  }
  core::Tensor ids = core::Tensor::zeros(core::DType::i32, {N});
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  core::Tensor emb = alloc(N, H);
  ops_.embedding.run({ids.view(), weights_.embed.view(), emb.view()}, core::Device::cpu);
  const core::Tensor e = rmsnorm(emb, weights_.input_norm);
  const core::Tensor n = rmsnorm(hidden, weights_.hidden_norm);
  const core::Tensor& residual = c.norm_before_residual ? n : hidden;
  core::Tensor x = alloc(N, 2 * H);
  for (int64_t r = 0; r < N; ++r) {
    std::memcpy(x.data<float>() + r * 2 * H, e.data<const float>() + r * H, sizeof(float) * static_cast<size_t>(H));
    std::memcpy(x.data<float>() + r * 2 * H + H, n.data<const float>() + r * H, sizeof(float) * static_cast<size_t>(H));
  }
  core::Tensor q = linear(x, weights_.q_proj), k = linear(x, weights_.k_proj);
  const core::Tensor v = linear(x, weights_.v_proj);
  int64_t r = 0;
  for (size_t b = 0; b < caches.size(); ++b)
    for (int64_t i = 0; i < rows[b]; ++i, ++r) {
      const int64_t pos = caches[b]->end_position() + i;
      for (int h = 0; h < c.num_heads; ++h)
        rope_.apply(q.data<float>() + r * c.q_width() + int64_t{h} * c.head_dim, pos, options_.precision);
      for (int h = 0; h < c.num_kv_heads; ++h)
        rope_.apply(k.data<float>() + r * c.kv_width() + int64_t{h} * c.head_dim, pos, options_.precision);
    }
  const core::Tensor r1 = add(linear(attention(caches, rows, q, k, v), weights_.o_proj), residual);
  const core::Tensor h = rmsnorm(r1, weights_.post_attn_norm);
  core::Tensor act = linear(h, weights_.gate_proj);
  const core::Tensor up = linear(h, weights_.up_proj);
  ops_.silu_glu.run({act.view(), up.view(), act.view(), options_.precision}, core::Device::cpu);
  out.prenorm = add(linear(act, weights_.down_proj), r1);
  out.normed = rmsnorm(out.prenorm, weights_.final_norm);
  return out;
}

core::Tensor Eagle3Model::logits(const core::Tensor& normed) const {
  return linear(normed, weights_.lm_head, /*round_output=*/false);
}

int32_t Eagle3Model::to_target_id(int32_t draft_id) const {
  K3_CHECK(draft_id >= 0 && draft_id < config_.draft_vocab_size,
           "Eagle3Model: draft id " + std::to_string(draft_id) + " outside the draft vocabulary");
  if (!config_.has_d2t()) return draft_id;
  return static_cast<int32_t>(draft_id + weights_.d2t.data<const int64_t>()[draft_id]);
}

int32_t Eagle3Model::greedy_token(const float* row) const {
  int32_t best = 0;
  for (int32_t d = 1; d < config_.draft_vocab_size; ++d)
    if (row[d] > row[best]) best = d;
  return to_target_id(best);
}

void Eagle3Model::truncate(Eagle3Cache& cache, int64_t end_position) const {
  K3_CHECK(end_position >= cache.first_position && end_position <= cache.end_position(),
           "Eagle3Model::truncate: " + std::to_string(end_position) + " is outside [" +
               std::to_string(cache.first_position) + ", " + std::to_string(cache.end_position()) + "]");
  cache.rows = end_position - cache.first_position;
  cache.k.resize(static_cast<size_t>(cache.rows * config_.kv_width()));
  cache.v.resize(static_cast<size_t>(cache.rows * config_.kv_width()));
}

}  // namespace k3::draft
