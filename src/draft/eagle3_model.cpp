// draft/eagle3_model.cpp: the EAGLE-3 draft forward (see eagle3_model.h for the math and layout).
#include "draft/eagle3_model.h"

#include <algorithm>

#include "core/error.h"
#include "kernels/sampling/sampling.h"

namespace k3::draft {

namespace {

void expect_shape(const core::Tensor& t, const core::Shape& s, const std::string& name) {
  K3_CHECK(t.defined(), "Eagle3Model: weight " + name + " is missing");
  K3_CHECK(t.shape() == s, "Eagle3Model: weight " + name + " is " + t.shape().str() + ", expected " + s.str());
  K3_CHECK(t.view().device == core::Device::cpu, "Eagle3Model: weight " + name + " must be a host tensor");
}

}  // namespace

Eagle3Model::Eagle3Model(const Eagle3Config& config, const Eagle3Weights& weights, const kernels::Registry& ops,
                         Eagle3Options options, std::shared_ptr<core::DeviceMemory> memory, core::Tensor device_embed)
    : config_(config),
      host_weights_(weights),
      ops_(ops),
      options_(options),
      memory_(memory ? std::move(memory) : core::make_host_memory()),
      weights_(&host_weights_),
      rope_(config.head_dim, config.rope_theta, config.rope_scaling.factor, config.rope_scaling.low_freq_factor,
            config.rope_scaling.high_freq_factor, config.rope_scaling.original_max_position_embeddings) {
  validate(config_, "Eagle3Model");
  const Eagle3Config& c = config_;
  const Eagle3Weights& w = host_weights_;
  const int64_t H = c.hidden_size, I = c.intermediate_size;
  expect_shape(w.embed, {c.vocab_size, H}, "embed_tokens.weight");
  expect_shape(w.fc.weight, {H, int64_t{c.num_taps()} * c.target_hidden_size}, "fc.weight");
  expect_shape(w.hidden_norm, {H}, "hidden_norm.weight");
  expect_shape(w.input_norm, {H}, "input_layernorm.weight");
  expect_shape(w.q_proj.weight, {c.q_width(), 2 * H}, "q_proj.weight");
  expect_shape(w.k_proj.weight, {c.kv_width(), 2 * H}, "k_proj.weight");
  expect_shape(w.v_proj.weight, {c.kv_width(), 2 * H}, "v_proj.weight");
  expect_shape(w.o_proj.weight, {H, c.q_width()}, "o_proj.weight");
  expect_shape(w.post_attn_norm, {H}, "post_attention_layernorm.weight");
  expect_shape(w.gate_proj.weight, {I, H}, "gate_proj.weight");
  expect_shape(w.up_proj.weight, {I, H}, "up_proj.weight");
  expect_shape(w.down_proj.weight, {H, I}, "down_proj.weight");
  expect_shape(w.final_norm, {H}, "norm.weight");
  expect_shape(w.lm_head.weight, {c.draft_vocab_size, H}, "lm_head.weight");
  if (c.has_d2t()) {
    expect_shape(w.d2t, {c.draft_vocab_size}, "d2t");
    K3_CHECK(w.d2t.dtype() == core::DType::i64, "Eagle3Model: d2t must be I64");
  }
  const core::Tensor freq = core::Tensor::copy_of(core::TensorView::contiguous(
      const_cast<float*>(rope_.inv_freq().data()), core::DType::f32, {static_cast<int64_t>(rope_.inv_freq().size())}));
  if (memory_->device() == core::Device::cpu) {
    inv_freq_ = freq;
    return;
  }
  auto up = [&](const core::Tensor& t) { return memory_->upload(t.view()); };
  auto up_lin = [&](const kernels::LinearWeight& l) { return kernels::LinearWeight{up(l.weight), {}}; };
  Eagle3Weights& d = device_weights_;
  if (device_embed.defined()) {
    K3_CHECK(device_embed.view().device == memory_->device() && device_embed.shape() == w.embed.shape() &&
                 device_embed.dtype() == w.embed.dtype(),
             "Eagle3Model: the device embedding must be the target's table " + w.embed.shape().str() +
                 " on its device");
    d.embed = device_embed;
  } else {
    d.embed = up(w.embed);
  }
  d.fc = up_lin(w.fc);
  d.hidden_norm = up(w.hidden_norm);
  d.input_norm = up(w.input_norm);
  d.q_proj = up_lin(w.q_proj);
  d.k_proj = up_lin(w.k_proj);
  d.v_proj = up_lin(w.v_proj);
  d.o_proj = up_lin(w.o_proj);
  d.post_attn_norm = up(w.post_attn_norm);
  d.gate_proj = up_lin(w.gate_proj);
  d.up_proj = up_lin(w.up_proj);
  d.down_proj = up_lin(w.down_proj);
  d.final_norm = up(w.final_norm);
  d.lm_head = up_lin(w.lm_head);
  weights_ = &device_weights_;
  inv_freq_ = up(freq);
}

core::Tensor Eagle3Model::alloc(int64_t rows, int64_t cols) const {
  core::Tensor t = memory_->empty(core::DType::f32, {rows, cols});
  if (options_.poison_buffers) memory_->fill_bytes(t.view(), 0xff);
  return t;
}

core::Tensor Eagle3Model::linear(const core::TensorView& x, const kernels::LinearWeight& w, bool round_output) const {
  core::Tensor y = alloc(x.dim(0), w.out_features());
  ops_.linear.run({x, &w, y.view(), round_output, options_.precision}, device());
  return y;
}

core::Tensor Eagle3Model::rmsnorm(const core::TensorView& x, const core::Tensor& w) const {
  core::Tensor y = alloc(x.dim(0), x.dim(1));
  ops_.rmsnorm.run({x, w.view(), y.view(), config_.rms_norm_eps, options_.rmsnorm_style, options_.precision}, device());
  return y;
}

core::Tensor Eagle3Model::add(const core::TensorView& a, const core::TensorView& b) const {
  core::Tensor y = alloc(a.dim(0), a.dim(1));
  ops_.add.run({a, b, y.view(), options_.precision}, device());
  return y;
}

void Eagle3Model::append(RowBuffer& buf, const core::TensorView& rows) const { append_rows(*memory_, buf, rows); }

void Eagle3Model::keep_rows(RowBuffer& buf, int64_t n) const { draft::keep_rows(buf, n); }

void Eagle3Model::copy_rows(const core::Tensor& dst, int64_t r0, const core::TensorView& src) const {
  if (src.dim(0) > 0) memory_->copy(rows_of(dst.view(), r0, src.dim(0)), src);
}

core::Tensor Eagle3Model::fuse_taps(const core::TensorView& taps) const {
  const int64_t width = int64_t{config_.num_taps()} * config_.target_hidden_size;
  K3_CHECK(taps.device == device() && taps.dtype == core::DType::f32,
           "Eagle3Model::fuse_taps: taps must be f32 on the model's device");
  K3_CHECK(taps.rank() == 2 && taps.dim(1) == width && taps.strides[1] == 1,
           "Eagle3Model::fuse_taps: taps must be [rows, " + std::to_string(width) + "] (" +
               std::to_string(config_.num_taps()) + " taps x " + std::to_string(config_.target_hidden_size) +
               "), got " + taps.shape.str());
  return linear(taps, weights_->fc);
}

Eagle3Output Eagle3Model::forward(std::span<Eagle3Cache* const> caches, std::span<const int64_t> rows,
                                  std::span<const int32_t> tokens, const core::TensorView& hidden) const {
  const Eagle3Config& c = config_;
  const Eagle3Weights& w = *weights_;
  const int64_t H = c.hidden_size, N = static_cast<int64_t>(tokens.size());
  K3_CHECK(caches.size() == rows.size(), "Eagle3Model::forward: " + std::to_string(caches.size()) + " caches for " +
                                             std::to_string(rows.size()) + " row counts");
  int64_t total = 0;
  for (int64_t n : rows) {
    K3_CHECK(n >= 0, "Eagle3Model::forward: negative row count");
    total += n;
  }
  K3_CHECK(total == N, "Eagle3Model::forward: " + std::to_string(N) + " tokens for " + std::to_string(total) + " rows");
  K3_CHECK(hidden.device == device() && hidden.dtype == core::DType::f32 && hidden.rank() == 2 && hidden.dim(0) == N &&
               hidden.dim(1) == H,
           "Eagle3Model::forward: hidden must be f32 [" + std::to_string(N) + ", " + std::to_string(H) +
               "] on the model's device, got " + hidden.shape.str());
  for (int32_t t : tokens)
    K3_CHECK(t >= 0 && t < c.vocab_size,
             "Eagle3Model::forward: token " + std::to_string(t) + " outside [0, " + std::to_string(c.vocab_size) + ")");
  Eagle3Output out;
  if (N == 0) {
    out.normed = alloc(0, H);
    out.prenorm = alloc(0, H);
    return out;
  }
  core::Tensor host_ids = core::Tensor::zeros(core::DType::i32, {N});
  std::copy(tokens.begin(), tokens.end(), host_ids.data<int32_t>());
  const core::Tensor ids = memory_->upload(host_ids.view());
  const core::Tensor emb = alloc(N, H);
  ops_.embedding.run({ids.view(), w.embed.view(), emb.view()}, device());
  const core::Tensor e = rmsnorm(emb.view(), w.input_norm);
  const core::Tensor n = rmsnorm(hidden, w.hidden_norm);
  const core::TensorView residual = c.norm_before_residual ? n.view() : hidden;
  const core::Tensor x = alloc(N, 2 * H);
  memory_->copy(cols_of(x.view(), 0, H), e.view());
  memory_->copy(cols_of(x.view(), H, 2 * H), n.view());
  const core::Tensor q = linear(x.view(), w.q_proj), k = linear(x.view(), w.k_proj), v = linear(x.view(), w.v_proj);
  const core::Tensor a = alloc(N, c.q_width());
  int64_t row0 = 0;
  for (size_t b = 0; b < caches.size(); ++b) {
    Eagle3Cache& cache = *caches[b];
    const int64_t m = rows[b];
    if (m == 0) continue;
    const int64_t past = cache.rows();
    reserve_rows(*memory_, cache.k, past + m, c.kv_width());
    reserve_rows(*memory_, cache.v, past + m, c.kv_width());
    ops_.rope_gqa_attention.run({rows_of(q.view(), row0, m), rows_of(k.view(), row0, m), rows_of(v.view(), row0, m),
                                 cache.k.data.view(), cache.v.data.view(), inv_freq_.view(), rows_of(a.view(), row0, m),
                                 past, cache.end_position(), c.num_heads, c.num_kv_heads, c.head_dim,
                                 options_.precision},
                                device());
    cache.k.rows += m;
    cache.v.rows += m;
    row0 += m;
  }
  const core::Tensor r1 = add(linear(a.view(), w.o_proj).view(), residual);
  const core::Tensor h = rmsnorm(r1.view(), w.post_attn_norm);
  const core::Tensor act = linear(h.view(), w.gate_proj);
  const core::Tensor up = linear(h.view(), w.up_proj);
  ops_.silu_glu.run({act.view(), up.view(), act.view(), options_.precision}, device());
  out.prenorm = add(linear(act.view(), w.down_proj).view(), r1.view());
  out.normed = rmsnorm(out.prenorm.view(), w.final_norm);
  return out;
}

core::Tensor Eagle3Model::logits(const core::TensorView& normed) const {
  return linear(normed, weights_->lm_head, /*round_output=*/false);
}

std::vector<int32_t> Eagle3Model::greedy_tokens(const core::TensorView& logits) const {
  const int64_t R = logits.dim(0);
  if (R == 0) return {};
  std::vector<kernels::SampleRowParams> params(static_cast<size_t>(R));
  for (int64_t r = 0; r < R; ++r) params[static_cast<size_t>(r)].logits_row = static_cast<int32_t>(r);  // greedy
  const core::Tensor host_params = kernels::pack_sample_params(params);
  const core::Tensor p = memory_->upload(host_params.view());
  const core::Tensor out = alloc(R, 2);
  ops_.sample.run({logits, p.view(), out.view()}, device());
  const core::Tensor got = memory_->download_f32(out.view());
  std::vector<int32_t> tokens;
  for (int64_t r = 0; r < R; ++r) {
    const auto d = static_cast<int32_t>(got.data<const float>()[r * 2 + kernels::kOutToken]);
    K3_CHECK(d >= 0, "Eagle3Model: the draft's logits row " + std::to_string(r) + " holds NaN or inf");
    tokens.push_back(to_target_id(d));
  }
  return tokens;
}

int32_t Eagle3Model::to_target_id(int32_t draft_id) const {
  K3_CHECK(draft_id >= 0 && draft_id < config_.draft_vocab_size,
           "Eagle3Model: draft id " + std::to_string(draft_id) + " outside the draft vocabulary");
  if (!config_.has_d2t()) return draft_id;
  return static_cast<int32_t>(draft_id + host_weights_.d2t.data<const int64_t>()[draft_id]);
}

void Eagle3Model::truncate(Eagle3Cache& cache, int64_t end_position) const {
  K3_CHECK(end_position >= cache.first_position && end_position <= cache.end_position(),
           "Eagle3Model::truncate: " + std::to_string(end_position) + " is outside [" +
               std::to_string(cache.first_position) + ", " + std::to_string(cache.end_position()) + "]");
  keep_rows(cache.k, end_position - cache.first_position);
  keep_rows(cache.v, end_position - cache.first_position);
}

}  // namespace k3::draft
