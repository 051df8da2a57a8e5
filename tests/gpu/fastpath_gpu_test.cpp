// tests/gpu/fastpath_gpu_test.cpp: the latency_specialized decode path on the GPU: its CUDA
// fused kernels ran (not a fallback, not the CPU references), greedy fp32 generations equal the
// standard GPU path and the CPU oracle, and bf16 decode logits track the standard GPU path.
#include <gtest/gtest.h>

#include <iostream>
#include <string>
#include <vector>

#include "core/rng.h"
#include "engine/model_executor.h"
#include "engine/one_shot.h"
#include "gpu_test_util.h"
#include "model/decode_graphs.h"
#include "model/local_cache.h"

namespace k3 {
namespace {

using testing::random_tokens;

std::unique_ptr<runner::ModelRunner> open(const std::filesystem::path& dir, core::Device device, kernels::Precision p,
                                          model::DecodeBackend backend, model::KvCacheDtype kv) {
  model::ModelOptions o = gpu_test::options(device, p);
  o.decode_backend = backend;
  return runner::ModelRunner::open(dir, o, kv);
}

struct Case {
  bool mxfp4;
  model::KvCacheDtype kv;
};

TEST(FastPathGpu, FusedKernelsRunAndGreedyFp32EqualsTheStandardPath) {
  K3_REQUIRE_GPU();
  for (const Case c : {Case{false, model::KvCacheDtype::bf16}, Case{true, model::KvCacheDtype::fp8_e4m3}}) {
    SCOPED_TRACE(c.mxfp4 ? "mxfp4 experts, fp8 cache" : "bf16, bf16 cache");
    testing::TempDir tmp;
    checkpoint::WriteOptions w;
    w.init = checkpoint::InitStyle::realistic;
    w.mxfp4 = c.mxfp4;
    const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
    auto standard = open(dir, core::Device::cuda, kernels::Precision::fp32, model::DecodeBackend::standard, c.kv);
    auto fused = open(dir, core::Device::cuda, kernels::Precision::fp32, model::DecodeBackend::latency_specialized,
                      c.kv);
    auto oracle = open(dir, core::Device::cpu, kernels::Precision::fp32, model::DecodeBackend::standard, c.kv);
    std::string plans;
    const auto prompt = random_tokens(40, fused->config().vocab_size, 11);
    engine::GenerateStats stats;
    const auto want = engine::generate(*standard, prompt, 120, {});
    const auto got = engine::generate(*fused, prompt, 120, {}, nullptr, &stats,
                                      [&](const std::string& s) { plans += s; });
    const auto cpu = engine::generate(*oracle, prompt, 120, {});
    EXPECT_EQ(got, want);
    EXPECT_EQ(got, cpu);
    const auto at = plans.find("first decode step, 1 row: decode path latency_specialized (fused)");
    ASSERT_NE(at, std::string::npos) << plans;
    const std::string plan = plans.substr(at);
    for (const char* op : {"kda_decode -> cuda/", "mla_decode -> cuda/", "multi_linear -> cuda/",
                           "attn_res_bank -> cuda/", "attn_res_merge -> cuda/", "moe_tail_combine -> cuda/"})
      EXPECT_NE(plan.find(op), std::string::npos) << op << "\n" << plan;
    EXPECT_EQ(plan.find("not used"), std::string::npos) << plan;  // no fused op fell back to standard ops
    EXPECT_EQ(plan.find("/reference"), std::string::npos) << plan;
    std::cerr << plan;
    EXPECT_EQ(stats.decode_paths.fused_steps, 119);
  }
}

// Speculative verify steps and their KDA commits replayed from CUDA graphs (model::DecodeGraphs)
// compute what the eager calls compute (fp32; the graphs' tables have a fixed width, so an attention
// kernel may split the context differently: relative L2 below 1e-5), on both decode paths: two sequences
// verify 4 rows each for five rounds with accepted counts that repeat, so the commit graphs of
// {1, 4} and {3, 4} are captured and then replayed (the first round's commit is eager: that verify
// step ran eagerly to capture its graph), then one plain decode step reads the committed states.
TEST(FastPathGpu, VerifyAndCommitGraphsEqualEagerStepsFp32) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = gpu_test::write_sensitive_tiny(tmp);
  for (const model::DecodeBackend backend :
       {model::DecodeBackend::standard, model::DecodeBackend::latency_specialized}) {
    auto r = open(dir, core::Device::cuda, kernels::Precision::fp32, backend, model::KvCacheDtype::bf16);
    const model::Model& m = r->model();
    SCOPED_TRACE(backend == model::DecodeBackend::standard ? "standard" : "latency_specialized");
    const int V = r->config().vocab_size;
    const auto prompt = random_tokens(20, V, 16), drafts = random_tokens(40, V, 17), next = random_tokens(2, V, 18);
    const int32_t accepted[5][2] = {{3, 4}, {1, 4}, {3, 4}, {3, 4}, {1, 4}};
    int64_t commit_replays = -1;
    auto run = [&](bool graphs) {
      model::LocalCache cache(r->config(), 2, 128, model::KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::fp32);
      model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
      model::SequenceInput pre[] = {{prompt, &a, model::StepKind::prefill},
                                    {std::span(prompt).first(11), &b, model::StepKind::prefill}};
      m.forward(cache.storage(), pre, model::LogitRows::last);  // the standard path: a prefill
      model::DecodeGraphs g(m, cache.storage(), /*max_blocks_per_seq=*/8);
      std::vector<core::Tensor> out;
      for (int round = 0; round < 5; ++round) {
        model::VerifyCapture capture;
        const auto d = std::span(drafts).subspan(static_cast<size_t>(8 * round), 8);
        model::SequenceInput verify[] = {{d.first(4), &a, model::StepKind::decode, true},
                                         {d.last(4), &b, model::StepKind::decode, true}};
        const core::StepRoute route = engine::route_batch(m, graphs ? &g : nullptr, verify);
        EXPECT_EQ(route.path,
                  backend == model::DecodeBackend::standard ? core::DecodePath::standard : core::DecodePath::fused);
        if (graphs) {
          EXPECT_EQ(route.graph, (core::GraphBucket{2, 4}));
          out.push_back(g.forward(verify, route, model::LogitsAt::host, &capture));
          g.commit_verified(capture, accepted[round]);
        } else {
          out.push_back(m.forward(cache.storage(), verify, model::LogitRows::requested, nullptr, &capture, nullptr,
                                  model::LogitsAt::host, route.path));
          m.commit_verified(cache.storage(), capture, accepted[round]);
        }
      }
      EXPECT_EQ(a.num_tokens, 20 + 3 + 1 + 3 + 3 + 1);
      EXPECT_EQ(b.num_tokens, 11 + 5 * 4);
      model::SequenceInput after[] = {{std::span(next).first(1), &a, model::StepKind::decode},
                                      {std::span(next).last(1), &b, model::StepKind::decode}};
      out.push_back(m.forward(cache.storage(), after, model::LogitRows::last, nullptr, nullptr, nullptr,
                              model::LogitsAt::host, engine::route_batch(m, nullptr, after).path));
      if (graphs) commit_replays = g.commit_replays();
      return out;
    };
    const auto want = run(false), got = run(true);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].dim(0), want[i].dim(0));
      EXPECT_LT(gpu_test::rel_l2(got[i], want[i]), 1e-5) << "step " << i;  // a wrong commit moves every later step
    }
    EXPECT_EQ(commit_replays, 2) << "rounds 3 and 4 should replay the commit graphs of {3, 4} and {1, 4}";
  }
}

