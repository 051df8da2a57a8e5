// model/model.h: the K3-family text model assembled from its layer schedule (spec §3).
//
// Config, Weights and per-sequence RunState (SequenceState) are kept apart; the model
// holds references to the first two and the op registry, and runs a batch of sequences,
// each with its own tokens, state and step kind. Ops are called through the registry,
// so the same code runs on every backend that implements them.
#pragma once
#include <memory>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "config/k3_config.h"
#include "core/step_route.h"
#include "kernels/registry.h"
#include "model/fused_decode.h"
#include "model/layers/context.h"
#include "model/weights.h"

namespace k3::model {

using core::DecodePath;   // which decode path runs a step (the plan's route says)
using core::GraphBucket;  // the captured-graph shape a step replays as (model/decode_graphs.h)
using core::LogitsAt;     // where forward() leaves the logits (host: what most callers read)

enum class LogitRows : uint8_t {
  all,        // one row per input token, in batch order
  last,       // the last token of each sequence
  requested,  // every row of a sequence that asks for them (SequenceInput::all_rows_logits()), the last of the others
};

// The rows of a step whose logits `rows` asks for, in order; empty when that is every row.
std::vector<int64_t> logit_rows(std::span<const Segment> segments, LogitRows rows, int64_t n);
// Copies the listed rows of a [rows, cols] activation into a new tensor on its device.
core::Tensor gather_rows(const ForwardContext& ctx, const core::Tensor& t, const std::vector<int64_t>& rows);

class Model {
 public:
  // Validates that the weights match the config's layer schedule. Weights, the KvStorage given
  // to forward() and `memory` live on options.device (to_device() in model/weights.h moves
  // loaded weights there).
  //
  // Tensor parallelism (spec §11): with `comm` (a group of more than one rank) this Model is rank
  // comm->rank() of comm->size(): `config` is the rank's config (config::shard_config), `weights`
  // its slices (checkpoint::load_weights with a TpShard), and every rank calls forward() with the
  // same batch in lock step. The collectives: an all-reduce after each row-parallel layer (o_proj,
  // dense down_proj, and one per MoE layer for the latent + shared partial sums), one for the
  // vocab-parallel embedding, and an all-gather of the vocab-parallel logits. Decode context
  // parallelism (options.dcp = the group size) also splits every sequence's MLA cache over the
  // ranks by token, with three more collectives per MLA layer (kernels/mla/mla_cp.h). The
  // communicator is a constructor argument rather than a ModelOptions field because it is a live
  // object of one rank (options are plain values that every rank shares, print and compare); it
  // must outlive the Model and live on options.device. nullptr: TP1.
  Model(const config::K3Config& config, const Weights& weights, const kernels::Registry& ops, ModelOptions options,
        std::shared_ptr<core::DeviceMemory> memory = core::make_host_memory(), comm::Communicator* comm = nullptr);

  const config::K3Config& config() const { return config_; }
  const ModelOptions& options() const { return options_; }
  const kernels::Registry& ops() const { return ops_; }
  // Tensor-parallel group size (1 without a communicator) and the full vocabulary (the logits'
  // width: config().vocab_size times the group size).
  int tp_size() const { return comm_ ? comm_->size() : 1; }
  int64_t vocab_size() const { return int64_t{config_.vocab_size} * tp_size(); }
  // This rank's share of the MLA cache under decode context parallelism (options().dcp > 1): a
  // sequence's block table covers context_split().local_tokens(its tokens) positions of this rank.
  ContextSplit context_split() const {
    return options_.dcp > 1 && comm_ ? ContextSplit{comm_->size(), comm_->rank()} : ContextSplit{};
  }
  // The model's device memory (KvStorage for forward() must be built on it).
  const std::shared_ptr<core::DeviceMemory>& memory() const { return memory_; }
  // Runs every sequence's tokens on top of its state in `kv` (advancing num_tokens) and
  // returns f32 logits [rows, vocab_size()] as a CPU tensor (every TP rank gets all of them).
  // Each state's block_table must already cover num_tokens + its new tokens and its slot must be
  // valid. Throws core::Error on bad input.
  //
  // Speculative verify (spec §5.9 (b)): sequences with SequenceInput::verify run their rows without
  // committing their KDA state; `capture` (required then, cleared first) records what
  // commit_verified needs. Their num_tokens still advance by all rows here, and their MLA pages
  // hold every row; commit_verified sets the accepted length.
  //
  // `taps` (optional): its layers' AttnRes mixtures over every row are left in taps->values
  // (spec/drafter.h). Each tap layer needs a next layer.
  //
  // `path`: the decode path the step's plan chose (scheduler/step_route.h); the model follows it
  // and decides nothing. DecodePath::fused needs the fused path attached (use_fused_decode) and a
  // step in its scope (fused_scope()), else core::Error.
  core::Tensor forward(KvStorage& kv, std::span<const SequenceInput> batch, LogitRows rows,
                       const TraceFn* trace = nullptr, VerifyCapture* capture = nullptr, HiddenTaps* taps = nullptr,
                       LogitsAt at = LogitsAt::host, DecodePath path = DecodePath::standard) const;

