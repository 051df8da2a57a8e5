// model/model.cpp: the top-level forward pass over the AttnRes stream (spec §3).
#include "model/model.h"

#include <cstring>
#include <variant>

#include "config/shard.h"
#include "model/step_batches.h"

namespace k3::model {

namespace {

void check_schedule(const config::K3Config& c, const Weights& w) {
  K3_CHECK(static_cast<int>(w.layers.size()) == c.num_hidden_layers, "weights have " + std::to_string(w.layers.size()) +
                                                                         " layers, config has " +
                                                                         std::to_string(c.num_hidden_layers));
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const auto& lw = w.layers[static_cast<size_t>(l)];
    const bool kda = std::holds_alternative<KdaWeights>(lw.attn);
    const bool moe = std::holds_alternative<MoeWeights>(lw.ffn);
    K3_CHECK(kda == (c.attn_kind(l) == config::AttnKind::kda),
             "layer " + std::to_string(l) + ": attention weights do not match the config's layer lists");
    K3_CHECK(moe == (c.ffn_kind(l) == config::FfnKind::moe),
             "layer " + std::to_string(l) + ": FFN weights do not match first_k_dense_replace/moe_layer_freq");
  }
}

}  // namespace

core::Tensor layer_forward(const ForwardContext& ctx, int l, const LayerWeights& lw, const core::Tensor& router_bias,
                           std::vector<core::Tensor>& bank, const core::Tensor& prefix_in) {
  core::Tensor prefix = prefix_in;
  core::Tensor h = attn_res_mix(ctx, bank, prefix, lw.attn_res);
  ctx.emit("attn_res.mix", l, h);  // the attention-side mixture: a drafter's tap of layer l - 1 (spec §13.2)
  if (ctx.taps)
    for (size_t i = 0; i < ctx.taps->layers.size(); ++i)
      if (ctx.taps->layers[i] + 1 == l) ctx.taps->values[i] = h;
  const bool restart = ctx.config.is_bank_write_layer(l);
  if (restart) bank.push_back(prefix);  // snapshot the block sum before restarting
  const core::Tensor x = ctx.rmsnorm(h, lw.input_norm, ctx.config.rms_norm_eps);
  // o_proj is row-parallel: under TP each rank's partial is summed over the ranks here.
  const core::Tensor a = ctx.reduce_partial(
      std::visit([&](const auto& w) { return attention(ctx, l, w, x); }, lw.attn));
  ctx.emit("attn.out", l, a);
  prefix = restart ? a : ctx.add(prefix, a);

  h = attn_res_mix(ctx, bank, prefix, lw.mlp_res);
  const core::Tensor fx = ctx.rmsnorm(h, lw.post_attn_norm, ctx.config.rms_norm_eps);
  const core::Tensor f = std::visit(
      [&](const auto& w) {
        if constexpr (std::is_same_v<std::decay_t<decltype(w)>, MoeWeights>) return ffn(ctx, l, w, router_bias, fx);
        else return ffn(ctx, l, w, fx);
      },
      lw.ffn);
  ctx.emit("ffn.out", l, f);
  prefix = ctx.add(prefix, f);
  ctx.emit("prefix", l, prefix);
  return prefix;
}