// Decode steps with hidden-state taps (a model drafter's) replay graphs that tap too: after every
// replay the taps hold that step's mixtures, equal to the eager step's (fp32), on both decode paths;
// a graph without taps is not reused for a tapped step.
TEST(FastPathGpu, TappedDecodeGraphsLeaveEachStepsMixtures) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  checkpoint::WriteOptions w;
  w.init = checkpoint::InitStyle::sensitive;
  const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
  for (const model::DecodeBackend backend :
       {model::DecodeBackend::standard, model::DecodeBackend::latency_specialized}) {
    SCOPED_TRACE(backend == model::DecodeBackend::standard ? "standard" : "latency_specialized");
    auto r = open(dir, core::Device::cuda, kernels::Precision::fp32, backend, model::KvCacheDtype::bf16);
    const model::Model& m = r->model();
    const int V = r->config().vocab_size;
    const auto prompt = random_tokens(20, V, 31), steps = random_tokens(8, V, 32);
    auto run = [&](bool graphs, int64_t* replays) {
      model::LocalCache cache(r->config(), 2, 64, model::KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::fp32);
      model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
      model::SequenceInput pre[] = {{prompt, &a, model::StepKind::prefill},
                                    {std::span(prompt).first(9), &b, model::StepKind::prefill}};
      m.forward(cache.storage(), pre, model::LogitRows::last);
      model::DecodeGraphs g(m, cache.storage(), /*max_blocks_per_seq=*/8);
      std::vector<core::Tensor> taps_per_step;
      for (int step = 0; step < 4; ++step) {
        model::SequenceInput dec[] = {
            {std::span(steps).subspan(static_cast<size_t>(2 * step), 1), &a, model::StepKind::decode},
            {std::span(steps).subspan(static_cast<size_t>(2 * step + 1), 1), &b, model::StepKind::decode}};
        model::HiddenTaps taps{{0}, {}};
        const core::StepRoute route = engine::route_batch(m, graphs ? &g : nullptr, dec);
        if (graphs) {
          if (step == 0) g.forward(dec, route);  // an untapped graph of the same bucket: not the tapped one
          g.forward(dec, route, model::LogitsAt::host, nullptr, &taps);
        } else {
          if (step == 0)  // as the graphs run: one untapped step of the same tokens first
            m.forward(cache.storage(), dec, model::LogitRows::last, nullptr, nullptr, nullptr, model::LogitsAt::host,
                      route.path);
          m.forward(cache.storage(), dec, model::LogitRows::last, nullptr, nullptr, &taps, model::LogitsAt::host,
                    route.path);
        }
        EXPECT_EQ(taps.values.size(), 1u);
        taps_per_step.push_back(m.memory()->download_f32(taps.values[0].view()));
      }
      *replays = g.replays();
      return taps_per_step;
    };
    int64_t eager_replays = 0, graph_replays = 0;
    const auto want = run(false, &eager_replays), got = run(true, &graph_replays);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i].dim(0), 2);
      EXPECT_LT(gpu_test::rel_l2(got[i], want[i]), 1e-5) << "step " << i;
    }
    EXPECT_EQ(graph_replays, 3) << "steps 1-3 replay the tapped graph (step 0 captured it and the untapped one)";
  }
}

