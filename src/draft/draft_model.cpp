// draft/draft_model.cpp: the DSpark draft forward (see draft_model.h for the math and layout).
#include "draft/draft_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/error.h"
#include "draft/rope.h"

namespace k3::draft {

namespace {

void expect_shape(const core::Tensor& t, const core::Shape& s, const std::string& name) {
  K3_CHECK(t.defined(), "DraftModel: weight " + name + " is missing");
  K3_CHECK(t.shape() == s, "DraftModel: weight " + name + " is " + t.shape().str() + ", expected " + s.str());
}

// Columns [begin, end) of a contiguous [rows, cols] f32 tensor, copied.
core::Tensor columns(const core::Tensor& t, int64_t begin, int64_t end) {
  const int64_t rows = t.dim(0), cols = t.dim(1);
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {rows, end - begin});
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(out.data<float>() + r * (end - begin), t.data<const float>() + r * cols + begin,
                static_cast<size_t>(end - begin) * sizeof(float));
  return out;
}

}  // namespace

int64_t DraftCache::bytes() const {
  int64_t n = 0;
  for (const auto& l : layers) n += static_cast<int64_t>(l.capacity() * sizeof(float));
  return n;
}

DraftModel::DraftModel(const DraftConfig& config, const DraftWeights& weights, const kernels::Registry& ops,
                       DraftOptions options)
    : config_(config), weights_(weights), ops_(ops), options_(options) {
  validate(config_, "DraftModel");
  const DraftConfig& c = config_;
  K3_CHECK(static_cast<int>(weights_.layers.size()) == c.num_layers,
           "DraftModel: weights have " + std::to_string(weights_.layers.size()) + " layers, config has " +
               std::to_string(c.num_layers));
  // Every stored tensor against the inventory, plus the aliased embedding (and a shared lm_head).
  std::map<std::string, core::Tensor> by_name = {{"context_proj.weight", weights_.context_proj.weight},
                                                 {"context_norm.weight", weights_.context_norm},
                                                 {"norm.weight", weights_.final_norm},
                                                 {"markov_w1.weight", weights_.markov_w1},
                                                 {"markov_w2.weight", weights_.markov_w2.weight},
                                                 {"confidence_head.weight", weights_.confidence_head.weight},
                                                 {"d2t", weights_.d2t},
                                                 {"lm_head.weight", weights_.lm_head.weight}};
  for (int l = 0; l < c.num_layers; ++l) {
    const DraftLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    const std::string p = "layers." + std::to_string(l) + ".";
    by_name[p + "input_layernorm.weight"] = w.input_norm;
    by_name[p + "self_attn.q_a_proj.weight"] = w.q_a_proj.weight;
    by_name[p + "self_attn.q_a_layernorm.weight"] = w.q_a_norm;
    by_name[p + "self_attn.q_b_proj.weight"] = w.q_b_proj.weight;
    by_name[p + "self_attn.kv_a_proj_with_mqa.weight"] = w.kv_a_proj.weight;
    by_name[p + "self_attn.kv_a_layernorm.weight"] = w.kv_a_norm;
    by_name[p + "self_attn.kv_b_proj.weight"] = w.kv_b_proj.weight;
    by_name[p + "self_attn.o_proj.weight"] = w.o_proj.weight;
    by_name[p + "post_attention_layernorm.weight"] = w.post_attn_norm;
    by_name[p + "mlp.gate_proj.weight"] = w.gate_proj.weight;
    by_name[p + "mlp.up_proj.weight"] = w.up_proj.weight;
    by_name[p + "mlp.down_proj.weight"] = w.down_proj.weight;
  }
  for (const DraftParamSpec& p : draft_params(c)) {
    expect_shape(by_name.at(p.name), p.shape, p.name);
    K3_CHECK(by_name.at(p.name).view().device == core::Device::cpu,
             "DraftModel runs on the CPU: " + p.name + " is not a host tensor");
  }
  K3_CHECK(weights_.embed.view().device == core::Device::cpu &&
               weights_.lm_head.weight.view().device == core::Device::cpu,
           "DraftModel runs on the CPU: the target's embedding / lm_head it aliases must be host tensors (the loaded "
           "checkpoint's weights, not the device copy)");
  expect_shape(weights_.embed, {c.vocab_size, c.hidden_size}, "embed (the target's embed_tokens)");
  expect_shape(weights_.lm_head.weight, {c.draft_vocab_size, c.hidden_size}, "lm_head.weight");
  K3_CHECK(!weights_.lm_head.is_mxfp4(), "DraftModel: lm_head must be BF16 or F32");
}

