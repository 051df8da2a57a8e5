// draft/draft_model.cpp: the DSpark draft forward (see draft_model.h for the math and layout).
#include "draft/draft_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>

#include "core/error.h"
#include "draft/rope.h"
#include "model/weights.h"

namespace k3::draft {

namespace {

void expect_shape(const core::Tensor& t, const core::Shape& s, const std::string& name) {
  K3_CHECK(t.defined(), "DraftModel: weight " + name + " is missing");
  K3_CHECK(t.shape() == s, "DraftModel: weight " + name + " is " + t.shape().str() + ", expected " + s.str());
}

// The interleaved RoPE's inverse frequencies, as draft/rope.h's apply_rope computes them.
core::Tensor rope_inv_freq(int dim, float theta) {
  core::Tensor f = core::Tensor::zeros(core::DType::f32, {dim / 2});
  for (int i = 0; i < dim / 2; ++i)
    f.data<float>()[i] = 1.0f / std::pow(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
  return f;
}

// Rows [0, 0) of `cols` columns on `device` (an empty cache's latents).
core::TensorView no_rows(int64_t cols, core::Device device) {
  core::TensorView v = core::TensorView::contiguous(nullptr, core::DType::f32, {0, cols});
  v.device = device;
  return v;
}

}  // namespace

int64_t DraftCache::bytes() const {
  int64_t n = 0;
  for (const RowBuffer& l : layers) n += l.bytes();
  return n;
}

DraftModel::DraftModel(const DraftConfig& config, const DraftWeights& weights, const kernels::Registry& ops,
                       DraftOptions options, std::shared_ptr<core::DeviceMemory> memory,
                       const model::Weights* device_target)
    : config_(config),
      host_weights_(weights),
      ops_(ops),
      options_(options),
      memory_(memory ? std::move(memory) : core::make_host_memory()),
      weights_(&host_weights_) {
  validate(config_, "DraftModel");
  const DraftConfig& c = config_;
  const DraftWeights& hw = host_weights_;
  K3_CHECK(static_cast<int>(hw.layers.size()) == c.num_layers,
           "DraftModel: weights have " + std::to_string(hw.layers.size()) + " layers, config has " +
               std::to_string(c.num_layers));
  // Every stored tensor against the inventory, plus the aliased embedding (and a shared lm_head).
  std::map<std::string, core::Tensor> by_name = {{"context_proj.weight", hw.context_proj.weight},
                                                 {"context_norm.weight", hw.context_norm},
                                                 {"norm.weight", hw.final_norm},
                                                 {"markov_w1.weight", hw.markov_w1},
                                                 {"markov_w2.weight", hw.markov_w2.weight},
                                                 {"confidence_head.weight", hw.confidence_head.weight},
                                                 {"d2t", hw.d2t},
                                                 {"lm_head.weight", hw.lm_head.weight}};
  for (int l = 0; l < c.num_layers; ++l) {
    const DraftLayerWeights& w = hw.layers[static_cast<size_t>(l)];
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
             "DraftModel: " + p.name + " must be a host tensor (the loaded checkpoint's; the model uploads it)");
  }
  K3_CHECK(hw.embed.view().device == core::Device::cpu && hw.lm_head.weight.view().device == core::Device::cpu,
           "DraftModel: the target's embedding / lm_head it aliases must be host tensors (the loaded checkpoint's "
           "weights, not the device copy; pass that as device_target)");
  expect_shape(hw.embed, {c.vocab_size, c.hidden_size}, "embed (the target's embed_tokens)");
  expect_shape(hw.lm_head.weight, {c.draft_vocab_size, c.hidden_size}, "lm_head.weight");
  K3_CHECK(!hw.lm_head.is_mxfp4(), "DraftModel: lm_head must be BF16 or F32");
  const core::Tensor freq = rope_inv_freq(c.qk_rope_head_dim, c.rope_theta);
  if (device() == core::Device::cpu) {
    inv_freq_ = freq;
    return;
  }
  K3_CHECK(options_.absorbed_attention,
           "DraftModel: on a GPU the block attention runs absorbed only (DraftOptions::absorbed_attention)");
  auto up = [&](const core::Tensor& t) { return t.defined() ? memory_->upload(t.view()) : core::Tensor{}; };
  auto up_lin = [&](const kernels::LinearWeight& l) { return kernels::LinearWeight{up(l.weight), up(l.scale)}; };
  DraftWeights& d = device_weights_;
  const bool target_table = device_target != nullptr && device_target->embed.defined() &&
                            device_target->embed.view().device == device() &&
                            device_target->embed.shape() == hw.embed.shape() &&
                            device_target->embed.dtype() == hw.embed.dtype();
  d.embed = target_table ? device_target->embed : up(hw.embed);
  const bool target_head = c.share_target_lm_head && device_target != nullptr &&
                           device_target->lm_head.weight.defined() &&
                           device_target->lm_head.weight.view().device == device() &&
                           device_target->lm_head.weight.shape() == hw.lm_head.weight.shape() &&
                           !device_target->lm_head.is_mxfp4();
  d.lm_head = target_head ? device_target->lm_head : up_lin(hw.lm_head);
  d.context_proj = up_lin(hw.context_proj);
  d.context_norm = up(hw.context_norm);
  for (const DraftLayerWeights& w : hw.layers)
    d.layers.push_back({up(w.input_norm), up_lin(w.q_a_proj), up(w.q_a_norm), up_lin(w.q_b_proj), up_lin(w.kv_a_proj),
                        up(w.kv_a_norm), up_lin(w.kv_b_proj), up_lin(w.o_proj), up(w.post_attn_norm),
                        up_lin(w.gate_proj), up_lin(w.up_proj), up_lin(w.down_proj)});
  d.final_norm = up(hw.final_norm);
  d.markov_w1 = up(hw.markov_w1);
  d.markov_w2 = up_lin(hw.markov_w2);
  d.d2t = up(hw.d2t);  // the confidence head stays on the host: it reads the downloaded hidden rows
  weights_ = &device_weights_;
  inv_freq_ = up(freq);
}

core::Tensor DraftModel::alloc(int64_t rows, int64_t cols) const {
  core::Tensor t = memory_->empty(core::DType::f32, {rows, cols});
  if (options_.poison_buffers) memory_->fill_bytes(t.view(), 0xff);
  return t;
}

core::Tensor DraftModel::linear(const core::TensorView& x, const kernels::LinearWeight& w, bool round_output) const {
  core::Tensor y = alloc(x.dim(0), w.out_features());
  ops_.linear.run({x, &w, y.view(), round_output, options_.precision}, device());
  return y;
}

core::Tensor DraftModel::rmsnorm(const core::TensorView& x, const core::Tensor& w) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops_.rmsnorm.run({x, w.view(), y.view(), config_.rms_norm_eps, options_.rmsnorm_style, options_.precision}, device());
  return y;
}

