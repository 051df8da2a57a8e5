// tests/fastpath_test.cpp: the latency_specialized decode path (fastpath/) on the CPU, where it
// runs the fused ops' reference implementations: it computes the standard path's function (logits
// in fp32 and bf16, 500 greedy tokens, speculative verify and commit, several sequences), it
// really ran (the op recorder sees every fused op and no standard op it replaces), and every
// step it does not cover is routed to the standard path with its reason counted. Steps driven on a
// Model directly take the route the engine gives them (engine::route_batch).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "config/config_test_util.h"
#include "core/rng.h"
#include "engine/model_executor.h"
#include "engine/one_shot.h"
#include "fastpath/fused_decode.h"
#include "model/decode_graphs.h"
#include "model/local_cache.h"
#include "model/model.h"
#include "runner/model_runner.h"
#include "runner/tp_runner.h"
#include "scheduler/step_route.h"
#include "test_util.h"

namespace k3 {
namespace {

using model::LogitRows;
using model::SequenceInput;
using model::StepKind;
using testing::compare;

using testing::random_tokens;

model::ModelOptions options(kernels::Precision p, model::DecodeBackend b) {
  model::ModelOptions o;
  o.precision = p;
  o.decode_backend = b;
  o.poison_buffers = true;
  return o;
}

// The same checkpoint opened on both paths.
struct Pair {
  Pair(kernels::Precision p, checkpoint::InitStyle init = checkpoint::InitStyle::sensitive,
       const config::K3Config& cfg = config::builtin_config("k3-tiny")) {
    checkpoint::WriteOptions w;
    w.init = init;
    const auto dir = testing::write_checkpoint(tmp, cfg, w);
    standard = runner::ModelRunner::open(dir, options(p, model::DecodeBackend::standard));
    fused = runner::ModelRunner::open(dir, options(p, model::DecodeBackend::latency_specialized));
  }
  testing::TempDir tmp;
  std::unique_ptr<runner::ModelRunner> standard, fused;
};

// One step as the engine runs it: on the route the scheduler gives it, counted into `paths`.
core::Tensor routed(const model::Model& m, model::KvStorage& kv, std::span<const SequenceInput> batch, LogitRows rows,
                    core::DecodePathCounters& paths, model::VerifyCapture* capture = nullptr,
                    model::HiddenTaps* taps = nullptr) {
  const core::StepRoute route = engine::route_batch(m, nullptr, batch);
  paths.count(route);
  return m.forward(kv, batch, rows, nullptr, capture, taps, model::LogitsAt::host, route.path);
}
// The same through `g`, which must take the step (its route has a graph bucket).
core::Tensor routed(const model::Model& m, model::DecodeGraphs& g, std::span<const SequenceInput> batch,
                    core::DecodePathCounters& paths, model::VerifyCapture* capture = nullptr) {
  const core::StepRoute route = engine::route_batch(m, &g, batch);
  EXPECT_TRUE(route.graph.captured()) << "the step has no graph bucket";
  paths.count(route);
  return g.forward(batch, route, model::LogitsAt::host, capture);
}

// Runs the same steps on a model: three sequences prefilled (different lengths), then `steps`
// pure-decode steps of all three (teacher-forced tokens). Returns every decode step's logits.
std::vector<core::Tensor> decode_steps(const model::Model& m, int steps, int vocab, core::DecodePathCounters& paths,
                                       model::KvCacheDtype kv = model::KvCacheDtype::bf16) {
  model::LocalCache cache(m.config(), 3, 96, kv, /*block_size=*/7);
  std::vector<model::SequenceState> st;
  for (int s = 0; s < 3; ++s) st.push_back(cache.new_sequence());
  const auto p0 = random_tokens(30, vocab, 1), p1 = random_tokens(5, vocab, 2), p2 = random_tokens(17, vocab, 3);
  SequenceInput pre[] = {
      {p0, &st[0], StepKind::prefill}, {p1, &st[1], StepKind::prefill}, {p2, &st[2], StepKind::prefill}};
  routed(m, cache.storage(), pre, LogitRows::last, paths);
  const auto feed = random_tokens(3 * steps, vocab, 4);
  std::vector<core::Tensor> out;
  for (int i = 0; i < steps; ++i) {
    SequenceInput dec[3];
    for (int s = 0; s < 3; ++s)
      dec[s] = {std::span(feed).subspan(static_cast<size_t>(3 * i + s), 1), &st[static_cast<size_t>(s)],
                StepKind::decode};
    out.push_back(routed(m, cache.storage(), dec, LogitRows::last, paths));
  }
  return out;
}

// DecodeGraphs on a device that cannot capture (the CPU) runs every step of its buckets eagerly, on
// the path the route gives (the capture it tried records nothing).
TEST(FastPath, DecodeGraphsOnTheCpuRunEveryStepEagerly) {
  Pair p(kernels::Precision::fp32);
  const model::Model& m = p.fused->model();
  model::LocalCache cache(m.config(), 2, 64, model::KvCacheDtype::bf16, /*block_size=*/8);
  std::vector<model::SequenceState> st{cache.new_sequence(), cache.new_sequence()};
  const auto prompt = random_tokens(9, m.config().vocab_size, 5);
  core::DecodePathCounters c;
  for (auto& s : st) {
    SequenceInput pre[] = {{prompt, &s, StepKind::prefill}};
    routed(m, cache.storage(), pre, LogitRows::last, c);
  }
  model::DecodeGraphs graphs(m, cache.storage(), /*max_blocks_per_seq=*/8);
  const int32_t tok[] = {3, 7};
  for (int i = 0; i < 4; ++i) {
    SequenceInput dec[] = {{std::span(tok).first(1), &st[0], StepKind::decode},
                           {std::span(tok).last(1), &st[1], StepKind::decode}};
    const core::StepRoute route = engine::route_batch(m, &graphs, dec);
    EXPECT_EQ(route.graph, (core::GraphBucket{2, 1}));
    EXPECT_EQ(route.kernels, nullptr);  // no graph, so its kernels are chosen per call
    routed(m, graphs, dec, c);
  }
  EXPECT_EQ(graphs.captures(), 0);
  EXPECT_EQ(c.fused_steps, 4);
  EXPECT_EQ(c.standard_steps, 2);  // the two prefills
  EXPECT_EQ(st[0].num_tokens, 9 + 4);
}

TEST(FastPath, DecodeLogitsEqualTheStandardPathFp32) {
  Pair p(kernels::Precision::fp32);
  const int V = p.standard->config().vocab_size;
  core::DecodePathCounters s, c;
  const auto want = decode_steps(p.standard->model(), 12, V, s);
  const auto got = decode_steps(p.fused->model(), 12, V, c);
  for (size_t i = 0; i < want.size(); ++i) {
    const auto d = compare(got[i], want[i]);
    EXPECT_LE(d.rel(), 1e-5) << "step " << i;  // a merged softmax in the AttnRes stream: fp32 rounding only
    EXPECT_EQ(d.top1_agreement, 1.0) << "step " << i;
  }
  EXPECT_EQ(c.fused_steps, 12);
  EXPECT_EQ(c.standard_steps, 1);  // the prefill
  ASSERT_EQ(c.fallbacks.size(), 1u);
  EXPECT_EQ(c.fallbacks[0].first, scheduler::kNotPureDecode);
  EXPECT_EQ(c.fallbacks[0].second, 1);
  EXPECT_EQ(s.fused_steps, 0);
  EXPECT_EQ(s.standard_steps, 13);
  EXPECT_TRUE(s.fallbacks.empty());  // auto chose the standard path: not a fallback
}

// An fp8 e4m3 latent cache (the fused front writes it, the fused decode attention reads it): both
// paths store and read the same fp8 codes, so in fp32 they still agree to rounding, and the fused
// path served every decode step.
TEST(FastPath, DecodeLogitsEqualTheStandardPathWithAnFp8CacheFp32) {
  Pair p(kernels::Precision::fp32);
  const int V = p.standard->config().vocab_size;
  core::DecodePathCounters s, c;
  const auto want = decode_steps(p.standard->model(), 12, V, s, model::KvCacheDtype::fp8_e4m3);
  const auto got = decode_steps(p.fused->model(), 12, V, c, model::KvCacheDtype::fp8_e4m3);
  const auto bf16_cache = decode_steps(p.standard->model(), 12, V, s);
  bool cache_dtype_matters = false;
  for (size_t i = 0; i < want.size(); ++i) {
    const auto d = compare(got[i], want[i]);
    EXPECT_LE(d.rel(), 1e-5) << "step " << i;
    EXPECT_EQ(d.top1_agreement, 1.0) << "step " << i;
    cache_dtype_matters = cache_dtype_matters || compare(want[i], bf16_cache[i]).rel() > 1e-4;
  }
  EXPECT_TRUE(cache_dtype_matters) << "the fp8 cache gave the bf16 cache's logits: was it used?";
  EXPECT_EQ(c.fused_steps, 12);
  EXPECT_EQ(c.standard_steps, 1);  // the prefill
}

TEST(FastPath, DecodeLogitsTrackTheStandardPathBf16) {
  for (auto init : {checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive}) {
    Pair p(kernels::Precision::bf16, init);
    const int V = p.standard->config().vocab_size;
    core::DecodePathCounters s, c;
    const auto want = decode_steps(p.standard->model(), 12, V, s);
    const auto got = decode_steps(p.fused->model(), 12, V, c);
    EXPECT_EQ(c.fused_steps, 12);
    int64_t agree = 0, rows = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      const auto d = compare(got[i], want[i]);
      EXPECT_GE(d.cosine, 0.999) << "step " << i;
      agree += static_cast<int64_t>(d.top1_agreement * static_cast<double>(got[i].dim(0)) + 0.5);
      rows += got[i].dim(0);
    }
    EXPECT_GE(static_cast<double>(agree) / static_cast<double>(rows), 0.97);  // 36 rows: at most one flip
  }
}

TEST(FastPath, GreedyFiveHundredTokensIdenticalFp32) {
  Pair p(kernels::Precision::fp32, checkpoint::InitStyle::realistic);
  const auto prompt = random_tokens(24, p.standard->config().vocab_size, 9);
  runner::SamplingParams greedy;
  engine::GenerateStats stats;
  const auto want = engine::generate(*p.standard, prompt, 500, greedy);
  const auto got = engine::generate(*p.fused, prompt, 500, greedy, nullptr, &stats);
  ASSERT_EQ(want.size(), 500u);
  EXPECT_EQ(got, want);
  EXPECT_EQ(stats.decode_paths.fused_steps, 499);
  EXPECT_EQ(stats.decode_paths.standard_steps, 1);  // the prefill
}

// The recorder sees the fused ops and none of the standard ops they replace.
TEST(FastPath, TheFusedKernelsRanAndExplainSaysSo) {
  Pair p(kernels::Precision::bf16);
  std::string plans;
  const auto prompt = random_tokens(9, p.fused->config().vocab_size, 5);
  engine::generate(*p.fused, prompt, 3, {}, nullptr, nullptr, [&](const std::string& s) { plans += s; });
  EXPECT_NE(plans.find("prefill step, 9 tokens: decode path standard, fallback: prefill_or_mixed_step"),
            std::string::npos)
      << plans;
  const auto decode_at = plans.find("first decode step, 1 row: decode path latency_specialized (fused)");
  ASSERT_NE(decode_at, std::string::npos) << plans;
  const std::string decode_plan = plans.substr(decode_at);
  for (const char* op : {"multi_linear -> cpu/reference", "kda_decode -> cpu/reference", "mla_decode -> cpu/reference",
                         "attn_res_bank -> cpu/reference", "attn_res_merge -> cpu/reference",
                         "moe_tail_combine -> cpu/reference", "mla_prep -> cpu/reference"})
    EXPECT_NE(decode_plan.find(op), std::string::npos) << op << "\n" << decode_plan;
  for (const char* op : {"kda_recurrent", "kda_conv", "kda_output_gate", "mla_absorbed", "attn_res_mix", "sigmoid_gate",
                         "rmsnorm", "mla_cache_write", "not used"})
    EXPECT_EQ(decode_plan.find(op), std::string::npos) << op << " ran in a fused step\n" << decode_plan;

  // A step run with a recorder of the test's own: the fused ops ran once per layer of their kind.
  kernels::OpRecorder rec;
  p.fused->set_op_recorder(&rec);
  const config::K3Config& c = p.fused->config();
  model::LocalCache cache(c, 1, 32);
  model::SequenceState st = cache.new_sequence();
  SequenceInput in{prompt, &st, StepKind::prefill};
  core::DecodePathCounters paths;
  routed(p.fused->model(), cache.storage(), {&in, 1}, LogitRows::last, paths);
  rec.start();
  in = {std::span(prompt).first(1), &st, StepKind::decode};
  routed(p.fused->model(), cache.storage(), {&in, 1}, LogitRows::last, paths);
  EXPECT_EQ(paths.fused_steps, 1);
  std::map<std::string, int> count;
  for (const auto& call : rec.stop()) ++count[call.op];
  int kda = 0, mla = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) (c.attn_kind(l) == config::AttnKind::kda ? kda : mla)++;
  EXPECT_EQ(count["kda_decode"], kda);
  EXPECT_EQ(count["mla_decode"], mla);
  EXPECT_EQ(count["mla_prep"], mla);  // replaces the q_a / kv_a rmsnorms and mla_cache_write per MLA layer
  int moe = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) moe += c.ffn_kind(l) == config::FfnKind::moe ? 1 : 0;
  const int dense = c.num_hidden_layers - moe;
  EXPECT_EQ(count["moe_tail_combine"], moe);  // replaces situ_glu, 2 linears, rmsnorm and add per MoE layer
  // The multi_linear projections: KDA [q,k,v,g,f_a,b]; MLA [q_a,kv_a,g] and q_b; the MoE front.
  EXPECT_EQ(count["multi_linear"], kda + 2 * mla + moe);
  // What still calls the standard linear: each attention o_proj (cuBLASLt measured faster than the
  // multi_linear kernel on [7168, 1536] at batch 1-8: docs/perf/fastpath.md), the dense FFN (layer 0 of
  // k3-tiny: model::ffn's gate, up and down, not a fused sublayer) and the lm_head. No rmsnorm is left
  // (the AttnRes merges, mla_prep and moe_tail_combine norm inside), and no separate cache write.
  EXPECT_EQ(count["linear"], kda + mla + 3 * dense + 1);
  EXPECT_EQ(count["rmsnorm"], 0);
  EXPECT_EQ(count["mla_cache_write"], 0);
  EXPECT_EQ(count["add"], 0);
  EXPECT_EQ(count["router_topk"], 0);  // the MoE front's multi_linear selects the routes in its epilogue
  EXPECT_EQ(count["attn_res_merge"], 2 * c.num_hidden_layers + 1);
  EXPECT_EQ(count["attn_res_bank"], (c.num_hidden_layers + c.attn_res_block_size - 1) / c.attn_res_block_size);
  p.fused->set_op_recorder(nullptr);
}