core::Tensor DraftModel::alloc(int64_t rows, int64_t cols) const {
  core::Tensor t = core::Tensor::zeros(core::DType::f32, {rows, cols});
  if (options_.poison_buffers)
    for (float& v : t.span<float>()) v = std::numeric_limits<float>::quiet_NaN();
  return t;
}

core::Tensor DraftModel::linear(const core::Tensor& x, const kernels::LinearWeight& w, bool round_output) const {
  core::Tensor y = alloc(x.dim(0), w.out_features());
  ops_.linear.run({x.view(), &w, y.view(), round_output, options_.precision}, core::Device::cpu);
  return y;
}

core::Tensor DraftModel::rmsnorm(const core::Tensor& x, const core::Tensor& w) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops_.rmsnorm.run({x.view(), w.view(), y.view(), config_.rms_norm_eps, options_.rmsnorm_style, options_.precision},
                   core::Device::cpu);
  return y;
}

core::Tensor DraftModel::add(const core::Tensor& a, const core::Tensor& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops_.add.run({a.view(), b.view(), y.view(), options_.precision}, core::Device::cpu);
  return y;
}

DraftCache DraftModel::new_cache() const {
  DraftCache c;
  c.layers.resize(static_cast<size_t>(config_.num_layers));
  return c;
}

core::Tensor DraftModel::latent_rows(const DraftLayerWeights& w, const core::Tensor& x,
                                     std::span<const int64_t> positions) const {
  const DraftConfig& c = config_;
  const core::Tensor kv = linear(x, w.kv_a_proj);  // [n, r_kv + dr]
  const core::Tensor c_n = rmsnorm(columns(kv, 0, c.kv_lora_rank), w.kv_a_norm);
  core::Tensor out = alloc(x.dim(0), c.cache_dim());
  for (int64_t r = 0; r < x.dim(0); ++r) {
    float* dst = out.data<float>() + r * c.cache_dim();
    std::memcpy(dst, c_n.data<const float>() + r * c.kv_lora_rank, sizeof(float) * static_cast<size_t>(c.kv_lora_rank));
    std::memcpy(dst + c.kv_lora_rank, kv.data<const float>() + r * c.cache_dim() + c.kv_lora_rank,
                sizeof(float) * static_cast<size_t>(c.qk_rope_head_dim));
    apply_rope(dst + c.kv_lora_rank, c.qk_rope_head_dim, positions[static_cast<size_t>(r)], c.rope_theta,
               options_.precision);
  }
  return out;
}

