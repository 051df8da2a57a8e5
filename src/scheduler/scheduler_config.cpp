// scheduler/scheduler_config.cpp: SchedulerConfig validation.
#include "scheduler/scheduler_config.h"

#include "core/error.h"

namespace k3::scheduler {

void SchedulerConfig::validate(const cache::CacheConfig& c) const {
  c.validate();
  auto s = [](int64_t v) { return std::to_string(v); };
  K3_CHECK(max_num_seqs > 0, "scheduler: max_num_seqs must be > 0, got " + s(max_num_seqs));
  K3_CHECK(max_num_seqs <= c.num_slots,
           "scheduler: max_num_seqs (" + s(max_num_seqs) + ") exceeds the KDA slots (" + s(c.num_slots) + ")");
  // Every running request may decode in the same step, so decodes never wait for budget.
  K3_CHECK(max_num_batched_tokens >= max_num_seqs, "scheduler: max_num_batched_tokens (" + s(max_num_batched_tokens) +
                                                       ") must be >= max_num_seqs (" + s(max_num_seqs) + ")");
  K3_CHECK(chunk_align_tokens >= 0 && chunk_align_tokens % c.block_size == 0,
           "scheduler: chunk_align_tokens (" + s(chunk_align_tokens) + ") must be 0 or a multiple of block_size (" +
               s(c.block_size) + ")");
  const int32_t align = chunk_align(c);
  K3_CHECK(!c.enable_prefix_cache || c.checkpoint_interval_tokens() % align == 0,
           "scheduler: with the prefix cache on, the checkpoint interval (" + s(c.checkpoint_interval_tokens()) +
               " tokens) must be a multiple of chunk_align_tokens (" + s(align) + ")");
  // A chunk that does not finish its prompt ends on an alignment boundary, so one must fit.
  K3_CHECK(long_prefill_token_threshold >= align, "scheduler: long_prefill_token_threshold (" +
                                                      s(long_prefill_token_threshold) +
                                                      ") must be >= the chunk alignment (" + s(align) + ")");
  K3_CHECK(max_num_batched_tokens >= align, "scheduler: max_num_batched_tokens (" + s(max_num_batched_tokens) +
                                                ") must be >= the chunk alignment (" + s(align) + ")");
  K3_CHECK(max_partial_prefills > 0, "scheduler: max_partial_prefills must be > 0, got " + s(max_partial_prefills));
  K3_CHECK(max_long_partial_prefills > 0 && max_long_partial_prefills <= max_partial_prefills,
           "scheduler: max_long_partial_prefills must be in [1, max_partial_prefills = " + s(max_partial_prefills) +
               "], got " + s(max_long_partial_prefills));
  K3_CHECK(max_model_len > 1, "scheduler: max_model_len must be > 1, got " + s(max_model_len));
  // One request of max_model_len tokens must fit alone, or preemption could not end.
  const int64_t need = (max_model_len + c.block_size - 1) / c.block_size;
  K3_CHECK(need <= c.num_blocks, "scheduler: one request of max_model_len " + s(max_model_len) + " tokens needs " +
                                     s(need) + " pages but the cache has " + s(c.num_blocks));
}

std::string describe(const SchedulerConfig& c) {
  return "max_num_seqs=" + std::to_string(c.max_num_seqs) +
         " max_num_batched_tokens=" + std::to_string(c.max_num_batched_tokens) +
         " max_partial_prefills=" + std::to_string(c.max_partial_prefills) +
         " max_long_partial_prefills=" + std::to_string(c.max_long_partial_prefills) +
         " long_prefill_token_threshold=" + std::to_string(c.long_prefill_token_threshold) +
         " max_model_len=" + std::to_string(c.max_model_len) +
         " chunk_align_tokens=" + std::to_string(c.chunk_align_tokens);
}

}  // namespace k3::scheduler
