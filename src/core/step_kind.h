// core/step_kind.h: what a sequence does in one step. One type for the scheduler, which plans it,
// and the model, which runs it (scheduler::StepKind and model::StepKind name this one).
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

}  // namespace k3::core