void DraftModel::append_context(DraftCache& cache, const core::TensorView& taps) const {
  const DraftConfig& c = config_;
  const int64_t width = int64_t{c.num_taps()} * c.hidden_size;
  K3_CHECK(taps.device == core::Device::cpu && taps.dtype == core::DType::f32,
           "append_context: taps must be a CPU f32 tensor");
  K3_CHECK(taps.rank() == 2 && taps.dim(1) == width, "append_context: taps must be [rows, " + std::to_string(width) +
                                                         "] (" + std::to_string(c.num_taps()) + " taps x hidden " +
                                                         std::to_string(c.hidden_size) + "), got " + taps.shape.str());
  K3_CHECK(cache.layers.size() == static_cast<size_t>(c.num_layers), "append_context: cache is not from this model");
  if (taps.dim(0) == 0) return;
  core::Tensor x = core::Tensor::zeros(core::DType::f32, {taps.dim(0), width});
  for (int64_t r = 0; r < taps.dim(0); ++r)  // the view's rows may be strided
    std::memcpy(x.data<float>() + r * width, static_cast<const float*>(taps.data) + r * taps.strides[0],
                sizeof(float) * static_cast<size_t>(width));
  const core::Tensor ctx = rmsnorm(linear(x, weights_.context_proj), weights_.context_norm);  // [n, H]
  std::vector<int64_t> positions(static_cast<size_t>(taps.dim(0)));
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = cache.num_context + static_cast<int64_t>(i);
  for (int l = 0; l < c.num_layers; ++l) {
    const core::Tensor rows = latent_rows(weights_.layers[static_cast<size_t>(l)], ctx, positions);
    auto& dst = cache.layers[static_cast<size_t>(l)];
    dst.insert(dst.end(), rows.data<const float>(), rows.data<const float>() + rows.numel());
  }
  cache.num_context += taps.dim(0);
}

void DraftModel::truncate(DraftCache& cache, int64_t num_context) const {
  K3_CHECK(num_context >= 0 && num_context <= cache.num_context,
           "truncate: " + std::to_string(num_context) + " is outside [0, " + std::to_string(cache.num_context) + "]");
  for (auto& l : cache.layers) l.resize(static_cast<size_t>(num_context * config_.cache_dim()));
  cache.num_context = num_context;
}

core::Tensor DraftModel::attention(const DraftLayerWeights& w, std::span<const DraftCache* const> caches, int layer,
                                   const core::Tensor& x) const {
  const DraftConfig& c = config_;
  const int64_t K = c.block_size, B = static_cast<int64_t>(caches.size());
  const std::vector<int64_t> pos = block_positions(caches);
  core::Tensor q = linear(rmsnorm(linear(x, w.q_a_proj), w.q_a_norm), w.q_b_proj);  // [B*K, NH*(dn+dr)]
  for (int64_t t = 0; t < B * K; ++t)
    for (int h = 0; h < c.num_heads; ++h)
      apply_rope(q.data<float>() + t * q.dim(1) + int64_t{h} * c.q_head_dim() + c.qk_nope_head_dim, c.qk_rope_head_dim,
                 pos[static_cast<size_t>(t)], c.rope_theta, options_.precision);
  const core::Tensor block = latent_rows(w, x, pos);  // [B*K, cache_dim], not stored
  // Request b's keys: its P_b context rows, then its K block rows; all requests' rows stacked so
  // kv_b_proj expands them in one linear.
  int64_t total = 0;
  for (const DraftCache* cache : caches) total += cache->num_context + K;
  core::Tensor latents = alloc(total, c.cache_dim());
  std::vector<int64_t> begin;
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& ctx = caches[static_cast<size_t>(b)]->layers[static_cast<size_t>(layer)];
    const int64_t P = caches[static_cast<size_t>(b)]->num_context;
    begin.push_back(row);
    std::memcpy(latents.data<float>() + row * c.cache_dim(), ctx.data(),
                sizeof(float) * static_cast<size_t>(P * c.cache_dim()));
    std::memcpy(latents.data<float>() + (row + P) * c.cache_dim(), block.data<const float>() + b * K * c.cache_dim(),
                sizeof(float) * static_cast<size_t>(K * c.cache_dim()));
    row += P + K;
  }
  core::Tensor o = alloc(B * K, int64_t{c.num_heads} * c.v_head_dim);
  auto rows = [](const core::Tensor& t, int64_t r0, int64_t n) {
    return core::TensorView::contiguous(t.data<float>() + r0 * t.dim(1), core::DType::f32, {n, t.dim(1)});
  };
  if (options_.absorbed_attention) {
    for (int64_t b = 0; b < B; ++b) {
      const int64_t S = caches[static_cast<size_t>(b)]->num_context + K, r0 = begin[static_cast<size_t>(b)];
      block_attention_absorbed(c, rows(q, b * K, K), rows(latents, r0, S), w.kv_b_proj, rows(o, b * K, K),
                               options_.precision);
    }
    return linear(o, w.o_proj);
  }
  const core::Tensor kv = linear(columns(latents, 0, c.kv_lora_rank), w.kv_b_proj);  // [total, NH*(dn+dv)]
  for (int64_t b = 0; b < B; ++b) {
    const int64_t S = caches[static_cast<size_t>(b)]->num_context + K, r0 = begin[static_cast<size_t>(b)];
    block_attention(c, rows(q, b * K, K), rows(latents, r0, S), rows(kv, r0, S), rows(o, b * K, K), options_.precision);
  }
  return linear(o, w.o_proj);
}

