// spec/drafter.h: the interface every speculative-decoding drafter implements (n-gram prompt
// lookup, the synthetic benchmark drafter, model-based drafters such as DSpark in src/draft/).
//
// One engine step with speculation, per decoding request r (K = num_speculative_tokens):
//   1. propose   the engine asks the drafter for up to max_drafts(r) <= K tokens that follow
//                r's tokens so far (prompt ++ output; the last of them is the newest sampled
//                token, not yet run through the target).
//   2. verify    the target runs the K'+1 rows [last, d1..dK'] as one decode step (StepKind::decode
//                with several tokens; KDA in no-commit mode, spec §5.9 (b)) and returns K'+1
//                logits rows.
//   3. accept    greedy: the longest prefix of drafts equal to the target's argmax, then the
//                target's token at the first mismatch (or the bonus token after all K'); sampled:
//                rejection sampling (spec/acceptance.h). n accepted drafts -> n+1 new tokens.
//   4. commit    the target replays the n+1 accepted rows into its committed KDA state; the MLA
//                cache is truncated to the accepted length.
//   5. hooks     on_accepted(r, n) after acceptance; release(r) when r leaves the engine
//                (finished, aborted, failed or preempted: a preempted request is proposed for
//                again from scratch when it resumes, so a drafter must not assume continuity
//                across release()).
//
// Model-based drafters and the target's hidden states (spec §13.1/§13.2):
//   A drafter that needs the target's hidden states returns the layers it wants from
//   hidden_tap(). The target's forward then taps, for every row it runs in a step (prefill
//   chunks, decode and verify rows), the AttnRes mixture that the attention side of layer
//   `l + 1` computes (the pre-norm input "the next layer would see", which is what SGLang
//   captures for DSpark), for each requested layer l. After the step the engine calls
//   observe() once per sequence with only the COMMITTED rows: all rows of a prefill chunk or
//   plain decode, the n+1 accepted rows of a verify step (rows of rejected drafts are dropped),
//   so the drafter's context always matches the target's committed KV. The rows are given in
//   token order with the absolute position of the first one. A request admitted with a prefix-cache
//   hit is first observed at a position > 0 (the cached prefix was computed for another request and
//   its taps are not kept); a drafter needing them must treat that prefix as unseen context.
//   (Status: this header fixes the contract; the target-side tap is filled in by the model
//   when a drafter asks for it. Drafters that return an empty tap never see observe().)
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace k3::spec {

using RequestId = uint64_t;  // = scheduler::RequestId (spec/ does not link the scheduler)

// Which target layers a drafter wants tapped (0-based target layer ids; DSpark on K3:
// {2, 23, 47, 71, 89}). Empty: no tap (n-gram, synthetic).
struct HiddenTapRequest {
  std::vector<int32_t> layers;
  bool empty() const { return layers.empty(); }
};

// The committed rows of one sequence's tap after one target step.
//   hidden   f32 [rows, layers.size() * hidden_size] on the target's device: per row, the tapped
//            mixtures of the requested layers concatenated in HiddenTapRequest::layers order
//            (the values as stored between ops: bf16-rounded in Precision::bf16)
//   position absolute token position of row 0 (row i is the state after token position+i)
//   tokens   the rows' input tokens, [rows]
struct HiddenTapRows {
  core::TensorView hidden;
  int64_t position = 0;
  std::span<const int32_t> tokens;
  int64_t rows() const { return static_cast<int64_t>(tokens.size()); }
};

// One request's proposal input.
struct DraftQuery {
  RequestId id = 0;
  std::span<const int32_t> tokens;  // prompt ++ output so far (the last is the newest sampled token)
  int64_t prompt_len = 0;           // tokens[0, prompt_len) is the prompt
  int32_t max_drafts = 0;           // propose at most this many (>= 1; the engine's adaptive length)
};

// One request's proposal.
//   tokens  0..max_drafts draft tokens (fewer or none is fine: the step then verifies fewer rows)
//   probs   empty: point-mass drafts (a deterministic drafter: q(d_i) = 1), which is what
//           n-gram and greedy model drafters give; otherwise the draft distributions q,
//           f32 [tokens.size() * vocab] row-major (row i = q over the vocabulary at draft i), used
//           by rejection sampling for temperature > 0 (accept d with min(1, p(d)/q(d)), on
//           rejection sample normalize(max(0, p - q))).
struct Draft {
  std::vector<int32_t> tokens;
  std::vector<float> probs;
  void clear() {
    tokens.clear();
    probs.clear();
  }
};

class Drafter {
 public:
  virtual ~Drafter() = default;
  // For log lines and stats ("ngram", "synthetic", "dspark").
  virtual std::string name() const = 0;
  // True for drafters whose acceptance the engine forces (SyntheticDrafter): outputs are then NOT
  // the model's real distribution, and stats, metrics and logs say "synthetic".
  virtual bool synthetic() const { return false; }
  // The target layers to tap (called once, when the engine is built).
  virtual HiddenTapRequest hidden_tap() const { return {}; }

  // Proposes drafts for a batch of requests at once (a model drafter runs them as one forward).
  // `out` has batch.size() entries, cleared by the engine; out[i] answers batch[i].
  virtual void propose(std::span<const DraftQuery> batch, std::span<Draft> out) = 0;

  // The committed tap rows of one sequence after a target step (only with a non-empty
  // hidden_tap()); called before on_accepted for the same step.
  virtual void observe(RequestId /*id*/, const HiddenTapRows& /*rows*/) {}
  // After verification: `num_accepted` of the `num_proposed` drafts were accepted (the target
  // then added one more token of its own unless the request finished).
  virtual void on_accepted(RequestId /*id*/, int32_t /*num_proposed*/, int32_t /*num_accepted*/) {}
  // The request left the engine or was preempted: drop everything kept for it.
  virtual void release(RequestId /*id*/) {}
};

}  // namespace k3::spec
