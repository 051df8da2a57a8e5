// model/layers/context.h: what a layer's forward sees: options, the batch's sequence
// segments, the op registry, and small helpers that allocate outputs and call ops.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "config/k3_config.h"
#include "core/device_memory.h"
#include "core/step_kind.h"
#include "kernels/registry.h"
#include "model/kv_storage.h"
#include "model/weights.h"

namespace k3::model {

// Which code runs a pure-decode step (design.md "Two decode paths, one contract"): the standard
// path (config name "auto": the layers calling registry ops; it serves every step) or the fused
// path of fastpath/ ("latency_specialized"), which falls back to the standard path, visibly and
// with a reason, for any step it does not cover.
enum class DecodeBackend : uint8_t { standard, latency_specialized };
std::string_view decode_backend_name(DecodeBackend b);      // "auto" | "latency_specialized"
DecodeBackend parse_decode_backend(std::string_view name);  // core::Error naming the accepted names

struct ModelOptions {
  kernels::Precision precision = kernels::Precision::bf16;
  DecodeBackend decode_backend = DecodeBackend::standard;
  kernels::RmsNormStyle rmsnorm_style = kernels::RmsNormStyle::moonshot;
  float kv_k_scale = 1.0f;                  // fp8 cache: stored = fp8(x / k_scale)
  bool kda_chunked_prefill = true;          // prefill steps use chunked KDA (decode steps: recurrent)
  bool poison_buffers = false;              // NaN-fill every new activation buffer (tests)
  core::Device device = core::Device::cpu;  // must be the device of the Model's DeviceMemory
  // Decode context parallelism (kernels/mla/mla_cp.h): 1 = off; else the MLA
  // latent cache of every sequence is split over the tensor-parallel group by token, and dcp must
  // equal the group size (check_dcp_size). Each rank then stores 1/dcp of every context.
  int dcp = 1;
  // Expert parallelism (config::ShardOptions::expert_parallel; --enable-expert-parallel): the
  // tensor-parallel ranks hold whole routed experts, E / tp each (MoeWeights::expert_begin), instead
  // of a slice of every expert's intermediate; needs a group of more than one rank.
  bool expert_parallel = false;
};

// Throws core::Error "dcp N must be 1 or the tensor-parallel size M" unless dcp is 1 or tp_size.
void check_dcp_size(int dcp, int tp_size);

// Where a sequence's MLA cache entries live under decode context parallelism: global position p on
// rank p % size, at LOCAL position p / size of that rank's pages (block tables index local
// positions and are the same on every rank). size 1 (no DCP): every position on the one rank.
struct ContextSplit {
  int size = 1, rank = 0;
  bool owns(int64_t p) const { return p % size == rank; }
  int64_t local(int64_t p) const { return p / size; }
  // Local positions a rank needs for `tokens` global ones (rank 0 holds the most): ceil(tokens / size).
  int64_t local_tokens(int64_t tokens) const { return (tokens + size - 1) / size; }
};

using core::StepKind;  // prefill: chunked KDA, naive MLA; decode: recurrent KDA, absorbed MLA

struct SequenceInput {
  std::span<const int32_t> tokens;
  SequenceState* state = nullptr;
  StepKind kind = StepKind::prefill;
  // Speculative verify (decode kind only; spec §5.9 (b)): the rows [last token, drafts...] run with
  // the KDA conv and recurrence in no-commit mode (the slot keeps its committed state; the MLA
  // pages get every row). forward() then records the rows' KDA inputs in a VerifyCapture, and
  // Model::commit_verified replays the accepted ones into the slot and sets num_tokens.
  bool verify = false;
  // Every row's logits are returned, not only the last (scoring a prompt; a verify's rows always are).
  bool all_logits = false;
  bool all_rows_logits() const { return verify || all_logits; }
};

// Called with named intermediates ("kda.o", layer, [rows, width]) so eval can diff
// backends and paths layer by layer.
using TraceFn = std::function<void(std::string_view name, int layer, const core::TensorView& value)>;

// Rows [row_begin, row_end) of the batch belong to one sequence.
struct Segment {
  int64_t row_begin = 0, row_end = 0;
  SequenceState* state = nullptr;
  StepKind kind = StepKind::prefill;
  bool verify = false;      // SequenceInput::verify
  bool all_logits = false;  // SequenceInput::all_rows_logits()
  int64_t rows() const { return row_end - row_begin; }
};

// The target's hidden-state taps of one step (spec/drafter.h, spec §13.2): for each layer l of
// `layers`, the AttnRes mixture the attention side of layer l + 1 computes, [T, hidden] per tapped
// layer over every row of the step (filled by forward(); the tensors share the step's storage).
struct HiddenTaps {
  std::vector<int32_t> layers;
  std::vector<core::Tensor> values;  // parallel to layers
};

// The KDA inputs of a step's verify rows, per KDA layer, kept from forward() to
// Model::commit_verified (spec §5.9 (b): replay instead of per-position state copies). Rows are
// compact: verify sequence j (in batch order) owns rows [row_begin[j], row_begin[j] + rows[j]).
struct VerifyCapture {
  struct Layer {
    core::Tensor q_in, k_in, v_in;  // [R, P] pre-conv inputs (activations)
    core::Tensor decay, beta;       // [R, P] f_b output, [R, H] beta logits
  };
  std::vector<Layer> layers;                    // indexed by layer id (empty for MLA layers)
  std::vector<SequenceState*> states;           // per verify sequence
  std::vector<int64_t> row_begin, rows, start;  // compact rows and num_tokens before the step
  int64_t total_rows = 0;
  bool empty() const { return states.empty(); }
  void clear() {
    layers.clear();
    states.clear();
    row_begin.clear();
    rows.clear();
    start.clear();
    total_rows = 0;
  }
};

// The batch's sequence tables for the attention ops, on the model's device, built once per
// forward: every sequence (KDA conv, MLA cache), and its prefill and decode subsets.
struct StepBatches {
  kernels::SeqBatch all, prefill, decode;  // decode includes verify sequences (MLA: absorbed form)
  // KDA's view: verify sequences run their conv and recurrence apart (no_commit), so the
  // committing calls take all / decode minus them. Without verify sequences these equal all / decode.
  kernels::SeqBatch kda_all, kda_decode, verify;
  core::TensorView cache_rows;  // i32 [T]: MLA cache row (page id * block_size + offset) per activation row
  // Under decode context parallelism (ContextSplit) the tables are this rank's: cache_rows is -1 for
  // a token another rank stores, cache rows and max_tokens count LOCAL positions, positions stay global.