std::vector<int64_t> DraftModel::block_positions(std::span<const DraftCache* const> caches) const {
  std::vector<int64_t> pos;
  for (const DraftCache* cache : caches)
    for (int64_t j = 0; j < config_.block_size; ++j) pos.push_back(cache->num_context + j);
  return pos;
}

BlockOutput DraftModel::forward_block(const DraftCache& cache, int32_t x0) const {
  const DraftCache* one = &cache;
  return forward_blocks(std::span<const DraftCache* const>(&one, 1), std::span<const int32_t>(&x0, 1));
}

BlockOutput DraftModel::forward_blocks(std::span<const DraftCache* const> caches, std::span<const int32_t> x0) const {
  const DraftConfig& c = config_;
  K3_CHECK(caches.size() == x0.size() && !caches.empty(),
           "forward_blocks: " + std::to_string(caches.size()) + " caches for " + std::to_string(x0.size()) + " tokens");
  const int64_t K = c.block_size, B = static_cast<int64_t>(caches.size());
  std::vector<int32_t> ids;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t t = x0[static_cast<size_t>(b)];
    K3_CHECK(t >= 0 && t < c.vocab_size, "forward_block: token " + std::to_string(t) + " outside the vocabulary [0, " +
                                             std::to_string(c.vocab_size) + ")");
    K3_CHECK(caches[static_cast<size_t>(b)]->layers.size() == static_cast<size_t>(c.num_layers),
             "forward_block: cache is not from this model");
    ids.push_back(t);
    ids.insert(ids.end(), static_cast<size_t>(K - 1), c.mask_token_id);
  }
  core::Tensor h = alloc(B * K, c.hidden_size);
  ops_.embedding.run({core::TensorView::contiguous(ids.data(), core::DType::i32, {B * K}), weights_.embed.view(),
                      h.view()},
                     core::Device::cpu);
  for (int l = 0; l < c.num_layers; ++l) {
    const DraftLayerWeights& w = weights_.layers[static_cast<size_t>(l)];
    h = add(h, attention(w, caches, l, rmsnorm(h, w.input_norm)));
    const core::Tensor x = rmsnorm(h, w.post_attn_norm);
    core::Tensor act = alloc(B * K, c.intermediate_size);
    const core::Tensor gate = linear(x, w.gate_proj), up = linear(x, w.up_proj);
    ops_.situ_glu.run({gate.view(), up.view(), act.view(), c.situ_beta, c.situ_linear_beta, options_.precision},
                      core::Device::cpu);
    h = add(h, linear(act, w.down_proj));
  }
  BlockOutput out;
  out.hidden = rmsnorm(h, weights_.final_norm);
  out.base_logits = linear(out.hidden, weights_.lm_head, /*round_output=*/false);
  return out;
}

std::vector<float> DraftModel::markov_bias(int32_t prev) const {
  const DraftConfig& c = config_;
  K3_CHECK(prev >= 0 && prev < c.vocab_size, "markov_bias: token " + std::to_string(prev) + " outside the vocabulary");
  core::Tensor e = core::Tensor::zeros(core::DType::f32, {1, c.markov_rank});
  const core::TensorView row = weights_.markov_w1.view().row(prev);
  for (int64_t i = 0; i < c.markov_rank; ++i) e.data<float>()[i] = kernels::load_f32(row, i);
  const core::Tensor m = linear(e, weights_.markov_w2, /*round_output=*/false);
  return {m.data<const float>(), m.data<const float>() + m.numel()};
}