core::Tensor DraftModel::add(const core::TensorView& a, const core::TensorView& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops_.add.run({a, b, y.view(), options_.precision}, device());
  return y;
}

core::Tensor DraftModel::upload_i32(std::span<const int32_t> values) const {
  core::Tensor host = core::Tensor::zeros(core::DType::i32, {static_cast<int64_t>(values.size())});
  std::copy(values.begin(), values.end(), host.data<int32_t>());
  return memory_->upload(host.view());
}

DraftCache DraftModel::new_cache(int64_t first_position) const {
  K3_CHECK(first_position >= 0, "new_cache: negative first position " + std::to_string(first_position));
  DraftCache c;
  c.first_position = first_position;
  c.layers.resize(static_cast<size_t>(config_.num_layers));
  return c;
}

core::Tensor DraftModel::latent_rows(const DraftLayerWeights& w, const core::TensorView& x) const {
  const int64_t L = config_.kv_lora_rank, n = x.dim(0);
  const core::Tensor kv = linear(x, w.kv_a_proj);  // [n, r_kv + dr]
  const core::Tensor c = alloc(n, L);
  memory_->copy(c.view(), cols_of(kv.view(), 0, L));
  memory_->copy(cols_of(kv.view(), 0, L), rmsnorm(c.view(), w.kv_a_norm).view());
  return kv;
}