// The plan of a step replayed from a captured graph names the graph's kernels: once the bucket's
// first step has captured it, route_batch (the executor's scope) gives the list traced at capture,
// which is what an eager step of the same shape runs (an OpRecorder's calls, composite parts
// included), CUDA implementations only, the fused ops among them on the fused path. A replay whose
// plan names another implementation is refused, naming the call that differs, and runs nothing.
TEST(FastPathGpu, ThePlanOfAReplayedStepNamesItsGraphsKernels) {
  K3_REQUIRE_GPU();
  testing::TempDir tmp;
  const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), {});
  for (const model::DecodeBackend backend :
       {model::DecodeBackend::standard, model::DecodeBackend::latency_specialized}) {
    const bool fused = backend == model::DecodeBackend::latency_specialized;
    SCOPED_TRACE(fused ? "latency_specialized" : "standard");
    auto r = open(dir, core::Device::cuda, kernels::Precision::bf16, backend, model::KvCacheDtype::bf16);
    const model::Model& m = r->model();
    model::LocalCache cache(r->config(), 2, 64, model::KvCacheDtype::bf16, 16, m.memory(), kernels::Precision::bf16);
    model::SequenceState a = cache.new_sequence(), b = cache.new_sequence();
    const auto prompt = random_tokens(20, r->config().vocab_size, 21);
    model::SequenceInput pre[] = {{prompt, &a, model::StepKind::prefill},
                                  {std::span(prompt).first(7), &b, model::StepKind::prefill}};
    m.forward(cache.storage(), pre, model::LogitRows::last);
    model::DecodeGraphs g(m, cache.storage(), /*max_blocks_per_seq=*/8);
    const int32_t tok[] = {5, 9};
    model::SequenceInput dec[] = {{std::span(tok).first(1), &a, model::StepKind::decode},
                                  {std::span(tok).last(1), &b, model::StepKind::decode}};
    const core::StepRoute first = engine::route_batch(m, &g, dec);
    ASSERT_EQ(first.graph, (core::GraphBucket{2, 1}));
    EXPECT_EQ(first.kernels, nullptr);  // nothing captured yet: chosen per call, then captured
    g.forward(dec, first);
    ASSERT_EQ(g.captures(), 1);
    const core::StepRoute replay = engine::route_batch(m, &g, dec);
    ASSERT_NE(replay.kernels, nullptr);
    const core::KernelList& graph = *replay.kernels;

    kernels::OpRecorder recorder;
    r->set_op_recorder(&recorder);
    recorder.start();
    m.forward(cache.storage(), dec, model::LogitRows::last, nullptr, nullptr, nullptr, model::LogitsAt::host,
              replay.path);
    std::vector<kernels::OpRecorder::Call> eager = recorder.stop();
    r->set_op_recorder(nullptr);
    std::erase_if(eager, [](const auto& c) { return c.impl.rfind("not used", 0) == 0; });  // notes, not calls
    ASSERT_EQ(graph.size(), eager.size());
    std::string names;
    for (size_t i = 0; i < graph.size(); ++i) {
      EXPECT_EQ(graph[i].op, eager[i].op) << i;
      EXPECT_EQ(graph[i].impl, eager[i].impl) << i;
      EXPECT_EQ(graph[i].impl.rfind("cuda", 0), 0u) << graph[i].op << " -> " << graph[i].impl;
      names += graph[i].op + " ";
    }
    for (const char* op : {"kda_decode ", "mla_decode ", "moe_tail_combine "})
      EXPECT_EQ(names.find(op) != std::string::npos, fused) << op;

    core::StepRoute forged = replay;
    core::KernelList other = graph;
    const size_t at = other.size() / 2;
    other[at].impl = "cuda_forged";
    forged.kernels = std::make_shared<const core::KernelList>(other);
    const int64_t before = a.num_tokens;
    try {
      g.forward(dec, forged);
      ADD_FAILURE() << "a plan naming other kernels than its graph's was replayed";
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find("the plan's kernel " + std::to_string(at) + " is " + other[at].op +
                                           " -> cuda_forged"),
                std::string::npos)
          << e.what();
    }
    EXPECT_EQ(a.num_tokens, before);  // nothing ran
    g.forward(dec, replay);
    EXPECT_EQ(g.replays(), 1);
  }
}

