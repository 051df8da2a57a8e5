// spec/synthetic_drafter.cpp: SyntheticDrafter.
#include "spec/synthetic_drafter.h"

#include "core/error.h"

namespace k3::spec {

SyntheticDrafter::SyntheticDrafter(int32_t acceptance_length) : acceptance_length_(acceptance_length) {
  K3_CHECK(acceptance_length >= 1,
           "SyntheticDrafter: acceptance_length must be >= 1, got " + std::to_string(acceptance_length));
}

void SyntheticDrafter::propose(std::span<const DraftQuery> batch, std::span<Draft> out) {
  K3_CHECK(out.size() == batch.size(), "SyntheticDrafter::propose: out has " + std::to_string(out.size()) +
                                           " entries for " + std::to_string(batch.size()) + " queries");
  for (size_t i = 0; i < batch.size(); ++i) {
    out[i].clear();
    if (batch[i].tokens.empty() || batch[i].max_drafts <= 0) continue;
    // Only AL - 1 of them can be accepted: proposing more would only add rejected rows.
    const int32_t n = std::min(batch[i].max_drafts, acceptance_length_ - 1);
    out[i].tokens.assign(static_cast<size_t>(std::max(n, 0)), batch[i].tokens.back());
  }
}

}  // namespace k3::spec