  // Decode context parallelism's prefill (model/layers/mla.cpp): the prefill sequences attend in the
  // naive form over their whole context, gathered from every rank into a temporary replicated cache
  // of `blocks` pages (kernels::MlaGatherPlan): `seqs` is `prefill` with that cache's block tables and
  // GLOBAL max_tokens; pack_rows i32 [slots] and place_rows i32 [blocks * block_size] are the two
  // mla_cache_gather tables. Without DCP or without prefill sequences: seqs.num_seqs == 0.
  struct DcpPrefill {
    kernels::SeqBatch seqs;
    core::TensorView pack_rows, place_rows;
    int64_t slots = 0, blocks = 0;
  } dcp_prefill;
};

struct ForwardContext {
  const config::K3Config& config;
  KvStorage& kv;
  const kernels::Registry& ops;
  const ModelOptions& options;
  std::span<const Segment> segments;
  const StepBatches& batches;
  core::DeviceMemory& memory;
  const TraceFn* trace = nullptr;
  // Tensor parallelism (spec §11): this rank's communicator; nullptr (or a group of one) is TP1.
  // The config above is then the rank's (config::shard_config): heads, intermediates and vocab
  // divided by the group size.
  comm::Communicator* comm = nullptr;
  // Where the KDA layers record the verify rows' inputs (non-null when the batch has verify rows).
  VerifyCapture* capture = nullptr;
  // Where layer_forward leaves the tapped mixtures (non-null when a drafter asked for taps).
  HiddenTaps* taps = nullptr;

  kernels::Precision precision() const { return options.precision; }
  core::Device device() const { return options.device; }
  core::DType act_dtype() const { return kernels::activation_dtype(device(), precision()); }
  // New [rows, cols] activation on the model's device (NaN-filled when options.poison_buffers).
  core::Tensor alloc(int64_t rows, int64_t cols) const { return alloc_as(act_dtype(), rows, cols); }
  // The same in a given dtype (f32 router logits and route weights, i32 expert ids).
  core::Tensor alloc_as(core::DType dtype, int64_t rows, int64_t cols) const;
  // Hands a named intermediate to the trace as a CPU f32 view (downloaded from the device).
  void emit(std::string_view name, int layer, const core::Tensor& t) const;

  core::Tensor linear(const core::Tensor& x, const LinearWeight& w, bool round_output = true) const;
  core::Tensor rmsnorm(const core::Tensor& x, const core::Tensor& w, float eps) const;
  core::Tensor situ_glu(const core::Tensor& gate, const core::Tensor& up) const;
  core::Tensor add(const core::Tensor& a, const core::Tensor& b) const;

