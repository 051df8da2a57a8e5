// runner/model_runner.cpp: ModelRunner.
#include "runner/model_runner.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/log.h"
#include "fastpath/fused_decode.h"

#ifdef K3_HAVE_CUDA
#include "backends/cuda/context.h"
#include "backends/cuda/cuda_memory.h"
#include "kernels/registry.h"
#endif

namespace k3::runner {

std::unique_ptr<ModelRunner> ModelRunner::open(const std::filesystem::path& dir, const model::ModelOptions& options,
                                               model::KvCacheDtype kv_cache,
                                               const checkpoint::LoadProgressFn& progress) {
  return std::make_unique<ModelRunner>(checkpoint::load_checkpoint(dir, progress), options, kv_cache);
}

ModelRunner::ModelRunner(checkpoint::LoadedModel loaded, const model::ModelOptions& options,
                         model::KvCacheDtype kv_cache)
    : loaded_(std::move(loaded)), kv_cache_(kv_cache) {
  kernels::register_reference_ops(registry_);
  memory_ = core::make_host_memory();
  if (options.device == core::Device::cuda) {
#ifdef K3_HAVE_CUDA
    auto ctx = backends::cuda::Context::create(0);
    kernels::register_cuda_ops(registry_, ctx);
    memory_ = backends::cuda::make_device_memory(ctx);
#else
    throw core::Error("device cuda: this build has no CUDA backend (configure with nvcc present)");
#endif
  }
  device_weights_ = model::to_device(loaded_.weights, *memory_);
  // Each op's first choice of implementation, with the tuning rule behind it (--log-level debug).
  registry_.set_log([](const std::string& line) { log::debug(line); });
  model_ = std::make_unique<model::Model>(loaded_.config, device_weights_, registry_, options, memory_);
  fastpath::attach(*model_, 0, fastpath_log());
}

kernels::LogFn fastpath_log() {
  return [](const std::string& line) { log::info(line); };
}

model::LocalCache ModelRunner::new_cache(int64_t max_tokens) const {
  return model::LocalCache(config(), 1, max_tokens, kv_cache_, 16, memory_, model_->options().precision);
}

void ModelRunner::check_ids(std::span<const int32_t> tokens) const {
  K3_CHECK(!tokens.empty(), "no token ids given");
  for (int32_t id : tokens)
    K3_CHECK(id >= 0 && id < config().vocab_size, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                                      std::to_string(config().vocab_size) + ")");
}

core::Tensor ModelRunner::logits(std::span<const int32_t> tokens, int64_t decode_from) const {
  check_ids(tokens);
  const auto T = static_cast<int64_t>(tokens.size());
  K3_CHECK(decode_from >= 0 && decode_from <= T,
           "--decode-from must be in [0, " + std::to_string(T) + "], got " + std::to_string(decode_from));
  const int64_t V = config().vocab_size;
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {T, V});
  model::LocalCache cache = new_cache(T);
  model::SequenceState state = cache.new_sequence();
  auto copy_rows = [&](const core::Tensor& rows, int64_t at) {
    std::memcpy(out.data<float>() + at * V, rows.data<const float>(),
                static_cast<size_t>(rows.numel()) * sizeof(float));
  };
  if (decode_from > 0) {
    const model::SequenceInput in{tokens.first(static_cast<size_t>(decode_from)), &state, model::StepKind::prefill};
    copy_rows(model_->forward(cache.storage(), {&in, 1}, model::LogitRows::all), 0);
  }
  for (int64_t t = decode_from; t < T; ++t) {
    const model::SequenceInput in{tokens.subspan(static_cast<size_t>(t), 1), &state, model::StepKind::decode};
    copy_rows(model_->forward(cache.storage(), {&in, 1}, model::LogitRows::all), t);
  }
  return out;
}

std::vector<int32_t> ModelRunner::generate(std::span<const int32_t> prompt, int64_t max_tokens,
                                           const SamplingParams& sampling, const std::function<void(int32_t)>& on_token,
                                           GenerateStats* stats) const {
  check_ids(prompt);
  K3_CHECK(max_tokens >= 0, "max_tokens must be >= 0, got " + std::to_string(max_tokens));
  Sampler sampler(sampling, static_cast<int32_t>(config().vocab_size));
  using clock = std::chrono::steady_clock;
  model::LocalCache cache = new_cache(static_cast<int64_t>(prompt.size()) + std::max<int64_t>(max_tokens, 1));
  model::SequenceState state = cache.new_sequence();
  std::vector<int32_t> out;
  GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (max_tokens == 0) {
    if (stats) *stats = st;
    return out;
  }
  auto t0 = clock::now();
  model::SequenceInput in{prompt, &state, model::StepKind::prefill};
  core::Tensor logits = explained_forward(cache, in, "prefill step, " + std::to_string(prompt.size()) + " tokens");
  st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  t0 = clock::now();
  for (;;) {
    const int32_t next = sampler.sample(logits.span<const float>(), prompt, out).token;
    out.push_back(next);
    if (on_token) on_token(next);
    if (static_cast<int64_t>(out.size()) >= max_tokens || next == config().eos_token_id) break;
    in = {std::span<const int32_t>(&out.back(), 1), &state, model::StepKind::decode};
    logits = out.size() == 1 ? explained_forward(cache, in, "first decode step, 1 row")
                             : model_->forward(cache.storage(), {&in, 1}, model::LogitRows::last);
  }
  st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
  st.generated_tokens = static_cast<int64_t>(out.size());
  if (stats) *stats = st;
  return out;
}

void ModelRunner::set_explain(std::function<void(const std::string&)> sink) {
  explain_ = std::move(sink);
  registry_.set_recorder(explain_ ? &recorder_ : nullptr);
}

core::Tensor ModelRunner::explained_forward(model::LocalCache& cache, const model::SequenceInput& in,
                                            const std::string& what) const {
  if (!explain_) return model_->forward(cache.storage(), {&in, 1}, model::LogitRows::last);
  recorder_.start();
  core::Tensor logits = model_->forward(cache.storage(), {&in, 1}, model::LogitRows::last);
  const std::vector<kernels::OpRecorder::Call> calls = recorder_.stop();
  explain_(what + ": " + fastpath::explain_step(model_->last_path_decision(), calls, config().num_hidden_layers));
  return logits;
}

}  // namespace k3::runner