// Speculative verify through the fused path: the verify rows' logits, then the commit of an
// accepted prefix, then a plain decode step, all equal the standard path (fp32).
TEST(FastPath, VerifyRowsAndCommitEqualTheStandardPathFp32) {
  Pair p(kernels::Precision::fp32);
  const int V = p.standard->config().vocab_size;
  const auto prompt = random_tokens(20, V, 6), drafts = random_tokens(5, V, 7), next = random_tokens(2, V, 8);
  core::DecodePathCounters paths;
  auto run = [&](const model::Model& m) {
    paths = {};
    model::LocalCache cache(m.config(), 2, 64, model::KvCacheDtype::bf16, 5);
    model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
    SequenceInput pre[] = {{prompt, &a, StepKind::prefill}, {std::span(prompt).first(11), &b, StepKind::prefill}};
    routed(m, cache.storage(), pre, LogitRows::last, paths);
    model::VerifyCapture capture;
    SequenceInput verify[] = {{drafts, &a, StepKind::decode, true}, {std::span(next).first(1), &b, StepKind::decode}};
    std::vector<core::Tensor> out{routed(m, cache.storage(), verify, LogitRows::requested, paths, &capture)};
    const int32_t accepted[] = {3};
    m.commit_verified(cache.storage(), capture, accepted);
    SequenceInput after[] = {{std::span(next).first(1), &a, StepKind::decode},
                             {std::span(next).last(1), &b, StepKind::decode}};
    out.push_back(routed(m, cache.storage(), after, LogitRows::last, paths));
    return out;
  };
  const auto want = run(p.standard->model()), got = run(p.fused->model());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].dim(0), want[i].dim(0));
    EXPECT_LE(compare(got[i], want[i]).rel(), 1e-5) << "step " << i;
  }
  EXPECT_EQ(paths.fused_steps, 2);  // the verify step and the decode step
}