void DraftModel::rotate_latents(const core::TensorView& rows, int64_t position) const {
  const DraftConfig& c = config_;
  ops_.rope_pairs.run({rows, inv_freq_.view(), c.kv_lora_rank, 0, 1, c.qk_rope_head_dim, position, options_.precision},
                      device());
}

void DraftModel::append_context(DraftCache& cache, const core::TensorView& taps) const {
  const DraftConfig& c = config_;
  const int64_t width = int64_t{c.num_taps()} * c.hidden_size;
  K3_CHECK(taps.device == device() && taps.dtype == core::DType::f32,
           "append_context: taps must be f32 on the model's device");
  K3_CHECK(taps.rank() == 2 && taps.dim(1) == width && taps.strides[1] == 1,
           "append_context: taps must be [rows, " + std::to_string(width) + "] (" + std::to_string(c.num_taps()) +
               " taps x hidden " + std::to_string(c.hidden_size) + "), got " + taps.shape.str());
  K3_CHECK(cache.layers.size() == static_cast<size_t>(c.num_layers), "append_context: cache is not from this model");
  if (taps.dim(0) == 0) return;
  const core::Tensor x = alloc(taps.dim(0), width);  // the view's rows may be strided
  memory_->copy(x.view(), taps);
  const core::Tensor ctx = rmsnorm(linear(x.view(), weights_->context_proj).view(), weights_->context_norm);  // [n, H]
  for (int l = 0; l < c.num_layers; ++l) {
    const core::Tensor rows = latent_rows(weights_->layers[static_cast<size_t>(l)], ctx.view());
    rotate_latents(rows.view(), cache.end_position());
    append_rows(*memory_, cache.layers[static_cast<size_t>(l)], rows.view());
  }
  cache.num_context += taps.dim(0);
}

void DraftModel::truncate(DraftCache& cache, int64_t num_context) const {
  K3_CHECK(num_context >= 0 && num_context <= cache.num_context,
           "truncate: " + std::to_string(num_context) + " is outside [0, " + std::to_string(cache.num_context) + "]");
  for (RowBuffer& l : cache.layers) keep_rows(l, num_context);
  cache.num_context = num_context;
}

