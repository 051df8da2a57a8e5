// model/decode_graphs.h: pure-decode steps replayed as captured device work (CUDA graphs).
//
// A decode step of B sequences with one token each launches the same kernels on the same buffers
// every time once its inputs live at fixed addresses: the token ids and the step tables (fixed
// block-table width and capacity, model/step_batches.h). Which steps are captured is the step
// plan's choice (its route's graph bucket, scheduler/step_route.h); graphs are kept per (bucket,
// decode path). The first step of each runs eagerly (it warms the pool, cuBLASLt plans and kernel
// attributes) and is then captured; later steps of it rewrite the ids and tables in place and
// replay (least recently used dropped beyond `max_graphs`).
//
// Speculative verify steps (spec §5.9 (b)) are captured the same way when every sequence of the
// batch verifies the same number of rows R >= 2 (the last token plus R - 1 drafts: a fixed K, as
// synthetic acceptance and drafters without adaptive lengths propose): bucket (B, R).
// The graph's KDA no-commit inputs live in its own buffers; forward() hands the caller a
// VerifyCapture over them, and commit_verified() replays the KDA commit from a second graph per
// accepted-count vector of that (B, R) graph (the replay's row counts are the accepted lengths, so
// each vector is its own shape: at batch 1 there are at most R of them; synthetic acceptance has
// one). Everything else (prefill, mixed steps, verify batches of unequal lengths) has no bucket and
// goes through Model::forward; a device that cannot capture runs every bucket's steps eagerly here.
// A step with hidden-state taps (a model drafter's) is captured with them: the graph writes the
// tapped mixtures into its own buffers, which forward() hands back in the taps after each replay.
//
// The kernels of each captured graph (every op's chosen implementation, in call order, recorded from
// the registry's OpTrace while it captures) are published in kernels() for the step plan
// (core::StepRoute::kernels: the scheduler routes through the executor's scope); a replay whose
// plan names other kernels than its graph runs is refused.
//
// Tensor parallelism: every rank keeps its own DecodeGraphs and the ranks capture the same steps
// (they run in lock step), so the step's collectives are captured with its kernels. The eager first
// step of each size grows the communicator's scratch to what that size needs, so a captured
// collective never allocates.
#pragma once
#include <cstdint>
#include <list>
#include <memory>
#include <span>

#include "model/model.h"
#include "model/step_batches.h"

namespace k3::model {

class DecodeGraphs {
 public:
  // `max_blocks_per_seq`: the longest block table a sequence may have (max_model_len / block_size,
  // rounded up): the fixed width of the tables, and with block_size the attention capacity (in local
  // positions under decode context parallelism: model/layers/context.h ContextSplit).
  DecodeGraphs(const Model& model, KvStorage& kv, int64_t max_blocks_per_seq, int max_graphs = 16);

  // The widest block table a captured step holds (scheduler::ExecutionScope::graph_max_blocks).
  int64_t max_blocks_per_seq() const { return shape_.block_table_width; }
  // True when `batch` is a step of `bucket`: bucket.batch (1..kMaxBatch) sequences, either all
  // plain decode with one token each (rows 1), or all verify sequences of bucket.rows >= 2 rows
  // (B * R <= kMaxRows), their tables and contexts within the graphs' fixed capacity.
  bool fits(std::span<const SequenceInput> batch, GraphBucket bucket) const;
  // For a batch that fits the route's bucket: Model::forward(kv, batch, LogitRows::last, ...,
  // route.path) for a plain batch: host f32 logits [B, vocab]; for a verify batch
  // Model::forward(kv, batch, LogitRows::requested, nullptr, capture, ..., route.path): logits
  // [B * R, vocab], `capture` (required then) filled for Model::commit_verified. With
  // LogitsAt::device the logits stay on the device (valid until the next forward). Throws
  // core::Error for a batch that does not fit, or a route whose kernels are not its graph's.
  // With `taps`, its layers' mixtures are left in taps->values (the graph's buffers: valid until
  // the next forward); graphs with and without taps, or with other layers, are apart.
  core::Tensor forward(std::span<const SequenceInput> batch, const core::StepRoute& route, LogitsAt at = LogitsAt::host,
                       VerifyCapture* capture = nullptr, HiddenTaps* taps = nullptr);

  // The kernels of the graphs captured now (scheduler::ExecutionScope::graph_kernels).
  std::shared_ptr<const core::GraphKernels> kernels() const { return kernels_; }

  // After forward() of a verify batch: Model::commit_verified(kv, capture, accepted_rows), replayed
  // from the commit graph of this accepted-count vector when `capture` is over a verify graph's
  // buffers (captured on the vector's first use; kMaxCommitGraphs per verify graph, least recently
  // used dropped); eager for a capture from Model::forward or a device that cannot capture.
  void commit_verified(VerifyCapture& capture, std::span<const int32_t> accepted_rows);

  int64_t replays() const { return replays_; }                // steps served by a replay
  int64_t commit_replays() const { return commit_replays_; }  // commits served by a replay
  int64_t captures() const { return captures_; }              // graphs captured
  // 0 when no graph of that shape exists (rows: 1 for plain decode, R for verify).
  size_t kernels_per_step(int batch, int rows = 1) const;

  static constexpr int kMaxBatch = 64;
  static constexpr int kMaxRows = 64;          // rows of a captured verify step (the fused path's scope)
  static constexpr int kMaxCommitGraphs = 16;  // per verify graph

 private:
  // A captured KDA commit of one accepted-count vector (Model::run_commit on fixed tables).
  struct Commit {
    std::vector<int32_t> accepted;
    std::unique_ptr<StepTables> tables;
    std::unique_ptr<core::CapturedWork> work;
  };
  struct Entry {
    GraphBucket bucket;  // sequences and rows per sequence (> 1: a verify step)
    DecodePath path = DecodePath::standard;
    std::unique_ptr<StepTables> tables;
    core::Tensor ids;           // device i32 [B * rows], rewritten each step
    core::Tensor logits;        // device f32 [B * rows, V], written by every replay
    VerifyCapture capture;      // verify: the KDA inputs the graph writes (layers), for commit_verified
    std::list<Commit> commits;  // verify: per accepted-count vector, most recently used first
    std::unique_ptr<core::CapturedWork> work;
    std::shared_ptr<const core::KernelList> kernels;  // what `work` runs (published in kernels_)
    std::shared_ptr<const core::KernelList> matched;  // a plan's list found equal to `kernels` (another rank's)
    std::vector<int32_t> tap_layers;                  // the layers the graph taps (empty: none)
    std::vector<core::Tensor> tap_values;             // device, written by every replay (parallel to tap_layers)
  };
  // Throws unless the plan's kernels (when it names them) are `graph`'s.
  static void check_kernels(const core::StepRoute& route, Entry& e, const core::KernelList& graph);
  // The host side of a verify capture for `batch` (states, rows, starts) around `layers`.
  void describe_verify(std::span<const SequenceInput> batch, int rows, VerifyCapture& capture) const;
  std::vector<Segment> segments(std::span<const SequenceInput> batch) const;
  const Model& model_;
  KvStorage& kv_;
  StepTableShape shape_;
  int max_graphs_;
  std::list<Entry> entries_;  // most recently used first
  std::shared_ptr<core::GraphKernels> kernels_ = std::make_shared<core::GraphKernels>();
  // The verify graph whose buffers `capture` is over (its KDA inputs alias the entry's), or nullptr.
  Entry* verify_entry_of(const VerifyCapture& capture);
  int64_t replays_ = 0, captures_ = 0, commit_replays_ = 0;
};

}  // namespace k3::model