// Verify steps of equal draft counts go through DecodeGraphs (captured on a GPU; on the CPU the
// same run_step eagerly): two rounds of verify + commit (different accepted lengths), then plain
// decode, give the logits of Model::forward + commit_verified, on both decode backends (fp32).
TEST(FastPath, VerifyStepsThroughDecodeGraphsEqualForwardFp32) {
  Pair p(kernels::Precision::fp32);
  const int V = p.standard->config().vocab_size;
  const auto prompt = random_tokens(20, V, 16), drafts = random_tokens(16, V, 17), next = random_tokens(2, V, 18);
  core::DecodePathCounters paths;
  auto run = [&](const model::Model& m, bool graphs) {
    model::LocalCache cache(m.config(), 2, 96, model::KvCacheDtype::bf16, 5);
    model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
    SequenceInput pre[] = {{prompt, &a, StepKind::prefill}, {std::span(prompt).first(11), &b, StepKind::prefill}};
    routed(m, cache.storage(), pre, LogitRows::last, paths);
    model::DecodeGraphs g(m, cache.storage(), /*max_blocks_per_seq=*/20);
    std::vector<core::Tensor> out;
    const int32_t accepted[2][2] = {{3, 4}, {1, 4}};
    for (int round = 0; round < 2; ++round) {
      model::VerifyCapture capture;
      const auto d = std::span(drafts).subspan(static_cast<size_t>(8 * round), 8);
      SequenceInput verify[] = {{d.first(4), &a, StepKind::decode, true}, {d.last(4), &b, StepKind::decode, true}};
      if (graphs) out.push_back(routed(m, g, verify, paths, &capture));
      else out.push_back(routed(m, cache.storage(), verify, LogitRows::requested, paths, &capture));
      EXPECT_EQ(a.num_tokens, (round == 0 ? 20 : 23) + 4);  // every row advanced until the commit
      // DecodeGraphs' commit (a graph on a GPU; on the CPU, which cannot capture, Model's).
      if (graphs) g.commit_verified(capture, accepted[round]);
      else m.commit_verified(cache.storage(), capture, accepted[round]);
    }
    EXPECT_EQ(a.num_tokens, 20 + 3 + 1);
    EXPECT_EQ(b.num_tokens, 11 + 4 + 4);
    SequenceInput after[] = {{std::span(next).first(1), &a, StepKind::decode},
                             {std::span(next).last(1), &b, StepKind::decode}};
    out.push_back(routed(m, cache.storage(), after, LogitRows::last, paths));
    return out;
  };
  for (const auto* r : {p.standard.get(), p.fused.get()}) {
    const auto want = run(r->model(), false), got = run(r->model(), true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].dim(0), want[i].dim(0));
      EXPECT_EQ(compare(got[i], want[i]).max_abs, 0.0) << "step " << i;  // the same run_step: bit for bit
    }
  }
  EXPECT_EQ(paths.fused_steps, 2 * (2 + 1));  // the fused model's verify and decode steps, with and without graphs
  // Unequal draft counts, or a verify sequence beside a plain one, are not graph steps: they route
  // to no bucket, and DecodeGraphs refuses them.
  model::LocalCache cache(p.standard->config(), 2, 32);
  model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
  a.num_tokens = b.num_tokens = 4;
  model::DecodeGraphs g(p.standard->model(), cache.storage(), 4);
  SequenceInput unequal[] = {{std::span(drafts).first(3), &a, StepKind::decode, true},
                             {std::span(drafts).first(2), &b, StepKind::decode, true}};
  SequenceInput mixed[] = {{std::span(drafts).first(3), &a, StepKind::decode, true},
                           {std::span(drafts).first(1), &b, StepKind::decode}};
  EXPECT_FALSE(engine::route_batch(p.standard->model(), &g, unequal).graph.captured());
  EXPECT_FALSE(engine::route_batch(p.standard->model(), &g, mixed).graph.captured());
  EXPECT_FALSE(g.fits(unequal, {2, 3}));
  EXPECT_FALSE(g.fits(mixed, {2, 3}));
  core::StepRoute bucket_2x3;
  bucket_2x3.graph = {2, 3};
  EXPECT_THROW(g.forward(mixed, bucket_2x3), core::Error);
}

