// engine/plan.cpp: make_plan.
#include "engine/plan.h"

namespace k3::engine {

BatchPlan make_plan(const scheduler::SchedulerOutput& out) {
  BatchPlan p;
  p.step = out.step;
  p.dropped = out.preempted;
  p.num_tokens = out.num_tokens;
  p.seqs.reserve(out.seqs.size());
  for (const scheduler::ScheduledSequence& s : out.seqs) {
    if (s.slot_init != scheduler::SlotInit::keep)
      p.prepare.push_back({s.kda_slot, s.slot_init == scheduler::SlotInit::restore ? s.restore_checkpoint : -1});
    PlannedSequence q;
    q.id = s.id;
    q.tokens = out.tokens_of(s);
    q.new_blocks = out.new_blocks_of(s);
    q.start = s.start;
    q.kda_slot = s.kda_slot;
    q.kind = s.kind;
    q.fresh = s.fresh();
    q.sample = s.sample;
    q.num_drafts = s.num_drafts;
    p.num_logit_rows += 1 + s.num_drafts;
    p.num_verifies += s.num_drafts > 0 ? 1 : 0;
    p.seqs.push_back(q);
    if (s.save_checkpoint >= 0) p.saves.push_back({s.kda_slot, s.save_checkpoint});
  }
  return p;
}

}  // namespace k3::engine
