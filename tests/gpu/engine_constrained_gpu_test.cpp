// tests/gpu/engine_constrained_gpu_test.cpp: constrained decoding on the GPU. The engine computes each
// constrained row's grammar mask on the host and the device sampler applies it with the token_mask
// op (the logits never come to the host); greedy and sampled tokens equal the CPU oracle engine's
// (exact mode), on the standard and the fused decode path, eager and with CUDA graphs, and every
// output is a sentence of the grammar.
#include <vector>

#include "core/rng.h"
#include "engine/engine.h"
#include "engine/model_executor.h"
#include "gpu_test_util.h"
#include "runner/device_sampler.h"
#include "structured/ebnf.h"

namespace k3 {
namespace {

constexpr int32_t kEnd = 1023;

// ids 0..255 bytes, 256..1022 pieces over the grammar's alphabet, 1023 the end token.
std::shared_ptr<const structured::CompiledGrammar> grammar() {
  std::vector<std::pair<int32_t, structured::Vocabulary::Token>> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back({b, {std::string(1, static_cast<char>(b)), -1}});
  core::Rng rng(5);
  const std::string alphabet = "{}\":, 0123456789tfrueals";
  for (int32_t id = 256; id < kEnd; ++id) {
    std::string t;
    for (int k = 0, n = 2 + static_cast<int>(rng.next_u64() % 3); k < n; ++k)
      t += alphabet[rng.next_u64() % alphabet.size()];
    tokens.push_back({id, {t, -1}});
  }
  tokens.push_back({kEnd, {"", 0}});
  auto v = std::make_shared<const structured::Vocabulary>(1024, tokens, std::vector<std::string>{"<|end|>"},
                                                          std::vector<int32_t>{kEnd});
  const char* ebnf = R"(root ::= "{\"n\": " [0-9]{1,3} ", \"ok\": " ("true" | "false") ( ", \"v\": " [0-9] )? "}")";
  return std::make_shared<const structured::CompiledGrammar>(
      structured::parse_ebnf(ebnf, [v](std::string_view n) { return v->special(n); }), v);
}

std::vector<std::vector<int32_t>> serve(const runner::ModelRunner& runner, bool graphs, int64_t* device_rows) {
  engine::EngineConfig c;
  c.cache.block_size = 16;
  c.cache.num_blocks = 128;
  c.cache.num_slots = 4;
  c.cache.num_checkpoints = 16;
  c.cache.checkpoint_interval_blocks = 4;
  c.scheduler.max_num_seqs = 4;
  c.scheduler.max_num_batched_tokens = 256;
  c.scheduler.max_model_len = 400;
  c.scheduler.chunk_align_tokens = 64;
  c.eos_token_id = kEnd;
  auto executor = std::make_unique<engine::ModelExecutor>(runner.model(), c.cache, model::KvCacheDtype::bf16,
                                                          graphs ? c.scheduler.max_model_len : 0);
  engine::ModelExecutor* exec = executor.get();
  engine::Engine e(c, std::move(executor));
  const auto g = grammar();
  std::vector<std::shared_ptr<engine::TokenStream>> streams;
  for (uint64_t s = 1; s <= 4; ++s) {
    engine::GenerateRequest r;
    core::Rng rng(s);
    for (int i = 0; i < 20 + static_cast<int>(s) * 7; ++i)
      r.prompt.push_back(static_cast<int32_t>(256 + rng.next_u64() % 700));
    r.max_tokens = 80;
    r.sampling.temperature = s % 2 ? 0.0f : 1.0f;
    r.sampling.seed = s;
    r.grammar = g;
    streams.push_back(e.submit(std::move(r)).stream);
  }
  e.run_until_idle();
  *device_rows = exec->device_sampler() ? exec->device_sampler()->device_rows() : 0;
  std::vector<std::vector<int32_t>> out;
  for (auto& st : streams) {
    out.emplace_back();
    while (auto ev = st->try_next())
      if (ev->token >= 0) out.back().push_back(ev->token);
    structured::Matcher m(g);
    for (int32_t t : out.back()) EXPECT_TRUE(m.accept(t)) << t;
    EXPECT_TRUE(m.terminated()) << "the output must end where the grammar does";
  }
  return out;
}

TEST(EngineGpu, ConstrainedRowsAreMaskedOnTheDeviceAndGiveTheOracleTokens) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  for (model::DecodeBackend backend : {model::DecodeBackend::standard, model::DecodeBackend::latency_specialized}) {
    gpu_test::RunnerPair r(dir, kernels::Precision::fp32, model::KvCacheDtype::bf16, backend);
    int64_t cpu_rows = 0, eager_rows = 0, graph_rows = 0;
    const auto want = serve(*r.cpu, false, &cpu_rows);
    const auto eager = serve(*r.gpu, false, &eager_rows);
    const auto graphs = serve(*r.gpu, true, &graph_rows);
    EXPECT_EQ(eager, want) << model::decode_backend_name(backend);
    EXPECT_EQ(graphs, want) << model::decode_backend_name(backend);
    EXPECT_GT(eager_rows, 20) << "constrained rows should be sampled (and masked) on the device";
    EXPECT_GT(graph_rows, 20);
  }
}

}  // namespace
}  // namespace k3