// Steps outside the scope are routed to the standard path with their reason; a step routed to the
// fused path outside its scope is refused, not run.
TEST(FastPath, OutOfScopeStepsFallBackWithTheirReason) {
  Pair p(kernels::Precision::bf16);
  const model::Model& m = p.fused->model();
  const int V = m.config().vocab_size;
  const int B = static_cast<int>(fastpath::kMaxRows) + 1;
  model::LocalCache cache(m.config(), B, 8);
  std::vector<model::SequenceState> st;
  for (int s = 0; s < B; ++s) st.push_back(cache.new_sequence());
  const auto tok = random_tokens(2 * B, V, 10);
  std::vector<SequenceInput> in;
  for (int s = 0; s < B; ++s)
    in.push_back(
        {std::span(tok).subspan(static_cast<size_t>(2 * s), 1), &st[static_cast<size_t>(s)], StepKind::prefill});
  core::DecodePathCounters c;
  EXPECT_THROW(m.forward(cache.storage(), in, LogitRows::last, nullptr, nullptr, nullptr, model::LogitsAt::host,
                         core::DecodePath::fused),
               core::Error);                           // a prefill routed to the fused path
  routed(m, cache.storage(), in, LogitRows::last, c);  // prefill: falls back
  for (int s = 0; s < B; ++s)
    in[static_cast<size_t>(s)] = {std::span(tok).subspan(static_cast<size_t>(2 * s + 1), 1),
                                  &st[static_cast<size_t>(s)], StepKind::decode};
  EXPECT_THROW(m.forward(cache.storage(), in, LogitRows::last, nullptr, nullptr, nullptr, model::LogitsAt::host,
                         core::DecodePath::fused),
               core::Error);                                                // 65 rows routed to the fused path
  routed(m, cache.storage(), in, LogitRows::last, c);                       // 65 decode rows: falls back
  routed(m, cache.storage(), std::span(in).first(64), LogitRows::last, c);  // 64 rows: fused
  EXPECT_EQ(c.fused_steps, 1);
  EXPECT_EQ(c.standard_steps, 2);
  std::map<std::string, int64_t> by_reason(c.fallbacks.begin(), c.fallbacks.end());
  EXPECT_EQ(by_reason[scheduler::kNotPureDecode], 1);
  EXPECT_EQ(by_reason["more_than_64_rows"], 1);
}

