// scheduler/scheduler_config.h: limits of one scheduling step.
#pragma once
#include <cstdint>
#include <string>

#include "cache/cache_config.h"

namespace k3::scheduler {

struct SchedulerConfig {
  int32_t max_num_seqs = 64;              // requests running at once (<= KDA slots)
  int32_t max_num_batched_tokens = 2048;  // tokens per step, decodes + prefill chunks
  // Chunked prefill (vLLM's flags of the same names). A prompt with more than
  // long_prefill_token_threshold tokens left to prefill is long. A prompt alone in its step (no
  // decode rows, no other prompt that could advance) takes the whole token budget, so a cold long
  // prompt reaches its first token in as few steps as the budget allows. In a contended step a
  // long prompt's chunk is at most the threshold, so decoding requests' inter-token latency and
  // short prompts' time to first token do not wait on it.
  int32_t max_partial_prefills = 4;            // prompts advancing in one step
  int32_t max_long_partial_prefills = 1;       // of them, long ones; short prompts pass waiting long ones
  int32_t long_prefill_token_threshold = 512;  // > this many tokens left: long
  int64_t max_model_len = 8192;                // prompt + output tokens of one request
  // A chunk that does not finish its known tokens ends on a multiple of this (0: block_size).
  // Set it to the KDA chunk size (a multiple of block_size) and every prefill chunk starts on
  // a KDA chunk boundary, whatever else shares the step, so a prompt's logits do not depend on
  // batch composition or on prefix hits (which then must be multiples too: with the prefix
  // cache on, the checkpoint interval must be a multiple of it).
  int32_t chunk_align_tokens = 0;

  int32_t chunk_align(const cache::CacheConfig& c) const {
    return chunk_align_tokens > 0 ? chunk_align_tokens : c.block_size;
  }

  // Throws core::Error naming the field when a value is out of range or does not fit the
  // cache (slots for max_num_seqs, pages for one max_model_len request).
  void validate(const cache::CacheConfig& cache) const;
};

std::string describe(const SchedulerConfig& c);

}  // namespace k3::scheduler
