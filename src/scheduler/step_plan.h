// scheduler/step_plan.h: what one step runs, as plain data (no pointers into the scheduler): the
// one plan of a step. Scheduler::schedule writes it; the engine and its executor only read it.
//
// Each scheduled sequence computes tokens [start, start + num_tokens) of its request on top
// of a KV state that holds tokens [0, start). Decodes come first, then prefill chunks.
// Flat buffers (tokens, blocks) are shared by all sequences so a reused plan allocates
// nothing in steady state.
//
// An executor runs it in three phases: before the forward, each fresh sequence's KDA slot is reset
// or restored from its prefix hit's checkpoint (all before any save, so a checkpoint evicted and
// reused for a save in the same step is still read intact); the forward over `seqs` in order,
// returning logit_rows() rows per sequence; after it, each save_checkpoint copy (the state now ends
// on a boundary).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "core/step_kind.h"
#include "scheduler/request.h"
#include "scheduler/step_route.h"

namespace k3::scheduler {

using core::StepKind;  // prefill: known tokens (prompt, or recomputation); decode: the last sampled one

// How the sequence's KDA slot must look before the step runs.
enum class SlotInit : uint8_t {
  keep,     // it continues from its last step
  reset,    // a fresh sequence with no cached prefix: zero the slot
  restore,  // a prefix hit: copy checkpoint `restore_checkpoint` into the slot
};

struct ScheduledSequence {
  RequestId id = 0;
  int64_t start = 0;         // tokens already in the KV state = position of the first token
  int32_t num_tokens = 0;    // tokens computed this step
  int32_t token_offset = 0;  // its tokens: StepPlan::tokens[token_offset, +num_tokens)
  // Its whole block table this step (the MLA page ids in token order, a prefix hit's shared pages
  // first): StepPlan::blocks[block_offset, +num_blocks). The cache manager owns the table; the plan
  // carries it each step, so the model reads the pages from here and keeps no copy.
  int32_t block_offset = 0;
  int32_t num_blocks = 0;
  int32_t kda_slot = -1;
  StepKind kind = StepKind::prefill;
  SlotInit slot_init = SlotInit::keep;
  int32_t restore_checkpoint = -1;  // slot_init == restore
  int32_t save_checkpoint = -1;     // copy the slot here after the step (-1: none)
  bool sample = false;              // the step reaches the request's last token: sample one
  // Speculative verify (decode kind): its tokens are [last token, num_drafts drafts]; every row
  // is sampled and the engine reports how many drafts were accepted (Scheduler::update).
  int32_t num_drafts = 0;
  bool verify() const { return num_drafts > 0; }
  LogitsOut logits_out = LogitsOut::none;  // the request's (RequestSpec::logits_out)
  // A constrained request's sampled rows (1, or every row of a verify) take grammar mask rows
  // [mask_row, + mask_rows()) of the step's StepPlan::num_mask_rows (engine/step_masks.h fills
  // them while the step runs); -1: not constrained, or it samples nothing this step.
  int32_t mask_row = -1;
  int32_t mask_rows() const { return mask_row < 0 ? 0 : verify() ? num_tokens : 1; }
  // Logits rows the step returns for it: every row of a verify or an every_row sequence, else the last.
  int32_t logit_rows() const { return verify() || logits_out == LogitsOut::every_row ? num_tokens : 1; }

  bool fresh() const { return slot_init != SlotInit::keep; }
};

struct StepPlan {
  uint64_t step = 0;
  std::vector<ScheduledSequence> seqs;  // decodes first, then prefills
  std::vector<int32_t> tokens;
  std::vector<int32_t> blocks;
  std::vector<RequestId> preempted;  // lost their KV state this step (the engine drops it)
  int32_t num_decodes = 0, num_prefills = 0;
  int64_t num_tokens = 0;        // sum of seqs[i].num_tokens
  int32_t num_samples = 0;       // seqs with sample = true
  int32_t num_verifies = 0;      // seqs with num_drafts > 0
  int64_t num_draft_tokens = 0;  // sum of num_drafts
  int64_t num_logit_rows = 0;    // sum of seqs[i].logit_rows()
  int32_t num_mask_rows = 0;     // sum of seqs[i].mask_rows(): the grammar masks the step samples with
  bool host_logits = false;      // some sequence's logits are handed out: they must reach the host
  // The decode path (and why, when the fused path was selected and does not serve the step) and
  // the captured-graph bucket: chosen once by the scheduler (scheduler/step_route.h), followed by
  // the executor and the model.
  StepRoute route;

  bool empty() const { return seqs.empty(); }
  std::span<const int32_t> tokens_of(const ScheduledSequence& s) const {
    return std::span(tokens).subspan(static_cast<size_t>(s.token_offset), static_cast<size_t>(s.num_tokens));
  }
  std::span<const int32_t> blocks_of(const ScheduledSequence& s) const {
    return std::span(blocks).subspan(static_cast<size_t>(s.block_offset), static_cast<size_t>(s.num_blocks));
  }
  void clear() {
    seqs.clear();
    tokens.clear();
    blocks.clear();
    preempted.clear();
    num_decodes = num_prefills = num_samples = num_verifies = num_mask_rows = 0;
    num_tokens = num_draft_tokens = num_logit_rows = 0;
    host_logits = false;
    route = {};
  }
};

}  // namespace k3::scheduler