// Tensor parallelism: every rank runs the fused path on its shard (heads, experts, vocab split;
// the same collectives): TP fused decode logits equal TP standard ones (fp32). TP2 on k3-tiny, and
// TP8 on its 8-head variant, where each rank holds ONE KDA and ONE MLA head and 32 rows of each
// expert (the narrowest shards a config can have).
TEST(FastPath, TensorParallelRanksRunTheFusedPathFp32) {
  const auto check = [](const Pair& p, int tp) {
    const auto tokens = random_tokens(40, p.standard->config().vocab_size, 13);
    const auto dir = p.tmp.path() / "model";
    auto standard = runner::TpRunner::open(dir, tp, options(kernels::Precision::fp32, model::DecodeBackend::standard));
    auto fused = runner::TpRunner::open(dir, tp,
                                        options(kernels::Precision::fp32, model::DecodeBackend::latency_specialized));
    core::DecodePathCounters paths;
    const core::Tensor want = engine::logits(*standard, tokens, 24);  // rows 24..39: one decode step each
    const core::Tensor got = engine::logits(*fused, tokens, 24, &paths);
    EXPECT_LE(compare(got, want).rel(), 1e-5) << "tp " << tp;
    EXPECT_EQ(compare(got, want).top1_agreement, 1.0) << "tp " << tp;
    EXPECT_EQ(paths.fused_steps, 16) << "tp " << tp;  // every rank runs the plan's route
  };
  check(Pair(kernels::Precision::fp32), 2);
  check(Pair(kernels::Precision::fp32, checkpoint::InitStyle::sensitive, config::test::tiny_tp8_config()), 8);
}