Model::Model(const config::K3Config& config, const Weights& weights, const kernels::Registry& ops, ModelOptions options,
             std::shared_ptr<core::DeviceMemory> memory, comm::Communicator* comm)
    : config_(config), weights_(weights), ops_(ops), options_(options), memory_(std::move(memory)), comm_(comm) {
  K3_CHECK(memory_ && memory_->device() == options_.device,
           "Model: the DeviceMemory is not on the device the options name (" +
               std::string(core::device_name(options_.device)) + ")");
  if (comm_) {
    K3_CHECK(comm_->device() == options_.device,
             "Model: the communicator works on " + std::string(core::device_name(comm_->device())) +
                 " tensors but the model runs on " + std::string(core::device_name(options_.device)));
    K3_CHECK(weights_.embed.dim(0) == config_.vocab_size,
             "Model: rank " + std::to_string(comm_->rank()) + " of " + std::to_string(comm_->size()) + " has " +
                 std::to_string(weights_.embed.dim(0)) + " embedding rows but its config has vocab_size " +
                 std::to_string(config_.vocab_size) + " (give each rank config::shard_config and its weight slices)");
  }
  check_dcp_size(options_.dcp, tp_size());  // DCP splits the cache over exactly the TP group
  config::check_expert_parallel(options_.expert_parallel, tp_size());
  check_schedule(config_, weights_);
  for (const LayerWeights& lw : weights_.layers)  // the weights must be sharded as the options say
    if (const auto* moe = std::get_if<MoeWeights>(&lw.ffn))
      K3_CHECK(moe->expert_parallel() == options_.expert_parallel,
               std::string("Model: the routed experts are ") +
                   (moe->expert_parallel() ? "whole experts of one expert-parallel rank" : "not split by expert") +
                   " but options.expert_parallel is " + (options_.expert_parallel ? "on" : "off") +
                   " (load with config::TpShard::expert_parallel as the options say)");
  router_bias_.resize(weights_.layers.size());
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const auto* moe = std::get_if<MoeWeights>(&weights_.layers[l].ffn);
    if (!moe) continue;
    // The weights may be on the device: read the bias through a host copy.
    const core::Tensor src = options_.device == core::Device::cpu ? moe->router_bias
                                                                  : memory_->download_f32(moe->router_bias.view());
    core::Tensor bias = core::Tensor::zeros(core::DType::f32, {src.numel()});
    for (int64_t e = 0; e < bias.numel(); ++e)
      bias.data<float>()[e] = kernels::round_act(kernels::load_f32(src.view(), e), options_.precision);
    router_bias_[l] = options_.device == core::Device::cpu ? std::move(bias) : memory_->upload(bias.view());
  }
}

void Model::check_step(const KvStorage& kv, std::span<const SequenceInput> batch) const {
  K3_CHECK(!batch.empty(), "forward: empty batch");
  for (const SequenceInput& in : batch) {
    K3_CHECK(in.state != nullptr, "forward: a sequence has no state");
    K3_CHECK(!in.tokens.empty(), "forward: a sequence has no tokens");
    // Under decode context parallelism the table covers this rank's LOCAL positions.
    const int64_t need = context_split().local_tokens(in.state->num_tokens + static_cast<int64_t>(in.tokens.size()));
    const int64_t have = static_cast<int64_t>(in.state->block_table.size()) * kv.storage_config().block_size;
    K3_CHECK(need <= have, "forward: a sequence's block table covers " + std::to_string(have) +
                               " tokens, the step needs " + std::to_string(need) +
                               (options_.dcp > 1 ? " (local positions of this rank)" : ""));
  }
}