float DraftModel::confidence(const float* hidden_row, int32_t prev) const {
  const DraftConfig& c = config_;
  K3_CHECK(c.use_confidence_head, "confidence: the draft has no confidence head");
  std::vector<float> w(static_cast<size_t>(c.hidden_size + c.markov_rank));
  weights_.confidence_head.load_row(0, w.data());
  const core::TensorView row = weights_.markov_w1.view().row(prev);
  float z = 0.0f;
  for (int i = 0; i < c.hidden_size; ++i) z += w[static_cast<size_t>(i)] * hidden_row[i];
  for (int i = 0; i < c.markov_rank; ++i) z += w[static_cast<size_t>(c.hidden_size + i)] * kernels::load_f32(row, i);
  return 1.0f / (1.0f + std::exp(-z));
}

int32_t DraftModel::to_target_id(int32_t d) const {
  K3_CHECK(d >= 0 && d < config_.draft_vocab_size, "to_target_id: draft id " + std::to_string(d) + " out of range");
  if (!config_.has_d2t()) return d;
  return static_cast<int32_t>(d + weights_.d2t.data<const int64_t>()[d]);
}

DraftResult DraftModel::draft(const DraftCache& cache, int32_t x0, int max_tokens) const {
  const DraftCache* one = &cache;
  return std::move(draft_batch(std::span<const DraftCache* const>(&one, 1), std::span<const int32_t>(&x0, 1),
                               std::span<const int>(&max_tokens, 1))[0]);
}

std::vector<DraftResult> DraftModel::draft_batch(std::span<const DraftCache* const> caches, std::span<const int32_t> x0,
                                                 std::span<const int> max_tokens) const {
  const DraftConfig& c = config_;
  K3_CHECK(caches.size() == x0.size() && caches.size() == max_tokens.size(),
           "draft_batch: caches, tokens and max_tokens differ in length");
  std::vector<DraftResult> results(caches.size());
  // Only the requests that want drafts run the block pass, all in one.
  std::vector<const DraftCache*> run_caches;
  std::vector<int32_t> run_x0;
  std::vector<size_t> which;
  for (size_t i = 0; i < caches.size(); ++i)
    if (std::min(max_tokens[i], c.block_size) > 0) {
      run_caches.push_back(caches[i]);
      run_x0.push_back(x0[i]);
      which.push_back(i);
    }
  if (which.empty()) return results;
  const BlockOutput block = forward_blocks(run_caches, run_x0);
  const int64_t Vd = c.draft_vocab_size, K = c.block_size;
  for (size_t b = 0; b < which.size(); ++b) {
    DraftResult& r = results[which[b]];
    const int n = std::min(max_tokens[which[b]], c.block_size);
    r.logits = alloc(n, Vd);
    int32_t prev = run_x0[b];
    for (int k = 0; k < n; ++k) {
      const int64_t row = static_cast<int64_t>(b) * K + k;
      const std::vector<float> m = markov_bias(prev);
      const float* u = block.base_logits.data<const float>() + row * Vd;
      float* z = r.logits.data<float>() + int64_t{k} * Vd;
      int64_t best = 0;
      for (int64_t v = 0; v < Vd; ++v) {
        z[v] = u[v] + m[static_cast<size_t>(v)];
        if (z[v] > z[best]) best = v;  // strict: ties keep the lowest id
      }
      if (c.use_confidence_head)
        r.confidence.push_back(confidence(block.hidden.data<const float>() + row * c.hidden_size, prev));
      prev = to_target_id(static_cast<int32_t>(best));
      r.tokens.push_back(prev);
    }
  }
  return results;
}

}  // namespace k3::draft
