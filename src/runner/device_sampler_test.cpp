// runner/device_sampler_test.cpp: DeviceSampler / sample_rows give exactly what Sampler::sample
// gives, row by row and step after step (same tokens, logprob bits, top-N lists, and the same Rng
// consumption): on the host path, and on a stand-in device (host memory labelled cuda, running the
// op's CPU reference) that exercises the device routing without a GPU: eligible rows through the op,
// bias/penalty rows downloaded to their Sampler, bad rows reported with the Sampler's own error.
#include "runner/device_sampler.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/rng.h"
#include "kernels/registry.h"
#include "runner/sampler_test_util.h"

namespace k3::runner {
namespace {

using core::DType;
using core::Tensor;

// Host memory whose tensors say Device::cuda: the DeviceSampler takes its device path, and the
// registry's "cuda" sample implementation is the CPU reference.
class StandInDevice final : public core::DeviceMemory {
 public:
  using core::DeviceMemory::upload;
  core::Device device() const override { return core::Device::cuda; }
  Tensor empty(DType dtype, core::Shape shape) override { return relabel(Tensor::zeros(dtype, shape)); }
  void fill_bytes(const core::TensorView& dst, uint8_t byte) override {
    std::memset(dst.data, byte, static_cast<size_t>(dst.nbytes()));
  }
  Tensor upload(const core::TensorView& host, DType as) override {
    EXPECT_EQ(as, host.dtype);
    ++uploads;
    return relabel(Tensor::copy_of(host));
  }
  void copy_from_host(const core::TensorView& dst, const core::TensorView& host) override {
    std::memcpy(dst.data, host.data, static_cast<size_t>(host.nbytes()));
  }
  void copy(const core::TensorView& dst, const core::TensorView& src) override {
    std::memcpy(dst.data, src.data, static_cast<size_t>(src.nbytes()));
  }
  Tensor download_f32(const core::TensorView& src) override {
    EXPECT_EQ(src.dtype, DType::f32);
    downloaded_floats += src.numel();
    core::TensorView v = src;
    v.device = core::Device::cpu;
    return Tensor::copy_of(v);
  }
  void synchronize() override {}

