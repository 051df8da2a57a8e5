// eval/layer_diff_test.cpp: the layer diff library on the tiny model (CPU): same side twice is
// exact, fp32 vs bf16 is close but not exact at every layer, teacher forcing, free run, side specs,
// the comparison itself and the JSON bundle's round trip.
#include "eval/layer_diff.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <set>

#include "checkpoint/checkpoint.h"
#include "core/error.h"
#include "core/rng.h"
#include "eval/test_util.h"

namespace k3::eval {
namespace {

using testing_util::TinyModel;

SideSpec side(const char* text) { return parse_side(text); }

LayerDiffConfig small_config(int64_t steps) {
  LayerDiffConfig c;
  c.prompt = {3, 17, 54, 97, 1};
  c.decode_steps = steps;
  return c;
}

TEST(LayerDiffSide, DefaultsAndCanonicalText) {
  const SideSpec d = parse_side("");
  EXPECT_EQ(d, SideSpec{});
  EXPECT_EQ(d.text(), "device=cpu,precision=bf16,decode_backend=auto,kv_cache=bf16,kda_prefill=chunked");
  const SideSpec s = parse_side(
      "precision=fp32,device=cuda,kv_cache=fp8,decode_backend=latency_specialized,kda_prefill=recurrent");
  EXPECT_EQ(s.device, core::Device::cuda);
  EXPECT_EQ(s.precision, kernels::Precision::fp32);
  EXPECT_EQ(s.kv_cache, model::KvCacheDtype::fp8_e4m3);
  EXPECT_EQ(s.decode_backend, model::DecodeBackend::latency_specialized);
  EXPECT_FALSE(s.kda_chunked_prefill);
  EXPECT_EQ(parse_side(s.text()), s);  // the canonical text parses back
  const model::ModelOptions o = s.model_options();
  EXPECT_EQ(o.device, core::Device::cuda);
  EXPECT_EQ(o.precision, kernels::Precision::fp32);
  EXPECT_EQ(o.decode_backend, model::DecodeBackend::latency_specialized);
  EXPECT_FALSE(o.kda_chunked_prefill);
}

void expect_side_error(const char* text, const char* fragment) {
  try {
    parse_side(text);
    ADD_FAILURE() << "'" << text << "' parsed";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << "the message should quote the spec: " << e.what();
  }
}

TEST(LayerDiffSide, BadSpecsNameTheProblem) {
  expect_side_error("device=tpu", "device must be cpu or cuda");
  expect_side_error("precision=fp16", "precision must be fp32 or bf16");
  expect_side_error("decode_backend=fast", "auto, latency_specialized");
  expect_side_error("kv_cache=int8", "kv_cache must be bf16 or fp8");
  expect_side_error("kda_prefill=parallel", "kda_prefill must be chunked or recurrent");
  expect_side_error("colour=red", "unknown key 'colour'");
  expect_side_error("device=cpu,device=cuda", "device given twice");
  expect_side_error("cuda", "'cuda' is not key=value");
  expect_side_error("device=cpu,", "'' is not key=value");
  expect_side_error("=cpu", "is not key=value");
}

TEST(LayerDiffCompare, ExactAndKnownValues) {
  const std::vector<float> a = {1, 0}, b = {0, 1};
  const DiffStats orth = compare(a, b);
  EXPECT_DOUBLE_EQ(orth.cosine, 0);
  EXPECT_DOUBLE_EQ(orth.rel_l2, std::sqrt(2.0));
  EXPECT_DOUBLE_EQ(orth.max_abs, 1);
  EXPECT_EQ(orth.numel, 2);
  const std::vector<float> x = {3, -4}, twice = {6, -8}, neg = {-3, 4}, zero = {0, 0};
  const DiffStats same = compare(x, x);
  EXPECT_EQ(same.cosine, 1);
  EXPECT_EQ(same.rel_l2, 0);
  EXPECT_EQ(same.max_abs, 0);
  EXPECT_NEAR(compare(x, twice).cosine, 1, 1e-15);
  EXPECT_DOUBLE_EQ(compare(x, twice).rel_l2, 1);  // |x - 2x| / |x|
  EXPECT_DOUBLE_EQ(compare(x, twice).max_abs, 4);
  EXPECT_NEAR(compare(x, neg).cosine, -1, 1e-15);
  EXPECT_EQ(compare(x, zero).cosine, 0);
  EXPECT_DOUBLE_EQ(compare(zero, x).rel_l2, 5);  // |a| = 0: the absolute L2 error
  EXPECT_EQ(compare(zero, zero).cosine, 1);
  const std::vector<float> nan = {std::numeric_limits<float>::quiet_NaN(), 1};
  EXPECT_TRUE(std::isnan(compare(x, nan).cosine));
  EXPECT_TRUE(std::isnan(compare(nan, x).max_abs));
  const std::vector<float> three = {1, 2, 3};
  EXPECT_THROW(compare(x, three), core::Error);
}

TEST(LayerDiffCompare, RandomOddLengths) {
  core::Rng rng(7);
  for (int n : {1, 17, 54, 97, 7168}) {
    std::vector<float> a(static_cast<size_t>(n)), b(a.size());
    double diff2 = 0, aa = 0, max_abs = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      a[i] = static_cast<float>(rng.normal());
      b[i] = a[i] + static_cast<float>(1e-3 * rng.normal());
      const double e = std::fabs(double{a[i]} - double{b[i]});
      diff2 += e * e;
      aa += double{a[i]} * a[i];
      max_abs = std::max(max_abs, e);
    }
    const DiffStats d = compare(a, b);
    EXPECT_EQ(d.numel, n);
    EXPECT_GT(d.cosine, 0.999) << n;
    EXPECT_LE(d.cosine, 1.0) << n;
    EXPECT_NEAR(d.rel_l2, std::sqrt(diff2 / aa), 1e-12) << n;
    EXPECT_EQ(d.max_abs, max_abs) << n;
    EXPECT_NEAR(compare(b, a).cosine, d.cosine, 1e-12) << "cosine is symmetric, n=" << n;
  }
}

TEST(LayerDiffGreedy, FirstMaximumAndNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(greedy_token(std::vector<float>{1, 5, 5, 2}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{nan, 0.5f, nan, 0.25f}), 1);
  EXPECT_EQ(greedy_token(std::vector<float>{nan, nan}), -1);
  EXPECT_EQ(greedy_token(std::vector<float>{}), -1);
  EXPECT_EQ(greedy_token(std::vector<float>{-3}), 0);
}

TEST(LayerDiffRun, SameSideTwiceIsExact) {
  const SideSpec s = side("device=cpu,precision=bf16");
  const auto a = open_side(TinyModel::dir(), s), b = open_side(TinyModel::dir(), s);
  const LayerDiffReport r = run_layer_diff(*a, s, *b, s, small_config(6));
  EXPECT_EQ(r.mode, "teacher_forced");
  ASSERT_EQ(r.steps.size(), 7u);  // the prefill and 6 decode steps
  ASSERT_FALSE(r.rows.empty());
  for (const StepRow& row : r.rows) {
    EXPECT_EQ(row.stats.cosine, 1) << row.name << " layer " << row.layer << " step " << row.step;
    EXPECT_EQ(row.stats.max_abs, 0) << row.name << " layer " << row.layer << " step " << row.step;
    EXPECT_EQ(row.stats.rel_l2, 0) << row.name << " layer " << row.layer << " step " << row.step;
  }
  for (const StepTokens& t : r.steps) {
    EXPECT_TRUE(t.top1_agree) << t.step;
    EXPECT_EQ(t.greedy_a, t.greedy_b) << t.step;
    EXPECT_GE(t.greedy_a, 0);
  }
  EXPECT_EQ(r.top1_agreement, 1);
  EXPECT_EQ(r.first_disagreeing_step, -1);
  EXPECT_EQ(r.min_cosine, 1);
  EXPECT_FALSE(r.any_below);
  EXPECT_TRUE(r.only_in_a.empty());
  EXPECT_TRUE(r.only_in_b.empty());
  for (const LayerSummary& l : r.layers) {
    EXPECT_EQ(l.steps, 7) << l.name << " layer " << l.layer;
    EXPECT_EQ(l.cosine_worst, 1);
    EXPECT_EQ(l.max_abs_worst, 0);
  }
}

TEST(LayerDiffRun, TeacherForcingFeedsSideAGreedyTokens) {
  const SideSpec fp32 = side("precision=fp32"), bf16 = side("precision=bf16");
  const auto a = open_side(TinyModel::dir(), fp32), b = open_side(TinyModel::dir(), bf16);
  const LayerDiffConfig c = small_config(5);
  const LayerDiffReport r = run_layer_diff(*a, fp32, *b, bf16, c);
  ASSERT_EQ(r.steps.size(), 6u);
  EXPECT_EQ(r.steps[0].kind, "prefill");
  EXPECT_EQ(r.steps[0].token_in, c.prompt.back());
  for (size_t i = 1; i < r.steps.size(); ++i) {
    EXPECT_EQ(r.steps[i].kind, "decode");
    EXPECT_EQ(r.steps[i].step, static_cast<int64_t>(i));
    EXPECT_EQ(r.steps[i].token_in, r.steps[i - 1].greedy_a) << "step " << i;
  }
  // Side A alone free-running from the same prompt produces the same tokens (its own greedy path).
  LayerDiffConfig f = c;
  f.free_run = true;
  f.decode_steps = 6;
  const LayerDiffReport fr = run_layer_diff(*a, fp32, *a, fp32, f);
  ASSERT_EQ(fr.tokens_a.size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(fr.tokens_a[i], r.steps[i].greedy_a) << i;
}

// fp32 vs bf16 on k3-tiny: everything up to the first MoE router is close (cosine > 0.999) but
// not exact. From the first routed layer on, a single-row decode step can flip one of its 4 routed
// experts (the realistic init's router scores are near ties, and bf16 activations move them), which
// drops that step's moe.latent cosine to ~0.7 (measured: 0.70..0.79 at some steps, means > 0.96): the
// tool must report that honestly, so past the router only sanity bounds are asserted.
TEST(LayerDiffRun, Fp32VsBf16IsCloseButNotExactAtEveryLayer) {
  const SideSpec fp32 = side("device=cpu,precision=fp32"), bf16 = side("device=cpu,precision=bf16");
  const auto a = open_side(TinyModel::dir(), fp32), b = open_side(TinyModel::dir(), bf16);
  const LayerDiffReport r = run_layer_diff(*a, fp32, *b, bf16, small_config(8));
  const int layers = a->config().num_hidden_layers;
  std::set<std::string> names;
  std::vector<int> prefix_inexact(static_cast<size_t>(layers), 0);
  bool past_router = false;
  int checked_before_router = 0;
  for (const LayerSummary& l : r.layers) {
    names.insert(l.name);
    past_router = past_router || l.name == "moe.latent";
    if (!past_router) {
      EXPECT_GT(l.cosine_worst, 0.999) << l.name << " layer " << l.layer;
      ++checked_before_router;
    } else {
      EXPECT_GT(l.cosine_worst, 0.5) << l.name << " layer " << l.layer;
      EXPECT_GT(l.cosine_mean, 0.9) << l.name << " layer " << l.layer;
    }
    EXPECT_TRUE(std::isfinite(l.max_abs_worst)) << l.name << " layer " << l.layer;
    EXPECT_LE(l.cosine_worst, l.cosine_mean + 1e-12) << l.name << " layer " << l.layer;
    EXPECT_GE(l.max_abs_worst + 1e-12, l.max_abs_mean) << l.name << " layer " << l.layer;
    EXPECT_EQ(l.steps, 9) << l.name << " layer " << l.layer;
    EXPECT_GE(l.layer, -1);
    EXPECT_LT(l.layer, layers);
    const bool exact_in_both = l.name == "embed" ||
                               (l.name == "attn_res.mix" && l.layer == 0);  // bf16 weights, no math
    if (exact_in_both) {
      EXPECT_EQ(l.cosine_worst, 1) << l.name << " layer " << l.layer;
    } else {
      EXPECT_LT(l.cosine_worst, 1) << "bf16 rounding must show in " << l.name << " layer " << l.layer;
      EXPECT_GT(l.max_abs_worst, 0) << l.name << " layer " << l.layer;
    }
    if (l.name == "prefix" && l.layer >= 0) prefix_inexact[static_cast<size_t>(l.layer)] = 1;
  }
  EXPECT_GE(checked_before_router, 10) << "expected layer 0 and layer 1's attention before the first router";
  for (int l = 0; l < layers; ++l)
    EXPECT_TRUE(prefix_inexact[static_cast<size_t>(l)]) << "no 'prefix' row for layer " << l;
  // The real trace names of the model (model.cpp and model/layers/*.cpp).
  for (const char* n :
       {"embed", "attn_res.mix", "attn.out", "ffn.out", "prefix", "logits", "kda.o", "mla.o", "moe.latent"})
    EXPECT_TRUE(names.count(n)) << "no intermediate named " << n;
  // Execution order: embed first, logits last.
  EXPECT_EQ(r.layers.front().name, "embed");
  EXPECT_EQ(r.layers.back().name, "logits");
  EXPECT_LT(r.min_cosine, 1);
  EXPECT_GE(r.top1_agreement, 0.75);
  // The first intermediate below a threshold between the two: the first in execution order.
  LayerDiffConfig strict = small_config(8);
  strict.threshold = 1.0;
  const LayerDiffReport s = run_layer_diff(*a, fp32, *b, bf16, strict);
  ASSERT_TRUE(s.any_below);
  for (const LayerSummary& l : s.layers) {
    if (l.name == s.first_below_name && l.layer == s.first_below_layer) {
      EXPECT_EQ(l.cosine_worst, s.first_below_cosine);
      break;
    }
    EXPECT_EQ(l.cosine_worst, 1) << l.name << " layer " << l.layer << " comes earlier and is below 1";
  }
  // At the default 0.999 the first flagged intermediate is at or after the first router.
  if (r.any_below) {
    EXPECT_GE(r.first_below_layer, a->config().first_k_dense_replace) << r.first_below_name;
  }
}

TEST(LayerDiffRun, WithoutPrefillTraceStepZeroComparesOnlyTheLogits) {
  const SideSpec fp32 = side("precision=fp32"), bf16 = side("precision=bf16");
  const auto a = open_side(TinyModel::dir(), fp32), b = open_side(TinyModel::dir(), bf16);
  LayerDiffConfig c = small_config(2);
  const LayerDiffReport traced = run_layer_diff(*a, fp32, *b, bf16, c);
  c.trace_prefill = false;
  const LayerDiffReport r = run_layer_diff(*a, fp32, *b, bf16, c);
  std::vector<StepRow> step0;
  for (const StepRow& row : r.rows)
    if (row.step == 0) step0.push_back(row);
  ASSERT_EQ(step0.size(), 1u);
  EXPECT_EQ(step0[0].name, "logits");
  EXPECT_EQ(step0[0].layer, -1);
  EXPECT_EQ(step0[0].stats.numel, a->config().vocab_size);
  // The same numbers as the traced run's step-0 "logits" (the trace is the returned tensor).
  for (const StepRow& row : traced.rows)
    if (row.step == 0 && row.name == "logits") {
      EXPECT_EQ(row.stats.cosine, step0[0].stats.cosine);
      EXPECT_EQ(row.stats.max_abs, step0[0].stats.max_abs);
    }
  // Decode steps are traced as before; summaries of the layers count only those steps.
  size_t traced_step0 = 0;
  for (const StepRow& row : traced.rows) traced_step0 += row.step == 0;
  EXPECT_EQ(r.rows.size(), traced.rows.size() - traced_step0 + 1);
  for (const LayerSummary& l : r.layers) EXPECT_EQ(l.steps, l.name == "logits" ? 3 : 2) << l.name;
  EXPECT_EQ(r.layers.front().name, "embed");
  EXPECT_EQ(r.layers.back().name, "logits");
  EXPECT_EQ(r.steps.size(), 3u);
  EXPECT_EQ(r.steps[1].token_in, traced.steps[1].token_in);
}

// A chunked prefill is the engine's way to run a long prompt: the compared prefill step is the
// last chunk, whose logits equal (fp32, within rounding of the chunk boundaries) one-step prefill's.
TEST(LayerDiffRun, ChunkedPrefillComparesTheLastChunkAndTracksOneStep) {
  const SideSpec fp32 = side("precision=fp32");
  const auto a = open_side(TinyModel::dir(), fp32), b = open_side(TinyModel::dir(), fp32);
  LayerDiffConfig c;
  c.prompt = {3, 17, 54, 97, 1, 40, 23, 8, 77, 5, 61};  // 11 tokens: chunks 4, 4, 3
  c.decode_steps = 2;
  const LayerDiffReport whole = run_layer_diff(*a, fp32, *b, fp32, c);
  c.prefill_chunk = 4;
  const LayerDiffReport chunked = run_layer_diff(*a, fp32, *b, fp32, c);
  EXPECT_EQ(chunked.min_cosine, 1.0);  // the same side twice, chunked too
  // The compared prefill step traced only the last chunk: 3 rows of hidden size per intermediate.
  bool saw_embed = false;
  for (const StepRow& row : chunked.rows)
    if (row.step == 0 && row.name == "embed") {
      saw_embed = true;
      EXPECT_EQ(row.stats.numel, 3 * a->config().hidden_size);
    }
  EXPECT_TRUE(saw_embed);
  // Chunked and one-step prefill pick the same greedy tokens on this model.
  ASSERT_EQ(chunked.steps.size(), whole.steps.size());
  for (size_t i = 0; i < whole.steps.size(); ++i) EXPECT_EQ(chunked.steps[i].greedy_a, whole.steps[i].greedy_a) << i;
  c.free_run = true;
  c.decode_steps = 5;
  const LayerDiffReport free = run_layer_diff(*a, fp32, *b, fp32, c);
  EXPECT_EQ(free.tokens_a, free.tokens_b);
  EXPECT_EQ(free.tokens_a.front(), whole.steps.front().greedy_a);
  c.prefill_chunk = -1;
  EXPECT_THROW(run_layer_diff(*a, fp32, *b, fp32, c), core::Error);
}

TEST(LayerDiffRun, FreeRunSameSideIsIdentical) {
  const SideSpec s = side("precision=fp32");
  const auto a = open_side(TinyModel::dir(), s), b = open_side(TinyModel::dir(), s);
  LayerDiffConfig c = small_config(20);
  c.free_run = true;
  const LayerDiffReport r = run_layer_diff(*a, s, *b, s, c);
  EXPECT_EQ(r.mode, "free_run");
  ASSERT_EQ(r.tokens_a.size(), 20u);
  EXPECT_EQ(r.tokens_a, r.tokens_b);
  EXPECT_EQ(r.first_divergence, -1);
  EXPECT_TRUE(r.rows.empty());
  EXPECT_NE(format_table(r).find("identical (20 of 20 tokens)"), std::string::npos) << format_table(r);
}

TEST(LayerDiffRun, OptionsReachTheModelAndBadInputIsRefused) {
  const SideSpec fast = side("decode_backend=latency_specialized,precision=fp32");
  const auto a = open_side(TinyModel::dir(), fast);
  EXPECT_EQ(a->model().options().decode_backend, model::DecodeBackend::latency_specialized);
  EXPECT_EQ(a->model().options().precision, kernels::Precision::fp32);
  const SideSpec plain = side("precision=bf16");
  const auto b = open_side(TinyModel::dir(), plain);
  LayerDiffConfig c = small_config(1);
  c.prompt = {};
  EXPECT_THROW(run_layer_diff(*b, plain, *b, plain, c), core::Error);
  c.prompt = {1, b->config().vocab_size};
  try {
    run_layer_diff(*b, plain, *b, plain, c);
    ADD_FAILURE() << "an id outside the vocabulary ran";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  c = small_config(-1);
  EXPECT_THROW(run_layer_diff(*b, plain, *b, plain, c), core::Error);
  // A spec that does not describe the runner it is given.
  EXPECT_THROW(run_layer_diff(*a, plain, *b, plain, small_config(1)), core::Error);
#ifndef K3_HAVE_CUDA
  EXPECT_THROW(open_side(TinyModel::dir(), side("device=cuda")), core::Error);
#endif
}

// The fused decode path against the standard one (CPU: the fused ops' references): every step
// says which path ran it, and the two paths agree layer by layer (bf16: bit for bit on k3-tiny).
TEST(LayerDiffRun, FusedDecodePathTracksTheStandardPathAndSaysWhichPathRan) {
  const SideSpec plain = side("precision=bf16");
  const SideSpec fast = side("precision=bf16,decode_backend=latency_specialized");
  const auto a = open_side(TinyModel::dir(), plain);
  const auto b = open_side(TinyModel::dir(), fast);
  const LayerDiffReport r = run_layer_diff(*a, plain, *b, fast, small_config(6));
  ASSERT_EQ(r.steps.size(), 7u);
  EXPECT_EQ(r.steps[0].path_a, "standard");
  EXPECT_EQ(r.steps[0].path_b, "standard: prefill_or_mixed_step");
  for (size_t i = 1; i < r.steps.size(); ++i) {
    EXPECT_EQ(r.steps[i].path_a, "standard");
    EXPECT_EQ(r.steps[i].path_b, "fused") << "step " << i;
    EXPECT_TRUE(r.steps[i].top1_agree) << "step " << i;
  }
  for (const auto& l : r.layers) EXPECT_GE(l.cosine_worst, 0.999) << l.name << " layer " << l.layer;
  EXPECT_EQ(report_from_json(to_json(r)).steps[3].path_b, "fused");
  EXPECT_NE(format_table(r).find("standard / fused"), std::string::npos) << format_table(r);
}

}  // namespace
}  // namespace k3::eval
