// runner/tp_runner.cpp: TpRunner: rank models on CPU threads in lock step.
#include "runner/tp_runner.h"

#include <chrono>
#include <cstring>

#include "model/local_cache.h"

namespace k3::runner {

struct TpRunner::Rank {
  model::Weights weights;     // this rank's slices
  kernels::Registry registry;  // per rank, as on GPUs (each its own device context)
  std::unique_ptr<model::Model> model;
};

std::unique_ptr<TpRunner> TpRunner::open(const std::filesystem::path& dir, int tp, const model::ModelOptions& options,
                                         model::KvCacheDtype kv_cache, const checkpoint::LoadProgressFn& progress) {
  return std::make_unique<TpRunner>(dir, tp, options, kv_cache, progress);
}

TpRunner::TpRunner(const std::filesystem::path& dir, int tp, const model::ModelOptions& options,
                   model::KvCacheDtype kv_cache, const checkpoint::LoadProgressFn& progress)
    : full_(config::load_config(dir / "config.json")), options_(options), kv_cache_(kv_cache) {
  K3_CHECK(options.device == core::Device::cpu,
           "tensor parallelism: TpRunner runs the ranks as CPU threads; --tp on " +
               std::string(core::device_name(options.device)) + " needs the NCCL runner");
  rank_config_ = config::shard_config(full_, tp);  // throws naming the field tp does not divide
  for (int r = 0; r < tp; ++r) {
    auto rank = std::make_unique<Rank>();
    rank->weights = checkpoint::load_weights(dir, full_, config::TpShard{r, tp}, r == 0 ? progress : nullptr);
    kernels::register_reference_ops(rank->registry);
    ranks_.push_back(std::move(rank));
  }
  build_models();
}

TpRunner::~TpRunner() = default;

void TpRunner::build_models() const {
  // The models hold the group's communicators: both are replaced together.
  for (const auto& r : ranks_) r->model.reset();
  group_ = std::make_unique<comm::ThreadGroup>(tp());
  for (int r = 0; r < tp(); ++r) {
    Rank& rank = *ranks_[static_cast<size_t>(r)];
    rank.model = std::make_unique<model::Model>(rank_config_, rank.weights, rank.registry, options_, core::host_memory(),
                                                &group_->rank(r));
  }
}

const model::Model& TpRunner::model(int rank) const {
  K3_CHECK(rank >= 0 && rank < tp(), "TpRunner: rank " + std::to_string(rank) + " of " + std::to_string(tp()));
  return *ranks_[static_cast<size_t>(rank)]->model;
}

void TpRunner::run(const RankFn& fn) const {
  if (group_->aborted()) build_models();  // a failed call left the old group unusable
  comm::run_ranks(*group_, [&](comm::Communicator& c) {
    fn(c.rank(), *ranks_[static_cast<size_t>(c.rank())]->model, c);
  });
}

model::LocalCache TpRunner::new_cache(int64_t max_tokens) const {
  return model::LocalCache(rank_config_, 1, max_tokens, kv_cache_, 16, core::host_memory(), options_.precision);
}

void TpRunner::check_ids(std::span<const int32_t> tokens) const {
  K3_CHECK(!tokens.empty(), "no token ids given");
  for (int32_t id : tokens)  // against the full vocabulary, not a rank's slice of it
    K3_CHECK(id >= 0 && id < full_.vocab_size, "token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                                                   std::to_string(full_.vocab_size) + ")");
}

core::Tensor TpRunner::logits(std::span<const int32_t> tokens, int64_t decode_from) const {
  check_ids(tokens);
  const auto T = static_cast<int64_t>(tokens.size());
  K3_CHECK(decode_from >= 0 && decode_from <= T,
           "--decode-from must be in [0, " + std::to_string(T) + "], got " + std::to_string(decode_from));
  const int64_t V = full_.vocab_size;
  core::Tensor out = core::Tensor::zeros(core::DType::f32, {T, V});
  run([&](int rank, const model::Model& m, comm::Communicator&) {
    model::LocalCache cache = new_cache(T);
    model::SequenceState state = cache.new_sequence();
    auto step = [&](int64_t begin, int64_t count, model::StepKind kind) {
      const model::SequenceInput in{tokens.subspan(static_cast<size_t>(begin), static_cast<size_t>(count)), &state, kind};
      const core::Tensor rows = m.forward(cache.storage(), {&in, 1}, model::LogitRows::all);
      if (rank == 0)  // every rank holds the same gathered logits
        std::memcpy(out.data<float>() + begin * V, rows.data<const float>(), static_cast<size_t>(rows.numel()) * sizeof(float));
    };
    if (decode_from > 0) step(0, decode_from, model::StepKind::prefill);
    for (int64_t t = decode_from; t < T; ++t) step(t, 1, model::StepKind::decode);
  });
  return out;
}

std::vector<int32_t> TpRunner::generate(std::span<const int32_t> prompt, int64_t max_tokens,
                                        const SamplingParams& sampling, const std::function<void(int32_t)>& on_token,
                                        ModelRunner::GenerateStats* stats) const {
  check_ids(prompt);
  K3_CHECK(max_tokens >= 0, "max_tokens must be >= 0, got " + std::to_string(max_tokens));
  Sampler sampler(sampling, static_cast<int32_t>(full_.vocab_size));  // rank 0's
  using clock = std::chrono::steady_clock;
  std::vector<int32_t> out;  // rank 0's
  ModelRunner::GenerateStats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  if (max_tokens > 0) {
    run([&](int rank, const model::Model& m, comm::Communicator& c) {
      model::LocalCache cache = new_cache(static_cast<int64_t>(prompt.size()) + max_tokens);
      model::SequenceState state = cache.new_sequence();
      auto t0 = clock::now();
      model::SequenceInput in{prompt, &state, model::StepKind::prefill};
      core::Tensor logits = m.forward(cache.storage(), {&in, 1}, model::LogitRows::last);
      if (rank == 0) st.prefill_seconds = std::chrono::duration<double>(clock::now() - t0).count();
      t0 = clock::now();
      int32_t next = 0;  // every rank's copy of the newest token
      for (int64_t n = 1;; ++n) {
        if (rank == 0) {
          next = sampler.sample(logits.span<const float>(), prompt, out).token;
          out.push_back(next);
          if (on_token) on_token(next);
        }
        c.broadcast(core::TensorView::contiguous(&next, core::DType::i32, {1}), 0);
        if (n >= max_tokens || next == full_.eos_token_id) break;
        in = {std::span<const int32_t>(&next, 1), &state, model::StepKind::decode};
        logits = m.forward(cache.storage(), {&in, 1}, model::LogitRows::last);
      }
      if (rank == 0) st.decode_seconds = std::chrono::duration<double>(clock::now() - t0).count();
    });
  }
  st.generated_tokens = static_cast<int64_t>(out.size());
  if (stats) *stats = st;
  return out;
}

}  // namespace k3::runner