core::Tensor DraftModel::attention(const DraftLayerWeights& w, std::span<const DraftCache* const> caches, int layer,
                                   const core::Tensor& x) const {
  const DraftConfig& c = config_;
  const int64_t K = c.block_size, B = static_cast<int64_t>(caches.size()), L = c.kv_lora_rank;
  // q [B*K, NH*(dn+dr)]; the block's latents [B*K, cache_dim] (not stored).
  const core::Tensor q = linear(rmsnorm(linear(x.view(), w.q_a_proj).view(), w.q_a_norm).view(), w.q_b_proj);
  const core::Tensor block = latent_rows(w, x.view());
  for (int64_t b = 0; b < B; ++b) {  // request b's rows sit at positions E_b .. E_b + K - 1 (E_b its end)
    const int64_t P = caches[static_cast<size_t>(b)]->end_position();
    ops_.rope_pairs.run({rows_of(q.view(), b * K, K), inv_freq_.view(), c.qk_nope_head_dim, c.q_head_dim(), c.num_heads,
                         c.qk_rope_head_dim, P, options_.precision},
                        device());
    rotate_latents(rows_of(block.view(), b * K, K), P);
  }
  const core::Tensor o = alloc(B * K, int64_t{c.num_heads} * c.v_head_dim);
  auto context = [&](int64_t b) {
    const RowBuffer& rows = caches[static_cast<size_t>(b)]->layers[static_cast<size_t>(layer)];
    return rows.rows > 0 ? rows.view() : no_rows(c.cache_dim(), device());
  };
  if (options_.absorbed_attention) {
    for (int64_t b = 0; b < B; ++b)
      ops_.mla_block_attention.run({rows_of(q.view(), b * K, K), context(b), rows_of(block.view(), b * K, K),
                                    &w.kv_b_proj, rows_of(o.view(), b * K, K), c.num_heads, c.qk_nope_head_dim,
                                    c.qk_rope_head_dim, c.v_head_dim, c.softmax_scale(), options_.precision},
                                   device());
    return linear(o.view(), w.o_proj);
  }
  // The expanded form (CPU only): request b's keys are its P_b context rows, then its K block rows;
  // all requests' rows stacked so kv_b_proj expands them in one linear.
  int64_t total = 0;
  for (const DraftCache* cache : caches) total += cache->num_context + K;
  const core::Tensor latents = alloc(total, c.cache_dim());
  std::vector<int64_t> begin;
  int64_t row = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t P = caches[static_cast<size_t>(b)]->num_context;
    begin.push_back(row);
    if (P > 0) memory_->copy(rows_of(latents.view(), row, P), context(b));
    memory_->copy(rows_of(latents.view(), row + P, K), rows_of(block.view(), b * K, K));
    row += P + K;
  }
  const core::Tensor lat_c = alloc(total, L);
  memory_->copy(lat_c.view(), cols_of(latents.view(), 0, L));
  const core::Tensor kv = linear(lat_c.view(), w.kv_b_proj);  // [total, NH*(dn+dv)]
  for (int64_t b = 0; b < B; ++b) {
    const int64_t S = caches[static_cast<size_t>(b)]->num_context + K, r0 = begin[static_cast<size_t>(b)];
    block_attention(c, rows_of(q.view(), b * K, K), rows_of(latents.view(), r0, S), rows_of(kv.view(), r0, S),
                    rows_of(o.view(), b * K, K), options_.precision);
  }
  return linear(o.view(), w.o_proj);
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
  const core::Tensor id_tensor = upload_i32(ids);
  core::Tensor h = alloc(B * K, c.hidden_size);
  ops_.embedding.run({id_tensor.view(), weights_->embed.view(), h.view()}, device());
  for (int l = 0; l < c.num_layers; ++l) {
    const DraftLayerWeights& w = weights_->layers[static_cast<size_t>(l)];
    h = add(h.view(), attention(w, caches, l, rmsnorm(h.view(), w.input_norm)).view());
    const core::Tensor x = rmsnorm(h.view(), w.post_attn_norm);
    const core::Tensor act = alloc(B * K, c.intermediate_size);
    const core::Tensor gate = linear(x.view(), w.gate_proj), up = linear(x.view(), w.up_proj);
    ops_.situ_glu.run({gate.view(), up.view(), act.view(), c.situ_beta, c.situ_linear_beta, options_.precision},
                      device());
    h = add(h.view(), linear(act.view(), w.down_proj).view());
  }
  BlockOutput out;
  out.hidden = rmsnorm(h.view(), weights_->final_norm);
  out.base_logits = linear(out.hidden.view(), weights_->lm_head, /*round_output=*/false);
  return out;
}

std::vector<float> DraftModel::markov_bias(int32_t prev) const {
  const DraftConfig& c = config_;
  K3_CHECK(prev >= 0 && prev < c.vocab_size, "markov_bias: token " + std::to_string(prev) + " outside the vocabulary");
  core::Tensor e = core::Tensor::zeros(core::DType::f32, {1, c.markov_rank});
  const core::TensorView row = host_weights_.markov_w1.view().row(prev);
  for (int64_t i = 0; i < c.markov_rank; ++i) e.data<float>()[i] = kernels::load_f32(row, i);
  core::Tensor m = core::Tensor::zeros(core::DType::f32, {1, c.draft_vocab_size});
  ops_.linear.run({e.view(), &host_weights_.markov_w2, m.view(), /*round_output=*/false, options_.precision},
                  core::Device::cpu);
  return {m.data<const float>(), m.data<const float>() + m.numel()};
}

float DraftModel::confidence(const float* hidden_row, int32_t prev) const {
  const DraftConfig& c = config_;
  K3_CHECK(c.use_confidence_head, "confidence: the draft has no confidence head");
  std::vector<float> w(static_cast<size_t>(c.hidden_size + c.markov_rank));
  host_weights_.confidence_head.load_row(0, w.data());
  const core::TensorView row = host_weights_.markov_w1.view().row(prev);
  float z = 0.0f;
  for (int i = 0; i < c.hidden_size; ++i) z += w[static_cast<size_t>(i)] * hidden_row[i];
  for (int i = 0; i < c.markov_rank; ++i) z += w[static_cast<size_t>(c.hidden_size + i)] * kernels::load_f32(row, i);
  return 1.0f / (1.0f + std::exp(-z));
}

