// scheduler/request.cpp: Request and the lifecycle's names.
#include "scheduler/request.h"

#include "cache/block_hash.h"

namespace k3::scheduler {

const char* to_string(FinishReason r) {
  switch (r) {
    case FinishReason::stop: return "stop";
    case FinishReason::length: return "length";
    case FinishReason::abort: return "abort";
    case FinishReason::error: return "error";
  }
  return "?";
}

const char* state_name(const RequestState& s) {
  static constexpr const char* kNames[] = {"waiting", "prefilling", "decoding", "preempted", "finished"};
  return kNames[s.index()];
}

Request::Request(RequestId id, RequestSpec spec, int32_t block_size, Clock::time_point arrival)
    : id_(id), spec_(std::move(spec)), block_size_(block_size), tokens_(spec_.prompt) {
  stats.arrival = arrival;
  stats.prompt_tokens = prompt_len();
  tokens_.reserve(spec_.prompt.size() + static_cast<size_t>(spec_.max_tokens > 0 ? spec_.max_tokens : 0));
  cache::extend_block_hashes(hashes_, tokens_, block_size_);
}

void Request::append_output(int32_t token) {
  tokens_.push_back(token);
  if (tokens_.size() % static_cast<size_t>(block_size_) == 0) cache::extend_block_hashes(hashes_, tokens_, block_size_);
}

Running* Request::running() {
  if (auto* p = std::get_if<Prefilling>(&state_)) return p;
  if (auto* d = std::get_if<Decoding>(&state_)) return d;
  return nullptr;
}
const Running* Request::running() const { return const_cast<Request*>(this)->running(); }

}  // namespace k3::scheduler