core::Tensor Model::forward(KvStorage& kv, std::span<const SequenceInput> batch, LogitRows rows, const TraceFn* trace,
                            VerifyCapture* capture, HiddenTaps* taps, LogitsAt at, DecodePath path) const {
  memory_->make_current();  // before any upload: the thread may have last used another GPU
  check_step(kv, batch);
  if (taps) prepare_taps(*taps);
  // Lay the sequences out as consecutive row segments.
  std::vector<Segment> segments;
  std::vector<int32_t> ids;
  if (capture) capture->clear();
  for (const SequenceInput& in : batch) {
    const auto begin = static_cast<int64_t>(ids.size());
    ids.insert(ids.end(), in.tokens.begin(), in.tokens.end());
    segments.push_back({begin, static_cast<int64_t>(ids.size()), in.state, in.kind, in.verify, in.all_rows_logits()});
    if (!in.verify) continue;
    K3_CHECK(in.kind == StepKind::decode, "forward: a verify sequence must be of the decode kind");
    K3_CHECK(capture != nullptr, "forward: verify sequences need a VerifyCapture");
    capture->states.push_back(in.state);
    capture->row_begin.push_back(capture->total_rows);
    capture->rows.push_back(static_cast<int64_t>(in.tokens.size()));
    capture->start.push_back(in.state->num_tokens);
    capture->total_rows += static_cast<int64_t>(in.tokens.size());
  }
  if (capture) capture->layers.resize(static_cast<size_t>(config_.num_hidden_layers));
  const auto n = static_cast<int64_t>(ids.size());
  const StepTables tables(segments, kv.storage_config().block_size, *memory_, {}, context_split());
  const core::Tensor dev_ids = memory_->upload(core::TensorView::contiguous(ids.data(), core::DType::i32, {n}));
  const core::Tensor logits = run_step(kv, segments, tables.batches(), dev_ids.view(), rows, path, trace, capture,
                                       taps);
  for (const Segment& s : segments) s.state->num_tokens += s.rows();
  return options_.device == core::Device::cpu || at == LogitsAt::device ? logits : memory_->download_f32(logits.view());
}

void Model::prepare_taps(HiddenTaps& taps) const {
  for (int32_t l : taps.layers)
    K3_CHECK(l >= 0 && l + 1 < config_.num_hidden_layers, "forward: tap layer " + std::to_string(l) +
                                                              " has no next layer (the model has " +
                                                              std::to_string(config_.num_hidden_layers) + ")");
  taps.values.assign(taps.layers.size(), core::Tensor());
}

core::Tensor Model::run_step(KvStorage& kv, std::span<const Segment> segments, const StepBatches& batches,
                             const core::TensorView& ids, LogitRows rows, DecodePath path, const TraceFn* trace,
                             VerifyCapture* capture, HiddenTaps* taps) const {
  const int64_t n = ids.numel();
  const ForwardContext ctx{config_, kv, ops_, options_, segments, batches, *memory_, trace, comm_, capture, taps};
  if (path == DecodePath::fused) {
    const FusedScope scope = fused_scope();
    K3_CHECK(scope.selected && scope.problem.empty(),
             "Model: a step was routed to the fused decode path, which serves none here (" +
                 (scope.selected ? scope.problem : std::string("decode_backend is auto")) + ")");
    return fused_->run_step(ctx, ids, rows);
  }

  core::Tensor prefix = embed_tokens(ctx, weights_, ids);  // P: running sum of the current block

  std::vector<core::Tensor> bank;  // completed block sums, embedding first (at most ceil(L / block))
  for (int l = 0; l < config_.num_hidden_layers; ++l)
    prefix = layer_forward(ctx, l, weights_.layers[static_cast<size_t>(l)], router_bias_[static_cast<size_t>(l)], bank,
                           prefix);

  // Final Mix -> norm -> lm_head, only on the rows whose logits are wanted.
  if (const std::vector<int64_t> keep = logit_rows(segments, rows, n); !keep.empty()) {
    prefix = gather_rows(ctx, prefix, keep);
    for (core::Tensor& b : bank) b = gather_rows(ctx, b, keep);
  }
  const core::Tensor h = attn_res_mix(ctx, bank, prefix, weights_.output_res);
  const core::Tensor x = ctx.rmsnorm(h, weights_.final_norm, config_.rms_norm_eps);
  return lm_head_logits(ctx, weights_, x);
}

std::vector<int64_t> logit_rows(std::span<const Segment> segments, LogitRows rows, int64_t n) {
  if (rows == LogitRows::all || static_cast<int64_t>(segments.size()) == n) return {};  // every row is a last row
  std::vector<int64_t> keep;
  for (const Segment& s : segments)
    for (int64_t r = rows == LogitRows::requested && s.all_logits ? s.row_begin : s.row_end - 1; r < s.row_end; ++r)
      keep.push_back(r);
  if (static_cast<int64_t>(keep.size()) == n) keep.clear();
  return keep;
}