// A drafter's hidden-state taps (the attention-side mixtures) are the same on both paths.
TEST(FastPath, HiddenTapsEqualTheStandardPathFp32) {
  Pair p(kernels::Precision::fp32);
  const int V = p.standard->config().vocab_size;
  const auto prompt = random_tokens(12, V, 14);
  core::DecodePathCounters paths;
  auto taps_of = [&](const model::Model& m) {
    model::LocalCache cache(m.config(), 1, 32);
    model::SequenceState st = cache.new_sequence();
    SequenceInput in{prompt, &st, StepKind::prefill};
    routed(m, cache.storage(), {&in, 1}, LogitRows::last, paths);
    model::HiddenTaps taps;
    taps.layers = {0, 2};
    in = {std::span(prompt).first(1), &st, StepKind::decode};
    routed(m, cache.storage(), {&in, 1}, LogitRows::last, paths, nullptr, &taps);
    std::vector<core::Tensor> host;
    for (const core::Tensor& t : taps.values) host.push_back(t);
    return host;
  };
  const auto want = taps_of(p.standard->model()), got = taps_of(p.fused->model());
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_TRUE(got[i].defined()) << "tap " << i << " not filled by the fused path";
    EXPECT_LE(compare(got[i], want[i]).rel(), 1e-5) << "tap " << i;
  }
  EXPECT_EQ(paths.fused_steps, 1);
}