// bf16: the fused kernels sum in other orders than the standard GPU kernels, as the standard GPU
// kernels do against the CPU oracle. On the tiny random model (nearly tied sigmoid router, see
// model_gpu_test.cpp) that noise flips a few routing decisions, so neither GPU path is within
// cosine 0.999 of another implementation at every row. The bounds: the fused path is as close to
// the CPU oracle as the standard GPU path is (the same bounds as LogitsMatchOracleBf16, and at most
// 2x its relative error), and its decided top-1 tokens equal the standard path's.
TEST(FastPathGpu, Bf16DecodeLogitsAreAsCloseToTheOracleAsTheStandardPath) {
  K3_REQUIRE_GPU();
  for (auto init : {checkpoint::InitStyle::realistic, checkpoint::InitStyle::sensitive}) {
    SCOPED_TRACE(init == checkpoint::InitStyle::realistic ? "realistic init" : "sensitive init");
    testing::TempDir tmp;
    checkpoint::WriteOptions w;
    w.init = init;
    const auto dir = testing::write_checkpoint(tmp, config::builtin_config("k3-tiny"), w);
    const auto bf16 = kernels::Precision::bf16;
    auto standard = open(dir, core::Device::cuda, bf16, model::DecodeBackend::standard, model::KvCacheDtype::bf16);
    auto fused = open(dir, core::Device::cuda, bf16, model::DecodeBackend::latency_specialized,
                      model::KvCacheDtype::bf16);
    auto oracle = open(dir, core::Device::cpu, bf16, model::DecodeBackend::standard, model::KvCacheDtype::bf16);
    const auto tokens = random_tokens(260, fused->config().vocab_size, 12);
    core::DecodePathCounters paths;
    const auto decode_rows = [&](runner::ModelRunner& r) {  // rows 100..259: one decode step each
      return model::row_slice(engine::logits(r, tokens, 100, &paths), 100, 260);
    };
    const core::Tensor cpu = decode_rows(*oracle), want = decode_rows(*standard), got = decode_rows(*fused);
    EXPECT_EQ(paths.fused_steps, 160);
    const auto std_vs_cpu = testing::compare(want, cpu), fused_vs_cpu = testing::compare(got, cpu),
               fused_vs_std = testing::compare(got, want);
    const auto [agree_cpu,
                decided_cpu] = gpu_test::decided_top1_agreement(got, cpu, 0.02f * static_cast<float>(std_vs_cpu.scale));
    const auto [agree_std, decided_std] = gpu_test::decided_top1_agreement(
        got, want, 0.02f * static_cast<float>(std_vs_cpu.scale));
    const double rel_std = gpu_test::rel_l2(want, cpu), rel_fused = gpu_test::rel_l2(got, cpu),
                 rel_pair = gpu_test::rel_l2(got, want);
    std::printf(
        "bf16 decode logits (160 rows): standard vs CPU rel_l2 %.4g min cosine %.6f top-1 %.4f; fused vs CPU "
        "rel_l2 %.4g min cosine %.6f top-1 %.4f (%.4f of %lld decided); fused vs standard rel_l2 %.4g min "
        "cosine %.6f top-1 %.4f (%.4f of %lld decided)\n",
        rel_std, std_vs_cpu.cosine, std_vs_cpu.top1_agreement, rel_fused, fused_vs_cpu.cosine,
        fused_vs_cpu.top1_agreement, agree_cpu, static_cast<long long>(decided_cpu), rel_pair, fused_vs_std.cosine,
        fused_vs_std.top1_agreement, agree_std, static_cast<long long>(decided_std));
    EXPECT_GE(fused_vs_cpu.cosine, 0.97);
    EXPECT_LT(rel_fused, 0.06);
    EXPECT_LE(rel_fused, 2 * rel_std + 0.005) << "the fused path adds error beyond the standard GPU path's own";
    EXPECT_GE(agree_cpu, 0.99);
    EXPECT_GE(agree_std, 0.99);
    EXPECT_GE(decided_std, 80) << "too few decided rows for the agreement to mean anything";
    EXPECT_GE(fused_vs_std.top1_agreement, 0.95);
  }
}

}  // namespace
}  // namespace k3
