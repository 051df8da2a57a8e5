// engine/plan.h: a SchedulerOutput turned into what the executor runs, once per step
// (plan once, run per layer): slot preparation, the forward's batch, checkpoint saves.
//
//   prepare   for each fresh sequence, before the forward: reset its KDA slot, or restore a
//             prefix hit's checkpoint into it (all before any save, so a checkpoint evicted
//             and reused for a save in the same step is still read intact)
//   seqs      the forward's batch, in SchedulerOutput order (decodes first); each names its
//             tokens, the pages appended to its table and its step kind; logits: row i
//   saves     after the forward: slot -> checkpoint (the state now ends on a boundary)
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/step_kind.h"
#include "scheduler/scheduler_output.h"

namespace k3::engine {

struct SlotPrep {
  int32_t slot = -1;
  int32_t restore_checkpoint = -1;  // -1: zero the slot
};
struct CheckpointSave {
  int32_t slot = -1;
  int32_t checkpoint = -1;
};
struct PlannedSequence {
  scheduler::RequestId id = 0;
  std::span<const int32_t> tokens;      // computed this step (views into the SchedulerOutput)
  std::span<const int32_t> new_blocks;  // appended to its block table (fresh: the whole table)
  int64_t start = 0;                    // tokens already in its state
  int32_t kda_slot = -1;
  core::StepKind kind = core::StepKind::prefill;
  bool fresh = false;      // new state: num_tokens = start, block_table = new_blocks
  bool sample = false;     // its logits row is sampled
  int32_t num_drafts = 0;  // > 0: a speculative verify (tokens = last token ++ drafts;
                           // every row's logits are returned and sampled)
};

struct BatchPlan {
  uint64_t step = 0;
  std::vector<scheduler::RequestId> dropped;  // preempted: their states are gone
  std::vector<SlotPrep> prepare;
  std::vector<PlannedSequence> seqs;
  std::vector<CheckpointSave> saves;
  int64_t num_tokens = 0;
  int64_t num_logit_rows = 0;  // one per sequence, num_drafts + 1 for a verify sequence
  int32_t num_verifies = 0;    // sequences with num_drafts > 0
};

// The plan of `out` (which must outlive it: the plan views its buffers).
BatchPlan make_plan(const scheduler::SchedulerOutput& out);

}  // namespace k3::engine