// A config whose AttnRes schedule the fused ops do not take (block of 17: 34 Mix operators per
// bank) runs every step on the standard path, with the reason.
TEST(FastPath, AnAttnResScheduleBeyondTheFusedOpsFallsBack) {
  config::K3Config c = config::builtin_config("k3-tiny");
  c.attn_res_block_size = 17;
  config::validate(c, "block 17");
  Pair p(kernels::Precision::bf16, checkpoint::InitStyle::realistic, c);
  const auto prompt = random_tokens(6, c.vocab_size, 15);
  engine::GenerateStats stats;
  EXPECT_EQ(engine::generate(*p.fused, prompt, 4, {}, nullptr, &stats), engine::generate(*p.standard, prompt, 4, {}));
  const core::DecodePathCounters& k = stats.decode_paths;
  EXPECT_EQ(k.fused_steps, 0);
  ASSERT_EQ(k.fallbacks.size(), 1u);
  EXPECT_EQ(k.fallbacks[0].first, fastpath::kUnsupportedAttnRes);
  EXPECT_EQ(k.fallbacks[0].second, 4);
}

TEST(FastPath, ParsesAndNamesTheDecodeBackend) {
  EXPECT_EQ(model::parse_decode_backend("auto"), model::DecodeBackend::standard);
  EXPECT_EQ(model::parse_decode_backend("latency_specialized"), model::DecodeBackend::latency_specialized);
  EXPECT_EQ(model::decode_backend_name(model::DecodeBackend::latency_specialized), "latency_specialized");
  try {
    model::parse_decode_backend("fast");
    FAIL() << "no error";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'fast' is not one of: auto, latency_specialized"), std::string::npos);
  }
}

}  // namespace
}  // namespace k3