  // After a forward with verify sequences: for verify sequence j (batch order), its first
  // accepted_rows[j] rows (1 <= that <= its rows: the last committed token plus the accepted
  // drafts) are replayed through the KDA conv and recurrence into its committed slot state, and
  // its num_tokens becomes start + accepted_rows[j]. MLA rows past that are left in the pages and
  // overwritten by later steps. The capture is cleared. Throws core::Error on bad counts.
  void commit_verified(KvStorage& kv, VerifyCapture& capture, std::span<const int32_t> accepted_rows) const;
  // commit_verified in three parts, for model/decode_graphs.h (which replays the middle one):
  // begin_commit checks the counts, sets each verify sequence's num_tokens back to the step's start
  // and returns the replay segments (sequence j: its first accepted_rows[j] rows of the compact
  // capture); run_commit queues the KDA replay on the device (no host memory touched: capturable);
  // end_commit sets num_tokens to start + accepted_rows[j] and clears the capture.
  std::vector<Segment> begin_commit(VerifyCapture& capture, std::span<const int32_t> accepted_rows) const;
  void run_commit(KvStorage& kv, std::span<const Segment> segments, const StepBatches& batches,
                  const VerifyCapture& capture) const;
  void end_commit(VerifyCapture& capture, std::span<const int32_t> accepted_rows) const;

  // The two halves of forward(), for callers that keep the step's inputs at fixed device
  // addresses (model/decode_graphs.h). check_step validates a batch as forward() does; run_step
  // queues the whole step on the device from device ids [T] and tables, touching no host memory
  // (so it can be captured), and returns the device logits; it does not advance num_tokens and
  // does not count the step (its caller counts the steps that ran: a graph's capture is not one).
  void check_step(const KvStorage& kv, std::span<const SequenceInput> batch) const;
  // Checks that every tap layer has a next layer (core::Error naming it) and empties the values.
  void prepare_taps(HiddenTaps& taps) const;
  core::Tensor run_step(KvStorage& kv, std::span<const Segment> segments, const StepBatches& batches,
                        const core::TensorView& ids, LogitRows rows, DecodePath path, const TraceFn* trace = nullptr,
                        VerifyCapture* capture = nullptr, HiddenTaps* taps = nullptr) const;

  // decode_backend = latency_specialized: the fused path that serves the steps routed to it
  // (fastpath::make_fused_decode).
  void use_fused_decode(std::unique_ptr<FusedDecode> path);
  // The fused path's scope, for the executor's ExecutionScope (scheduler/step_route.h).
  struct FusedScope {
    bool selected = false;  // decode_backend = latency_specialized
    std::string problem;    // set: it serves no step (why: dcp > 1, no path attached, the path's own problem)
    int64_t max_rows = 0;
  };
  FusedScope fused_scope() const;
  const Weights& weights() const { return weights_; }
  // e_score_correction_bias of MoE layer l as the router reads it (empty for dense layers).
  const core::Tensor& router_bias(int layer) const { return router_bias_.at(static_cast<size_t>(layer)); }

 private:
  const config::K3Config& config_;
  const Weights& weights_;
  const kernels::Registry& ops_;
  ModelOptions options_;
  std::shared_ptr<core::DeviceMemory> memory_;
  comm::Communicator* comm_ = nullptr;
  // e_score_correction_bias as the router sees it: bf16-rounded in bf16 mode (spec §4).
  std::vector<core::Tensor> router_bias_;
  std::unique_ptr<FusedDecode> fused_;
};

}  // namespace k3::model