  // ---- tensor parallelism: row-parallel outputs are fp32 partial products summed over the
  // ranks and rounded once after the sum, as TP1 rounds the unsplit product once.
  bool tensor_parallel() const { return comm != nullptr && comm->size() > 1; }
  // This rank's share of the MLA cache (options.dcp > 1: the group's size and this rank).
  ContextSplit context_split() const {
    return options.dcp > 1 && comm != nullptr ? ContextSplit{comm->size(), comm->rank()} : ContextSplit{};
  }
  // A row-parallel linear (o_proj, down_proj): under TP this rank's unrounded f32 partial
  // product, for reduce_partial(); without TP the ordinary (rounded) linear output.
  core::Tensor row_parallel_linear(const core::Tensor& x, const LinearWeight& w) const;
  // Sums a row_parallel_linear output over the ranks (in place: rank order, fp32) and returns it
  // rounded once as an activation; without TP returns it as it is.
  core::Tensor reduce_partial(const core::Tensor& partial) const;
  // round(x) as a new [rows, cols] activation; x f32, rows may be strided (ops.to_activation).
  core::Tensor to_activation(const core::TensorView& x) const;
};

// Rows [begin, end) of a [rows, cols] activation, sharing its storage.
core::Tensor row_slice(const core::Tensor& t, int64_t begin, int64_t end);
// Columns [begin, end) of a [rows, cols] activation, copied into a new contiguous tensor.
core::Tensor column_copy(const ForwardContext& ctx, const core::Tensor& t, int64_t begin, int64_t end);

// The verify segments' rows of t [rows, cols], compact [ctx.capture->total_rows, cols] (VerifyCapture).
core::Tensor verify_rows(const ForwardContext& ctx, const core::Tensor& t);
// The step's first prefix: Embed[ids] [T, hidden] (vocab-parallel under TP: each rank's rows, summed).
core::Tensor embed_tokens(const ForwardContext& ctx, const Weights& w, const core::TensorView& ids);
// f32 logits [rows, full vocab] of the normed final hidden x (vocab-parallel lm_head under TP).
core::Tensor lm_head_logits(const ForwardContext& ctx, const Weights& w, const core::Tensor& x);

// Layer functions (one file each under model/layers/). x: the normed input [rows, hidden].
core::Tensor attention(const ForwardContext& ctx, int layer, const KdaWeights& w, const core::Tensor& x);
core::Tensor attention(const ForwardContext& ctx, int layer, const MlaWeights& w, const core::Tensor& x);
// Replays the accepted verify rows of one KDA layer into the committed state: conv + recurrence
// with commit over ctx.batches.verify, whose rows index the capture's compact tensors.
void kda_commit_replay(const ForwardContext& ctx, int layer, const KdaWeights& w, const VerifyCapture::Layer& cap);
core::Tensor ffn(const ForwardContext& ctx, int layer, const DenseFfnWeights& w, const core::Tensor& x);
// The MoE layer's front: what reads the layer input x (the fast path computes it in one fused call).
struct MoeFront {
  core::Tensor logits;                  // f32 [rows, E] router logits, unrounded
  core::Tensor z;                       // [rows, L] latent down-projection
  core::Tensor shared_gate, shared_up;  // [rows, S*I] (empty without shared experts)
  // The top-k routes when the front already chose them (the fast path's packed GEMM selects in its
  // epilogue): i32 ids [rows, k], f32 weights [rows, k]; empty: moe_tail runs router_topk on logits.
  core::Tensor route_ids, route_weights;
};
// Everything of the MoE layer after its front: top-k, experts, (TP all-reduce), routed norm,
// up-projection, shared experts, their sum. `hidden`: the layer's output width.
// Without TP it is moe_combine(ctx, w, moe_routed_latent(...), front) (the fast path runs the parts).
core::Tensor moe_tail(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                      const MoeFront& front, int64_t hidden);
core::Tensor ffn(const ForwardContext& ctx, int layer, const MoeWeights& w, const core::Tensor& router_bias,
                 const core::Tensor& x);
// The non-TP parts of moe_tail. moe_routed_latent: top-k and the routed experts, u = the rounded
// latent combination [rows, L] (traced as "moe.latent"); core::Error under TP (u is a partial sum there).
core::Tensor moe_routed_latent(const ForwardContext& ctx, int layer, const MoeWeights& w,
                               const core::Tensor& router_bias, const MoeFront& front);
// moe_combine: f = bf16(latent_up(routed_norm(u)) + shared_down(situ(shared_gate, shared_up))) [rows, hidden]
// (without shared experts the first term alone): the op sequence kernels::moe_tail_combine fuses.
core::Tensor moe_combine(const ForwardContext& ctx, const MoeWeights& w, const core::Tensor& u, const MoeFront& front);
// One decoder layer over the AttnRes stream (spec §3): Mix -> norm -> attention -> Mix -> norm ->
// FFN, updating the running block sum; pushes the block sum onto `bank` at a bank-write layer.
// `router_bias`: the MoE layer's e_score_correction_bias as the router reads it (Model keeps it).
// Returns the new running block sum. Model::forward calls it per layer; benchmarks call it alone.
core::Tensor layer_forward(const ForwardContext& ctx, int layer, const LayerWeights& w, const core::Tensor& router_bias,
                           std::vector<core::Tensor>& bank, const core::Tensor& prefix);
// AttnRes Mix over bank ++ [prefix] (spec §3.1); with an empty bank returns the prefix.
core::Tensor attn_res_mix(const ForwardContext& ctx, std::span<const core::Tensor> bank, const core::Tensor& prefix,
                          const AttnResWeights& w);

}  // namespace k3::model