  static Tensor relabel(Tensor t) {
    core::TensorView v = t.view();
    v.device = core::Device::cuda;
    return Tensor(v, std::make_shared<Tensor>(std::move(t)));  // keeps t's storage alive
  }
  int64_t uploads = 0, downloaded_floats = 0;
};

// The reference ops, plus the op's CPU reference registered as the stand-in device's sample.
struct StandInRegistry {
  kernels::Registry r;
  StandInRegistry() {
    kernels::register_reference_ops(r);
    r.sample.add({"stand_in", core::Device::cuda, nullptr, kernels::sample_reference});
  }
};

Tensor random_logits(int64_t rows, int64_t V, uint64_t seed) {
  core::Rng rng(seed);
  Tensor t = Tensor::zeros(DType::f32, {rows, V});
  for (float& v : t.span<float>()) v = static_cast<float>(rng.normal() * 2.0);
  return t;
}

// The parameter mix of a batch: greedy, sampled with every filter, logprobs of several widths, and
// rows the device cannot take (bias, repetition, presence/frequency penalties).
std::vector<SamplingParams> request_mix() {
  std::vector<SamplingParams> mix(9);
  mix[1].temperature = 1.0f, mix[1].seed = 3;
  mix[2].temperature = 0.7f, mix[2].top_k = 20, mix[2].top_p = 0.9f, mix[2].seed = 4, mix[2].logprobs = 5;
  mix[3].temperature = 1.3f, mix[3].min_p = 0.05f, mix[3].seed = 5, mix[3].logprob = true;
  mix[4].logprobs = 20;  // greedy with the widest top-N
  mix[5].temperature = 0.9f, mix[5].logit_bias = {{3, 5.0f}}, mix[5].seed = 6, mix[5].logprobs = 2;
  mix[6].temperature = 0.8f, mix[6].repetition_penalty = 1.3f, mix[6].seed = 7;
  mix[7].presence_penalty = 0.5f, mix[7].frequency_penalty = 0.3f, mix[7].logprob = true;
  mix[8].temperature = 0.5f, mix[8].top_p = 0.5f, mix[8].seed = 8;
  return mix;
}

void expect_same(const SampleResult& got, const SampleResult& want, const std::string& where) {
  EXPECT_EQ(got.token, want.token) << where;
  EXPECT_EQ(std::bit_cast<uint32_t>(got.logprob), std::bit_cast<uint32_t>(want.logprob))
      << where << ": " << got.logprob << " vs " << want.logprob;
  ASSERT_EQ(got.top_logprobs.size(), want.top_logprobs.size()) << where;
  for (size_t j = 0; j < want.top_logprobs.size(); ++j) {
    EXPECT_EQ(got.top_logprobs[j].first, want.top_logprobs[j].first) << where << " top " << j;
    EXPECT_EQ(std::bit_cast<uint32_t>(got.top_logprobs[j].second), std::bit_cast<uint32_t>(want.top_logprobs[j].second))
        << where << " top " << j;
  }
}

// Steps of a batch: each step's logits (rows in a shuffled order, one row unused) go through
// `sample` for the rows' Samplers and through Sampler::sample for twins of the same seeds.
void run_steps(const std::function<std::vector<SampleResult>(const Tensor&, std::span<const SampleRow>)>& sample,
               int64_t V, int steps) {
  const std::vector<SamplingParams> mix = request_mix();
  std::vector<std::unique_ptr<Sampler>> under_test, twins;
  for (const auto& p : mix) {
    under_test.push_back(std::make_unique<Sampler>(p, static_cast<int32_t>(V)));
    twins.push_back(std::make_unique<Sampler>(p, static_cast<int32_t>(V)));
  }
  const std::vector<int32_t> prompt = {1, 2, 3, 2};
  std::vector<std::vector<int32_t>> outputs(mix.size());
  for (int step = 0; step < steps; ++step) {
    const int64_t rows = static_cast<int64_t>(mix.size()) + 1;
    const Tensor logits = random_logits(rows, V, 500 + static_cast<uint64_t>(step) * 13 + static_cast<uint64_t>(V));
    std::vector<SampleRow> batch;
    for (size_t i = 0; i < mix.size(); ++i)
      batch.push_back({under_test[i].get(), static_cast<int64_t>((i * 5 + static_cast<size_t>(step)) % mix.size()) + 1,
                       prompt, outputs[i]});
    const std::vector<SampleResult> got = sample(logits, batch);
    ASSERT_EQ(got.size(), mix.size());
    for (size_t i = 0; i < mix.size(); ++i) {
      const std::span<const float> x(logits.data<const float>() + batch[i].logits_row * V, static_cast<size_t>(V));
      const SampleResult want = twins[i]->sample(x, prompt, outputs[i]);
      expect_same(got[i], want, "step " + std::to_string(step) + " request " + std::to_string(i));
      outputs[i].push_back(want.token);
    }
  }
  for (size_t i = 0; i < mix.size(); ++i)  // the Rngs advanced alike
    EXPECT_EQ(under_test[i]->draw_uniform(), twins[i]->draw_uniform()) << "request " << i;
}

TEST(DeviceSampler, HostPathIsSamplerSampleStepAfterStep) {
  for (int64_t V : {23, 1000}) {
    run_steps([](const Tensor& logits, std::span<const SampleRow> rows) { return sample_rows(logits.view(), rows); }, V,
              6);
    DeviceSampler host_only;
    run_steps([&](const Tensor& logits,
                  std::span<const SampleRow> rows) { return host_only.sample(logits.view(), rows); },
              V, 3);
    EXPECT_EQ(host_only.device_rows(), 0);
  }
}

TEST(DeviceSampler, HostLogitsWithADeviceSamplerStayOnTheHost) {
  const StandInRegistry ops;
  DeviceSampler ds(ops.r, std::make_shared<StandInDevice>());
  run_steps([&](const Tensor& logits,
                std::span<const SampleRow> rows) { return sample_rows(logits.view(), rows, &ds); },
            97, 3);
  EXPECT_EQ(ds.device_rows(), 0);
  EXPECT_EQ(ds.host_rows(), 27);
}

TEST(DeviceSampler, DeviceLogitsRouteEligibleRowsToTheOpAndTheRestToTheirSampler) {
  for (int64_t V : {23, 1000, 20480}) {
    const StandInRegistry ops;
    auto dev = std::make_shared<StandInDevice>();
    DeviceSampler ds(ops.r, dev);
    const int steps = V > 10000 ? 2 : 5;
    run_steps(
        [&](const Tensor& logits, std::span<const SampleRow> rows) {
          const Tensor on_device = dev->upload(logits.view());
          return ds.sample(on_device.view(), rows);
        },
        V, steps);
    EXPECT_EQ(ds.device_rows(), 6 * steps) << V;  // requests 0-4 and 8
    EXPECT_EQ(ds.host_rows(), 3 * steps) << V;    // bias, repetition, presence/frequency
    // Per step: the three host rows' logits and the device rows' results (2 + 2 * 20 floats each).
    EXPECT_EQ(dev->downloaded_floats, steps * (3 * V + 6 * 42)) << V;
  }
}

TEST(DeviceSampler, ABadDeviceRowThrowsTheSamplersError) {
  const StandInRegistry ops;
  auto dev = std::make_shared<StandInDevice>();
  DeviceSampler ds(ops.r, dev);
  Tensor logits = random_logits(2, 40, 9);
  logits.data<float>()[40 + 7] = std::numeric_limits<float>::quiet_NaN();
  SamplingParams greedy, hot;
  hot.temperature = 1.0f;
  for (const SamplingParams& p : {greedy, hot}) {
    Sampler ok(p, 40), bad(p, 40);
    const SampleRow rows[] = {{&ok, 0, {}, {}}, {&bad, 1, {}, {}}};
    const Tensor on_device = dev->upload(logits.view());
    const std::string msg = testing::error_of([&] { ds.sample(on_device.view(), rows); });
    EXPECT_NE(msg.find("logits[7] is nan"), std::string::npos) << msg;
  }
  for (int64_t i = 0; i < 40; ++i) logits.data<float>()[40 + i] = -std::numeric_limits<float>::infinity();
  Sampler masked(greedy, 40);
  const SampleRow rows[] = {{&masked, 1, {}, {}}};
  const Tensor on_device = dev->upload(logits.view());
  const std::string msg = testing::error_of([&] { ds.sample(on_device.view(), rows); });
  EXPECT_NE(msg.find("every logit is -inf"), std::string::npos) << msg;
}

TEST(DeviceSampler, BadRowsAndMissingSamplersAreNamed) {
  const Tensor logits = random_logits(2, 10, 1);
  Sampler s(SamplingParams{}, 10);
  const SampleRow out_of_range[] = {{&s, 2, {}, {}}};
  std::string msg = testing::error_of([&] { sample_rows(logits.view(), out_of_range); });
  EXPECT_NE(msg.find("logits row 2"), std::string::npos) << msg;
  const SampleRow no_sampler[] = {{nullptr, 0, {}, {}}};
  msg = testing::error_of([&] { sample_rows(logits.view(), no_sampler); });
  EXPECT_NE(msg.find("no Sampler"), std::string::npos) << msg;
  const Tensor on_device = StandInDevice::relabel(Tensor::copy_of(logits.view()));
  const SampleRow one[] = {{&s, 0, {}, {}}};
  msg = testing::error_of([&] { sample_rows(on_device.view(), one); });
  EXPECT_NE(msg.find("no DeviceSampler"), std::string::npos) << msg;
}

// draw_uniform() consumes what sample() consumes: none when greedy, one draw otherwise.
TEST(DeviceSampler, DrawUniformConsumesExactlyWhatSampleDoes) {
  const Tensor logits = random_logits(1, 50, 2);
  for (float T : {0.0f, 0.5f}) {
    SamplingParams p;
    p.temperature = T, p.seed = 42, p.top_k = 7;
    Sampler a(p, 50), b(p, 50);
    for (int i = 0; i < 5; ++i) {
      a.sample(logits.span<const float>(), {}, {});
      const double u = b.draw_uniform();
      if (T == 0.0f) {
        EXPECT_EQ(u, 0.0);
      }
    }
    EXPECT_EQ(a.draw_uniform(), b.draw_uniform()) << "T " << T;
    EXPECT_TRUE(a.device_eligible());
  }
  SamplingParams biased;
  biased.logit_bias = {{1, 1.0f}};
  EXPECT_FALSE(Sampler(biased, 50).device_eligible());
}

}  // namespace
}  // namespace k3::runner