core::Tensor gather_rows(const ForwardContext& ctx, const core::Tensor& t, const std::vector<int64_t>& rows) {
  core::Tensor out = ctx.alloc_as(t.dtype(), static_cast<int64_t>(rows.size()), t.dim(1));
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto r = static_cast<int64_t>(i);
    ctx.memory.copy(row_slice(out, r, r + 1).view(), row_slice(t, rows[i], rows[i] + 1).view());
  }
  return out;
}

void Model::use_fused_decode(std::unique_ptr<FusedDecode> path) {
  K3_CHECK(options_.decode_backend == DecodeBackend::latency_specialized,
           "use_fused_decode: the model's decode_backend is auto, not latency_specialized");
  K3_CHECK(path != nullptr, "use_fused_decode: no path");
  fused_ = std::move(path);
}

Model::FusedScope Model::fused_scope() const {
  FusedScope s;
  s.selected = options_.decode_backend == DecodeBackend::latency_specialized;
  if (!s.selected) return s;
  if (options_.dcp > 1) s.problem = "decode context parallelism (dcp > 1) runs the standard path";
  else if (!fused_) s.problem = "no fused decode path attached to the model";
  else {
    s.problem = fused_->problem();
    s.max_rows = fused_->max_rows();
  }
  return s;
}

void Model::commit_verified(KvStorage& kv, VerifyCapture& capture, std::span<const int32_t> accepted_rows) const {
  const std::vector<Segment> segments = begin_commit(capture, accepted_rows);
  if (segments.empty()) return;
  const StepTables tables(segments, kv.storage_config().block_size, *memory_, {}, context_split());
  run_commit(kv, segments, tables.batches(), capture);
  end_commit(capture, accepted_rows);
}

std::vector<Segment> Model::begin_commit(VerifyCapture& capture, std::span<const int32_t> accepted_rows) const {
  K3_CHECK(accepted_rows.size() == capture.states.size(),
           "commit_verified: " + std::to_string(accepted_rows.size()) + " accepted counts for " +
               std::to_string(capture.states.size()) + " verify sequences");
  if (capture.empty()) return {};
  // The replay batch: verify sequence j's first accepted_rows[j] rows of the compact capture, from
  // its committed state (num_tokens back at the step's start, so positions and tables are right).
  std::vector<Segment> segments;
  for (size_t j = 0; j < capture.states.size(); ++j) {
    const int64_t n = accepted_rows[j];
    K3_CHECK(n >= 1 && n <= capture.rows[j], "commit_verified: verify sequence " + std::to_string(j) + " accepts " +
                                                 std::to_string(n) + " rows, expected 1.." +
                                                 std::to_string(capture.rows[j]));
    capture.states[j]->num_tokens = capture.start[j];
    segments.push_back({capture.row_begin[j], capture.row_begin[j] + n, capture.states[j], StepKind::decode, true});
  }
  return segments;
}

void Model::run_commit(KvStorage& kv, std::span<const Segment> segments, const StepBatches& batches,
                       const VerifyCapture& capture) const {
  const ForwardContext ctx{config_, kv, ops_, options_, segments, batches, *memory_, nullptr, comm_, nullptr, nullptr};
  for (int l = 0; l < config_.num_hidden_layers; ++l) {
    const auto* w = std::get_if<KdaWeights>(&weights_.layers[static_cast<size_t>(l)].attn);
    if (w) kda_commit_replay(ctx, l, *w, capture.layers.at(static_cast<size_t>(l)));
  }
}

void Model::end_commit(VerifyCapture& capture, std::span<const int32_t> accepted_rows) const {
  for (size_t j = 0; j < capture.states.size(); ++j)
    capture.states[j]->num_tokens = capture.start[j] + accepted_rows[j];
  capture.clear();
}

}  // namespace k3::model
