// core/step_kind.h: what a sequence does in one step, and where a step leaves its logits. One type
// each for the scheduler or engine, which plan them, and the model, which runs them
// (scheduler::StepKind and model::StepKind name this one; model::LogitsAt and engine's the other).
#pragma once
#include <cstdint>

namespace k3::core {

enum class StepKind : uint8_t {
  // Known tokens (a prompt chunk, or recomputation after a preemption): chunked KDA, naive MLA.
  prefill,
  // The token sampled last step, or the K + 1 rows of a speculative verify: recurrent KDA,
  // absorbed MLA.
  decode,
};

// Where a step leaves its logits: downloaded to the host (CPU tensors), or on the model's device
// for device-side sampling (valid until the next step of that model).
enum class LogitsAt : uint8_t { host, device };

}  // namespace k3::core