int32_t DraftModel::to_target_id(int32_t d) const {
  K3_CHECK(d >= 0 && d < config_.draft_vocab_size, "to_target_id: draft id " + std::to_string(d) + " out of range");
  if (!config_.has_d2t()) return d;
  return static_cast<int32_t>(d + host_weights_.d2t.data<const int64_t>()[d]);
}

DraftResult DraftModel::draft(const DraftCache& cache, int32_t x0, int max_tokens, bool with_logits) const {
  const DraftCache* one = &cache;
  return std::move(draft_batch(std::span<const DraftCache* const>(&one, 1), std::span<const int32_t>(&x0, 1),
                               std::span<const int>(&max_tokens, 1), with_logits)[0]);
}

std::vector<DraftResult> DraftModel::draft_batch(std::span<const DraftCache* const> caches, std::span<const int32_t> x0,
                                                 std::span<const int> max_tokens, bool with_logits) const {
  const DraftConfig& c = config_;
  K3_CHECK(caches.size() == x0.size() && caches.size() == max_tokens.size(),
           "draft_batch: caches, tokens and max_tokens differ in length");
  std::vector<DraftResult> results(caches.size());
  // Only the requests that want drafts run the block pass, all in one; their chains run as far as
  // the longest wants (a chain's first steps do not depend on its length).
  std::vector<const DraftCache*> run_caches;
  std::vector<int32_t> run_x0;
  std::vector<size_t> which;
  int n = 0;
  for (size_t i = 0; i < caches.size(); ++i)
    if (std::min(max_tokens[i], c.block_size) > 0) {
      run_caches.push_back(caches[i]);
      run_x0.push_back(x0[i]);
      which.push_back(i);
      n = std::max(n, std::min(max_tokens[i], c.block_size));
    }
  if (which.empty()) return results;
  const BlockOutput block = forward_blocks(run_caches, run_x0);
  const int64_t Vd = c.draft_vocab_size, B = static_cast<int64_t>(which.size());
  const core::Tensor x0_dev = upload_i32(run_x0);
  const core::Tensor tokens = memory_->empty(core::DType::i32, {B, n});
  const core::Tensor logits = alloc(B * n, Vd);
  const core::TensorView d2t = weights_->d2t.defined() ? weights_->d2t.view() : core::TensorView{};
  ops_.markov_draft.run({block.base_logits.view(), x0_dev.view(), weights_->markov_w1.view(), &weights_->markov_w2, d2t,
                         tokens.view(), logits.view(), c.block_size},
                        device());
  // The tokens' bits come back through an f32 view of them (download_f32 copies f32 unchanged).
  core::TensorView bits = tokens.view();
  bits.dtype = core::DType::f32;
  const core::Tensor host_tokens = memory_->download_f32(bits);
  const auto* ids_back = reinterpret_cast<const int32_t*>(host_tokens.data<const float>());
  const core::Tensor host_logits = with_logits ? memory_->download_f32(logits.view()) : core::Tensor{};
  const core::Tensor host_hidden = c.use_confidence_head ? memory_->download_f32(block.hidden.view()) : core::Tensor{};
  for (size_t b = 0; b < which.size(); ++b) {
    DraftResult& r = results[which[b]];
    const int m = std::min(max_tokens[which[b]], c.block_size);
    r.tokens.assign(ids_back + static_cast<int64_t>(b) * n, ids_back + static_cast<int64_t>(b) * n + m);
    if (with_logits)
      r.logits = core::Tensor::copy_of(core::TensorView::contiguous(
          const_cast<float*>(host_logits.data<const float>()) + static_cast<int64_t>(b) * n * Vd, core::DType::f32,
          {m, Vd}));
    if (c.use_confidence_head) {
      int32_t prev = run_x0[b];
      for (int k = 0; k < m; ++k) {
        const int64_t row = static_cast<int64_t>(b) * c.block_size + k;
        r.confidence.push_back(confidence(host_hidden.data<const float>() + row * c.hidden_size, prev));
        prev = r.tokens[static_cast<size_t>(k)];
      }
    }
  }
  return results;
}

}  // namespace k3::draft
