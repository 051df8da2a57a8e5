// runner/device_sampler.cpp: DeviceSampler — routes each row to the device `sample` op or to its
// host Sampler, packs the device rows' parameters and unpacks their results (device_sampler.h).
#include "runner/device_sampler.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "core/error.h"
#include "kernels/registry.h"

namespace k3::runner {

namespace {

void check_logits(const core::TensorView& logits, std::span<const SampleRow> rows) {
  K3_CHECK(logits.dtype == core::DType::f32 && logits.rank() == 2 && logits.strides[1] == 1,
           "sample_rows: logits must be f32 [rows, vocab] with contiguous rows, got " +
               std::string(core::dtype_name(logits.dtype)) + " " + logits.shape.str());
  for (size_t i = 0; i < rows.size(); ++i) {
    K3_CHECK(rows[i].sampler != nullptr, "sample_rows: row " + std::to_string(i) + " has no Sampler");
    K3_CHECK(rows[i].logits_row >= 0 && rows[i].logits_row < logits.dim(0),
             "sample_rows: row " + std::to_string(i) + " reads logits row " + std::to_string(rows[i].logits_row) +
                 ", outside the " + std::to_string(logits.dim(0)) + " rows of the logits");
  }
}

}  // namespace

DeviceSampler::DeviceSampler(const kernels::Registry& ops, std::shared_ptr<core::DeviceMemory> memory)
    : ops_(&ops), memory_(std::move(memory)) {
  K3_CHECK(memory_ != nullptr, "DeviceSampler: memory is null");
}

SampleResult DeviceSampler::sample_on_host(const core::TensorView& logits, const SampleRow& row) {
  ++host_rows_;
  const int64_t V = logits.dim(1);
  if (logits.device == core::Device::cpu) {
    const float* x = logits.as<const float>() + row.logits_row * logits.strides[0];
    return row.sampler->sample({x, static_cast<size_t>(V)}, row.prompt, row.output, row.allowed);
  }
  K3_CHECK(memory_ != nullptr, "sample_rows: logits live on " + std::string(core::device_name(logits.device)) +
                                   " but no DeviceSampler for that device was given");
  const core::Tensor host = memory_->download_f32(logits.row(row.logits_row));  // 640 KB at K3's vocab
  return row.sampler->sample(host.span<const float>(), row.prompt, row.output, row.allowed);
}

std::vector<SampleResult> DeviceSampler::sample(const core::TensorView& logits, std::span<const SampleRow> rows) {
  check_logits(logits, rows);
  std::vector<SampleResult> results(rows.size());
  if (ops_ == nullptr || logits.device == core::Device::cpu) {
    for (size_t i = 0; i < rows.size(); ++i) results[i] = sample_on_host(logits, rows[i]);
    return results;
  }
  memory_->make_current();  // the calling thread (the engine's) may not have this GPU current
  K3_CHECK(logits.device == memory_->device(),
           "DeviceSampler: logits live on " + std::string(core::device_name(logits.device)) +
               ", the sampler's memory on " + std::string(core::device_name(memory_->device())));
  const int64_t V = logits.dim(1);
  params_.clear();
  device_index_.clear();
  int32_t max_top = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    Sampler& s = *rows[i].sampler;
    if (!s.device_eligible()) continue;
    const SamplingParams& sp = s.params();
    kernels::SampleRowParams p;
    p.logits_row = static_cast<int32_t>(rows[i].logits_row);
    p.temperature = sp.temperature;
    p.top_p = sp.top_p;
    p.min_p = sp.min_p;
    p.top_k = sp.top_k;
    p.num_top = sp.logprobs;
    p.want_logprob = sp.logprob;
    p.uniform = s.draw_uniform();  // the one draw sample() would take (none when greedy)
    params_.push_back(p);
    device_index_.push_back(i);
    max_top = std::max(max_top, sp.logprobs);
  }
  std::vector<bool> done(rows.size(), false);
  apply_masks(logits, rows);
  if (!params_.empty()) {
    const core::Tensor host_params = kernels::pack_sample_params(params_);
    const core::Tensor params = memory_->upload(host_params.view());
    const int64_t R = static_cast<int64_t>(params_.size()), width = 2 + 2 * int64_t{max_top};
    const core::Tensor out = memory_->empty(core::DType::f32, {R, width});
    ops_->sample.run({logits, params.view(), out.view()}, memory_->device());
    const core::Tensor got = memory_->download_f32(out.view());  // R * (2 + 2N) floats
    for (int64_t r = 0; r < R; ++r) {
      const float* o = got.data<const float>() + r * width;
      const size_t i = device_index_[static_cast<size_t>(r)];
      if (o[kernels::kOutToken] < 0.0f) continue;  // NaN / +inf / all -inf: the host Sampler says which
      SampleResult& res = results[i];
      res.token = static_cast<int32_t>(o[kernels::kOutToken]);
      res.logprob = o[kernels::kOutLogprob];  // NaN unless asked for, as the Sampler's
      const int n = params_[static_cast<size_t>(r)].num_top;
      res.top_logprobs.reserve(static_cast<size_t>(n));
      for (int j = 0; j < n; ++j)
        res.top_logprobs.emplace_back(static_cast<int32_t>(o[kernels::kOutTopIds + j]),
                                      o[kernels::out_top_logprobs_col(max_top) + j]);
      done[i] = true;
      ++device_rows_;
    }
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    if (done[i]) continue;
    const bool flagged = rows[i].sampler->device_eligible();
    results[i] = sample_on_host(logits, rows[i]);
    // A flagged row's logits make sample() throw before it draws; reaching here means the device
    // op and the host disagree about the row (and the Rng took a second draw): say so.
    K3_CHECK(!flagged, "DeviceSampler: the device flagged logits row " + std::to_string(rows[i].logits_row) +
                           " (NaN, +inf or all -inf) but the host Sampler accepted it (vocab " + std::to_string(V) +
                           ")");
  }
  return results;
}

void DeviceSampler::apply_masks(const core::TensorView& logits, std::span<const SampleRow> rows) {
  const int64_t words = (logits.dim(1) + 31) / 32;
  int64_t n = 0;
  for (size_t i : device_index_) n += !rows[i].allowed.empty();
  if (n == 0) return;
  core::Tensor masks = core::Tensor::zeros(core::DType::i32, {n, words});
  core::Tensor which = core::Tensor::zeros(core::DType::i32, {n});
  int64_t k = 0;
  for (size_t i : device_index_) {
    if (rows[i].allowed.empty()) continue;
    K3_CHECK(static_cast<int64_t>(rows[i].allowed.size()) == words,
             "sample_rows: row " + std::to_string(i) + "'s mask has " + std::to_string(rows[i].allowed.size()) +
                 " words, expected " + std::to_string(words));
    std::memcpy(masks.data<int32_t>() + k * words, rows[i].allowed.data(), static_cast<size_t>(words) * 4);
    which.data<int32_t>()[k++] = static_cast<int32_t>(rows[i].logits_row);
  }
  const core::Tensor d_masks = memory_->upload(masks.view()), d_rows = memory_->upload(which.view());
  ops_->token_mask.run({logits, d_masks.view(), d_rows.view()}, memory_->device());
}

std::vector<SampleResult> sample_rows(const core::TensorView& logits, std::span<const SampleRow> rows,
                                      DeviceSampler* device) {
  if (device != nullptr) return device->sample(logits, rows);
  DeviceSampler host_only;
  return host_only.sample(logits, rows);
}

}  // namespace k3::runner
