// runner/device_sampler.h: sampling a step's logits where they live.
//
// On a GPU a decode step's logits are [rows, vocab] f32 on the device (640 KB per row at K3's
// 163840). Downloading them and running the host Sampler costs a transfer and a host pass per row
// (docs/perf/kernel-notes.md, runner); the `sample` op
// (kernels/sampling) instead reads them on the device and returns per row the token, its logprob
// and the top-N logprobs: one small upload of per-row parameters, one small download.
//
// A row with a grammar mask (SampleRow::allowed) has it applied where its logits are: the
// token_mask op sets the refused ids to -inf on the device, then it samples like any other.
//
// Rows whose Sampler needs logit_bias or penalties (Sampler::device_eligible() false) go to their
// host Sampler with just their row downloaded. Every result equals what rows[i].sampler->sample()
// would return for that row, and each Sampler's Rng advances exactly as sample() would advance it
// (one draw when temperature > 0): greedy tokens, top-N ids and the kept sets of the filters are
// exact; a drawn token can differ from the host's only when the draw lies within ~1e-6 (relative)
// of a boundary of the cumulative distribution, and logprobs by ~1e-6 (kernels/sampling/sampling.h).
// A row whose logits hold NaN or +inf, or are all -inf, is handed to its host Sampler, which throws
// the error it always throws (its Rng has then already advanced; the step fails either way).
//
// With logits on the CPU (or a DeviceSampler built without ops) every row goes to its Sampler, so
// callers can use sample_rows() whatever the executor returns.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/device_memory.h"
#include "core/tensor.h"
#include "kernels/sampling/sampling.h"
#include "runner/sampler.h"

namespace k3::kernels {
struct Registry;
}

namespace k3::runner {

// One row to sample: the request's Sampler, the logits row and the request's tokens so far (read
// only by host rows with penalties).
struct SampleRow {
  Sampler* sampler = nullptr;
  int64_t logits_row = 0;
  std::span<const int32_t> prompt;
  std::span<const int32_t> output;
  // A constrained row's grammar mask ([ceil(vocab / 32)] words; empty: none): applied on the device
  // by the token_mask op before `sample` (the logits row is changed in place), or by the Sampler.
  std::span<const uint32_t> allowed = {};
};

class DeviceSampler {
 public:
  // Host only: every row through its Sampler.
  DeviceSampler() = default;
  // Samples device logits with ops.sample on memory's device; both must outlive the sampler.
  DeviceSampler(const kernels::Registry& ops, std::shared_ptr<core::DeviceMemory> memory);

  // `logits`: f32 [rows, vocab] on the CPU or on this sampler's device. One result per entry of
  // `rows`, in order. Throws core::Error as Sampler::sample does, or naming a bad row index.
  std::vector<SampleResult> sample(const core::TensorView& logits, std::span<const SampleRow> rows);

  // Rows sampled so far by the device op and by host Samplers.
  int64_t device_rows() const { return device_rows_; }
  int64_t host_rows() const { return host_rows_; }

 private:
  SampleResult sample_on_host(const core::TensorView& logits, const SampleRow& row);
  // The token_mask op over the device rows (device_index_) that carry a mask.
  void apply_masks(const core::TensorView& logits, std::span<const SampleRow> rows);

  const kernels::Registry* ops_ = nullptr;
  std::shared_ptr<core::DeviceMemory> memory_;
  std::vector<kernels::SampleRowParams> params_;  // the device rows of one call (reused)
  std::vector<size_t> device_index_;              // their positions in `rows`
  int64_t device_rows_ = 0, host_rows_ = 0;
};

// The engine's entry point: device->sample(logits, rows) when `device` is non-null, else every row
// through its host Sampler (logits then must be on the CPU).
std::vector<SampleResult> sample_rows(const core::TensorView& logits, std::span<const SampleRow> rows,
                                      DeviceSampler* device = nullptr);

}  // namespace k3::runner
